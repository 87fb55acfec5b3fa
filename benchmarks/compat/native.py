"""relconv-native twins of the compat backbones, and how the harness feeds and reads them.

Each twin is the same network written with relconv's own pieces, module for module under the
downstream code's names, so the real library's state_dict loads through
`relconv.convert.convert_state_dict` (kernels re-ordered, BatchNorm keys under relconv's `.module`).
They are what the shim's overhead is measured against, and they compute the real libraries' networks
exactly. TorchSparse's twins are here, spconv's in `native_spconv`.

SparseResUNet42 downsamples with 2^3 stride-2 kernels, where TorchSparse's output sites are
relconv.voxel's strided conv's. SparseResNet21D downsamples with 3^3 stride-2 kernels, for which
TorchSparse 2.1's default downsample mode keeps every coarse site a kernel digit reaches inside the
tensor's spatial range: its twin runs those convs as `grid_conv.GridBlock`s.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.compat import native_spconv
from benchmarks.compat.grid_conv import GridBlock, GridConv, set_grids
from benchmarks.compat.scenes import Voxels
from relconv.convert import convert_state_dict, kernel_sizes_of
from relconv.voxel import BatchNorm, Conv3d, ReLU, Sequential, VoxelTensor, cat


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


class ResNet21D(nn.ModuleList):
    """TorchSparse's SparseResNet21D: five stages, each a strided conv block then residual blocks.
    Its input is (tensor, spatial range), as TorchSparse's SparseTensor carries its range."""

    STAGES = ((3, 16, 3, 1), (3, 32, 3, 2), (3, 64, 3, 2), (3, 128, 3, 2), (1, 128, (1, 3, 1), (1, 2, 1)))

    def __init__(self, in_channels: int = 4) -> None:
        super().__init__()
        for blocks, cout, k, s in self.STAGES:
            first = _conv_block(in_channels, cout, k) if s == 1 else GridBlock(in_channels, cout, k, s)
            self.append(Sequential(first, *(_ResBlock(cout, cout, k) for _ in range(blocks - 1))))
            in_channels = cout

    def forward(self, inp: tuple[VoxelTensor, tuple[int, ...]]) -> list[VoxelTensor]:
        x, grid = inp
        set_grids(self, grid)
        outputs = []
        for stage in self:
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


def make_input(v: Voxels, feats: torch.Tensor) -> VoxelTensor:
    return VoxelTensor(feats, v.coords.to(feats.device))


def _grid_input(v: Voxels, feats: torch.Tensor) -> tuple[VoxelTensor, tuple[int, ...]]:
    return make_input(v, feats), v.torchsparse_range


# Per backbone: the twin, its input from the loader's voxels, the real library's weight layout.
TWINS = {
    "SparseResUNet42": ResUNet42,
    "SparseResNet21D": ResNet21D,
    **native_spconv.TWINS,
}
INPUTS = {
    "SparseResUNet42": make_input,
    "SparseResNet21D": _grid_input,
    "SpUNet-v1m1": make_input,
    **native_spconv.INPUTS,
}
LAYOUTS = {"SparseResUNet42": "torchsparse", "SparseResNet21D": "torchsparse"} | dict.fromkeys(
    native_spconv.TWINS, "spconv"
)


def _conv_geometry(twin: nn.Module) -> tuple[dict, dict]:
    strides = {name: m.stride for name, m in twin.named_modules() if isinstance(m, (Conv3d, GridConv))}
    return kernel_sizes_of(twin), strides


def load_state(twin: nn.Module, state: dict[str, torch.Tensor], layout: str) -> None:
    """Loads the real library's state_dict (in `layout`) into its twin (strict)."""
    sizes, strides = _conv_geometry(twin)
    converted = convert_state_dict(state, layout, "relconv", kernel_sizes=sizes, strides=strides)
    own = twin.state_dict()
    twin.load_state_dict({k: converted[k if k in converted else k.replace(".module.", ".")] for k in own})


def grads_as(twin: nn.Module, layout: str) -> dict[str, torch.Tensor]:
    """The twin's parameter gradients under the real library's names and `layout`."""
    sizes, strides = _conv_geometry(twin)
    grads = {n.replace(".module.", "."): p.grad for n, p in twin.named_parameters() if p.grad is not None}
    return convert_state_dict(grads, "relconv", layout, kernel_sizes=sizes, strides=strides)


def outputs(
    model, result: list[VoxelTensor] | dict[str, VoxelTensor]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{name: (coordinates, features)} of a twin's outputs (a list is named out0, out1, ...), the
    coordinates at tensor stride s divided by s, as TorchSparse's `.C` and spconv's `indices` give
    them."""
    named = result if isinstance(result, dict) else {f"out{i}": t for i, t in enumerate(result)}
    out = {}
    for name, t in named.items():
        c = t.coords.clone()
        # Python-number divisors: a stride tensor made from a list is a host-to-device copy that
        # waits for the host, one wait per output the real libraries' outputs do not have.
        if len(set(t.stride)) == 1:
            c[:, 1:] = torch.div(c[:, 1:], t.stride[0], rounding_mode="floor")
        else:
            for axis, s in enumerate(t.stride, start=1):
                c[:, axis] = torch.div(c[:, axis], s, rounding_mode="floor")
        out[name] = (c, t.feats)
    return out
