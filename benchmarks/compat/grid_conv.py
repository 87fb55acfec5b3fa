"""Strided convs onto a bounded grid's sites, from relconv's own pieces, for the native twins.

spconv's regular `SparseConv3d` and TorchSparse 2.1's default strided conv keep every coarse site o
with o * stride - padding + d an input site for some kernel digit d, inside the dense conv's output
grid; relconv.voxel's strided conv keeps floor(p / stride) instead. A relconv user writes such a
conv as `GridConv` does: relconv.voxel.grid_map's map of the grid, run by
relconv.ops.relational_conv.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from relconv.ops import relational_conv
from relconv.voxel import BatchNorm, MapCache, ReLU, Sequential, VoxelTensor
from relconv.voxel.fold import FoldCache
from relconv.voxel.grid_map import build_map, conv_output_size
from relconv.voxel.nn import inference_folding_enabled
from relconv.voxel.utils import small_constant, triple


class GridConv(nn.Module):
    """The strided conv of a grid `(batch, d0, d1, d2)`, which the caller sets in `grid` before each
    forward (`set_grids`). The input's coordinates are its sites times its stride, as relconv.voxel
    keeps them; the weight is `[K, C_in, C_out]` in relconv's order (kernel digits, axis 0 slowest),
    spconv's and TorchSparse's kernels converted by `relconv.convert`."""

    def __init__(self, cin: int, cout: int, kernel_size, stride, padding=0) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.groups = cin, cout, 1
        self.kernel_size, self.stride = triple(kernel_size, "kernel_size"), triple(stride, "stride")
        self.padding = triple(padding, "padding", minimum=0)
        volume = math.prod(self.kernel_size)
        self.weight = nn.Parameter(torch.empty(volume, cin, cout))
        self.register_parameter("bias", None)
        bound = 1.0 / math.sqrt(volume * cin)
        nn.init.uniform_(self.weight, -bound, bound)
        self.grid: tuple[int, ...] | None = None

    def out_grid(self, grid: tuple[int, ...]) -> tuple[int, ...]:
        shape = conv_output_size(
            list(grid[1:]), list(self.kernel_size), list(self.stride), list(self.padding), [1] * 3
        )
        return (grid[0], *shape)

    def forward(self, x: VoxelTensor, weight=None, bias=None, activation=None) -> VoxelTensor:
        grid = self.grid
        if grid is None:
            raise RuntimeError("GridConv.grid is unset: call set_grids(model, grid) before the forward")
        sites = torch.div(
            x.coords, small_constant((1, *x.stride), x.device, torch.int32), rounding_mode="floor"
        )
        k, s, p = list(self.kernel_size), list(self.stride), list(self.padding)
        shape, out_shape = list(grid[1:]), list(self.out_grid(grid)[1:])
        rmap, out_sites = build_map(sites, grid[0], shape, out_shape, k, s, p, [1, 1, 1], False)
        w = self.weight if weight is None else weight
        feats = relational_conv(x.feats, w, rmap, bias=bias, activation=activation)
        stride = tuple(t * si for t, si in zip(x.stride, self.stride, strict=True))
        coords = out_sites * small_constant((1, *stride), x.device, torch.int32)
        cache = MapCache()
        cache.add_built(coords, stride)  # the grid map's sites: no check of them, no host wait
        return VoxelTensor(feats, coords, stride, cache=cache)


class GridBlock(Sequential):
    """GridConv -> BatchNorm -> ReLU; at inference without autograd one conv with the BatchNorm
    folded into its weight and bias and the ReLU in its epilogue, as relconv.voxel.Sequential runs a
    Conv3d block."""

    def __init__(
        self, cin: int, cout: int, kernel_size, stride, padding=0, eps: float = 1e-5, momentum: float = 0.1
    ) -> None:
        conv = GridConv(cin, cout, kernel_size, stride, padding)
        super().__init__(conv, BatchNorm(cout, eps=eps, momentum=momentum), ReLU(True))
        self._fold = FoldCache()

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        conv, norm = self[0], self[1].module
        if self.training or torch.is_grad_enabled() or not inference_folding_enabled() or norm.training:
            return super().forward(x)
        w, b = self._fold.get(conv, norm, x.feats)
        return conv(x, w, b, "relu")


def set_grids(model: nn.Module, grid: tuple[int, ...]) -> None:
    """Gives every GridConv of `model` its input grid, starting from `grid`: the twins run their
    GridConvs in the order they are registered, each on the grid the previous one outputs."""
    for m in model.modules():
        if isinstance(m, GridConv):
            m.grid = grid
            grid = m.out_grid(grid)
