"""relconv-native twins of TorchSparse's `SparseResUNet42` and `SparseResNet21D`.

The same networks written with relconv's own pieces, module for module under the same names, so
TorchSparse's state_dict loads through `relconv.convert.convert_state_dict` (kernels re-ordered,
BatchNorm keys under relconv's `.module`). They are what the shim's overhead is measured against.

SparseResUNet42 downsamples with 2^3 stride-2 kernels, where TorchSparse's output sites are
relconv.voxel's strided conv's. SparseResNet21D downsamples with 3^3 stride-2 kernels, for which
TorchSparse 2.1's default downsample mode keeps every coarse site a kernel digit reaches inside the
tensor's spatial range, where relconv.voxel's strided conv keeps floor(p / 2): its twin runs those
convs as `GridConv`, relconv.voxel.grid_map's map of the range run by relconv.ops.relational_conv,
as a relconv user writes such a conv. Both twins compute TorchSparse's networks exactly.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.compat.scenes import Voxels
from relconv.convert import convert_state_dict, kernel_sizes_of
from relconv.ops import relational_conv
from relconv.voxel import BatchNorm, Conv3d, ReLU, Sequential, VoxelTensor, cat
from relconv.voxel.fold import FoldCache
from relconv.voxel.grid_map import build_map
from relconv.voxel.nn import inference_folding_enabled
from relconv.voxel.utils import small_constant, triple


def _conv_block(cin: int, cout: int, kernel_size, stride=1, transposed: bool = False) -> Sequential:
    return Sequential(
        Conv3d(cin, cout, kernel_size, stride=stride, transposed=transposed), BatchNorm(cout), ReLU(True)
    )


class _ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel_size, stride=1) -> None:
        super().__init__()
        self.main = Sequential(
            Conv3d(cin, cout, kernel_size, stride=stride),
            BatchNorm(cout),
            ReLU(True),
            Conv3d(cout, cout, kernel_size),
            BatchNorm(cout),
        )
        strided = math.prod(stride) != 1 if isinstance(stride, tuple) else stride != 1
        self.shortcut = (
            Sequential(Conv3d(cin, cout, 1, stride=stride), BatchNorm(cout))
            if cin != cout or strided
            else Sequential()
        )
        self.relu = ReLU(True)

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        return self.relu(self.main(x) + self.shortcut(x))


class GridConv(nn.Module):
    """A strided conv onto TorchSparse 2.1's default sites (padding 0): every coarse site o with
    o * stride + d an input site for some kernel digit d, inside the grid of the input's spatial
    range `(batch, X, Y, Z)`, which the caller sets in `grid` before each forward. The weight is
    `[K, C_in, C_out]` in relconv's order (kernel digits, first axis slowest)."""

    def __init__(self, cin: int, cout: int, kernel_size, stride) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.groups = cin, cout, 1
        self.kernel_size, self.stride = triple(kernel_size, "kernel_size"), triple(stride, "stride")
        volume = math.prod(self.kernel_size)
        self.weight = nn.Parameter(torch.empty(volume, cin, cout))
        self.register_parameter("bias", None)
        bound = 1.0 / math.sqrt(volume * cin)
        nn.init.uniform_(self.weight, -bound, bound)
        self.grid: tuple[int, ...] | None = None

    def out_grid(self, grid: tuple[int, ...]) -> tuple[int, ...]:
        sizes = zip(grid[1:], self.kernel_size, self.stride, strict=True)
        return (grid[0], *((g - k) // s + 1 for g, k, s in sizes))

    def forward(self, x: VoxelTensor, weight=None, bias=None, activation=None) -> VoxelTensor:
        grid = self.grid
        out_grid = self.out_grid(grid)
        step = small_constant((1, *x.stride), x.device, torch.int32)
        coarse = torch.div(x.coords, step, rounding_mode="floor")  # TorchSparse's coordinates
        k, s, shape, out_shape = list(self.kernel_size), list(self.stride), list(grid[1:]), list(out_grid[1:])
        rmap, out_coarse = build_map(coarse, grid[0], shape, out_shape, k, s, [0, 0, 0], [1, 1, 1], False)
        w = self.weight if weight is None else weight
        feats = relational_conv(x.feats, w, rmap, bias=bias, activation=activation)
        stride = tuple(t * si for t, si in zip(x.stride, self.stride, strict=True))
        return VoxelTensor(feats, out_coarse * small_constant((1, *stride), x.device, torch.int32), stride)


class _GridBlock(Sequential):
    """GridConv -> BatchNorm -> ReLU; at inference without autograd one conv with the BatchNorm
    folded into its weight and bias and the ReLU in its epilogue, as relconv.voxel.Sequential runs a
    Conv3d block."""

    def __init__(self, cin: int, cout: int, kernel_size, stride) -> None:
        super().__init__(GridConv(cin, cout, kernel_size, stride), BatchNorm(cout), ReLU(True))
        self._fold = FoldCache()

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        conv, norm = self[0], self[1].module
        if self.training or torch.is_grad_enabled() or not inference_folding_enabled() or norm.training:
            return super().forward(x)
        w, b = self._fold.get(conv, norm, x.feats)
        return conv(x, w, b, "relu")


class ResNet21D(nn.ModuleList):
    """TorchSparse's SparseResNet21D: five stages, each a strided conv block then residual blocks.
    Its input is (tensor, spatial range), as TorchSparse's SparseTensor carries its range."""

    STAGES = ((3, 16, 3, 1), (3, 32, 3, 2), (3, 64, 3, 2), (3, 128, 3, 2), (1, 128, (1, 3, 1), (1, 2, 1)))

    def __init__(self, in_channels: int = 4) -> None:
        super().__init__()
        for blocks, cout, k, s in self.STAGES:
            first = _conv_block(in_channels, cout, k) if s == 1 else _GridBlock(in_channels, cout, k, s)
            self.append(Sequential(first, *(_ResBlock(cout, cout, k) for _ in range(blocks - 1))))
            in_channels = cout

    def forward(self, inp: tuple[VoxelTensor, tuple[int, ...]]) -> list[VoxelTensor]:
        x, grid = inp
        outputs = []
        for stage in self:
            if isinstance(stage[0], _GridBlock):
                stage[0][0].grid = grid
                grid = stage[0][0].out_grid(grid)
            x = stage(x)
            outputs.append(x)
        return outputs


class ResUNet42(nn.Module):
    """TorchSparse's SparseResUNet42: stem, four 2^3 stride-2 encoder stages, four decoder stages
    (2^3 transposed conv, concatenation with the skip, two residual blocks)."""

    CHANNELS = (32, 32, 64, 128, 256, 256, 128, 96, 96)

    def __init__(self, in_channels: int = 4) -> None:
        super().__init__()
        c = self.CHANNELS
        self.stem = Sequential(
            Conv3d(in_channels, c[0], 3),
            BatchNorm(c[0]),
            ReLU(True),
            Conv3d(c[0], c[0], 3),
            BatchNorm(c[0]),
            ReLU(True),
        )
        self.encoders = nn.ModuleList(
            Sequential(
                _conv_block(c[k], c[k], 2, 2), _ResBlock(c[k], c[k + 1], 3), _ResBlock(c[k + 1], c[k + 1], 3)
            )
            for k in range(4)
        )
        self.decoders = nn.ModuleList(
            nn.ModuleDict(
                {
                    "upsample": _conv_block(c[k + 4], c[k + 5], 2, 2, transposed=True),
                    "fuse": Sequential(
                        _ResBlock(c[k + 5] + c[3 - k], c[k + 5], 3), _ResBlock(c[k + 5], c[k + 5], 3)
                    ),
                }
            )
            for k in range(4)
        )

    def forward(self, x: VoxelTensor) -> list[VoxelTensor]:
        x = self.stem(x)
        skips = [x]
        for encoder in self.encoders:
            x = encoder(x)
            skips.append(x)
        outputs = list(skips)
        y = skips.pop()
        for decoder in self.decoders:
            y = decoder["fuse"](cat([decoder["upsample"](y), skips.pop()]))
            outputs.append(y)
        return outputs


TWINS = {"SparseResUNet42": ResUNet42, "SparseResNet21D": ResNet21D}


def _conv_geometry(twin: nn.Module) -> tuple[dict, dict]:
    strides = {name: m.stride for name, m in twin.named_modules() if isinstance(m, (Conv3d, GridConv))}
    return kernel_sizes_of(twin), strides


def load_torchsparse_state(twin: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Loads a TorchSparse backbone's state_dict into its twin (strict)."""
    sizes, strides = _conv_geometry(twin)
    converted = convert_state_dict(state, "torchsparse", "relconv", kernel_sizes=sizes, strides=strides)
    own = twin.state_dict()
    twin.load_state_dict({k: converted[k if k in converted else k.replace(".module.", ".")] for k in own})


def grads_as_torchsparse(twin: nn.Module) -> dict[str, torch.Tensor]:
    """The twin's parameter gradients under TorchSparse's names and layouts."""
    sizes, strides = _conv_geometry(twin)
    grads = {n.replace(".module.", "."): p.grad for n, p in twin.named_parameters() if p.grad is not None}
    return convert_state_dict(grads, "relconv", "torchsparse", kernel_sizes=sizes, strides=strides)


def make_input(v: Voxels, feats: torch.Tensor) -> VoxelTensor:
    return VoxelTensor(feats, v.coords.to(feats.device))


def _grid_input(v: Voxels, feats: torch.Tensor) -> tuple[VoxelTensor, tuple[int, ...]]:
    return make_input(v, feats), v.torchsparse_range


INPUTS = {"SparseResUNet42": make_input, "SparseResNet21D": _grid_input}


def outputs(model, result: list[VoxelTensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Like TorchSparse 2.1's `.C`, coordinates at tensor stride s are given divided by s."""
    out = {}
    for i, t in enumerate(result):
        c = t.coords.clone()
        c[:, 1:] = torch.div(
            c[:, 1:], torch.tensor(t.stride, device=c.device, dtype=c.dtype), rounding_mode="floor"
        )
        out[f"out{i}"] = (c, t.feats)
    return out
