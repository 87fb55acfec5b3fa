"""Sparse max / average / sum pooling over kernel windows, unpooling, and global pooling per sample.

Window pooling uses the same kernel maps as `Conv3d` (same offsets, stride and caching) and reduces
the gathered input rows per output with `scatter_reduce`; only occupied voxels take part, so the
average is over the occupied voxels of the window.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from relconv.voxel.kernel_map import LayerMap, layer_map
from relconv.voxel.tensor import VoxelTensor
from relconv.voxel.utils import triple


def pool3d(
    x: VoxelTensor,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    dilation: int | Sequence[int] = 1,
    reduce: str = "amax",
) -> VoxelTensor:
    """Pools `x.feats [N, C]` over each output's window -> [M, C]; stride defaults to kernel_size."""
    if not isinstance(x, VoxelTensor):
        raise TypeError(f"x must be a VoxelTensor, got {type(x).__name__}")
    if reduce not in ("amax", "mean", "sum"):
        raise ValueError(f"reduce must be 'amax', 'mean' or 'sum', got {reduce!r}")
    k = triple(kernel_size, "kernel_size")
    s = k if stride is None else triple(stride, "stride")
    return _reduce_over(x, layer_map(x, k, s, triple(dilation, "dilation")), reduce)


def pool_transpose3d(
    x: VoxelTensor,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int],
    dilation: int | Sequence[int] = 1,
    generative: bool = False,
) -> VoxelTensor:
    """Unpooling (MinkowskiEngine's `MinkowskiPoolingTranspose`): each output site takes the mean of
    the input rows whose windows reach it, over the transposed map of a `kernel_size` / `stride`
    pool. The outputs are the sites the matching strided layer started from (as a transposed
    `Conv3d`), or with `generative` every site the kernel reaches (ME's `expand_coordinates`)."""
    if not isinstance(x, VoxelTensor):
        raise TypeError(f"x must be a VoxelTensor, got {type(x).__name__}")
    k, s = triple(kernel_size, "kernel_size"), triple(stride, "stride")
    lm = layer_map(x, k, s, triple(dilation, "dilation"), transposed=True, generative=generative)
    return _reduce_over(x, lm, "mean")


def _reduce_over(x: VoxelTensor, lm: LayerMap, reduce: str) -> VoxelTensor:
    """`x.feats [N, C]` reduced per output of the layer map `lm` -> [M, C]; outputs no row reaches get 0."""
    rows = x.feats.index_select(0, lm.rmap.in_index.long())
    index = lm.rmap.out_index.long().unsqueeze(1).expand_as(rows)
    out = x.feats.new_zeros(lm.rmap.num_out, x.feats.shape[1])
    out = out.scatter_reduce(0, index, rows, reduce, include_self=False)
    return VoxelTensor(out, lm.out_coords, lm.out_stride, cache=lm.out_cache)


class MaxPool3d(nn.Module):
    """Max over the occupied voxels of each window (stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, dilation=1) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.dilation = kernel_size, stride, dilation

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        return pool3d(x, self.kernel_size, self.stride, self.dilation, "amax")


class AvgPool3d(MaxPool3d):
    """Mean over the occupied voxels of each window (stride defaults to kernel_size)."""

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        return pool3d(x, self.kernel_size, self.stride, self.dilation, "mean")


class SumPool3d(MaxPool3d):
    """Sum over the occupied voxels of each window (stride defaults to kernel_size)."""

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        return pool3d(x, self.kernel_size, self.stride, self.dilation, "sum")


class PoolTranspose3d(nn.Module):
    """Unpooling: `pool_transpose3d` as a module (MinkowskiEngine's `MinkowskiPoolingTranspose`;
    `generative=True` for its `expand_coordinates=True`)."""

    def __init__(self, kernel_size, stride, dilation=1, generative: bool = False) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride
        self.dilation, self.generative = dilation, generative

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        return pool_transpose3d(x, self.kernel_size, self.stride, self.dilation, self.generative)


def global_pool(x: VoxelTensor, reduce: str = "mean", batch_size: int | None = None) -> Tensor:
    """[B, C] per-sample reduction (`mean`, `amax` or `sum`) of `x.feats` over its voxels.

    `batch_size` defaults to 1 + the largest batch index (one host synchronisation); samples without
    voxels get zeros.
    """
    if reduce not in ("mean", "amax", "sum"):
        raise ValueError(f"reduce must be 'mean', 'amax' or 'sum', got {reduce!r}")
    b = x.batch_size() if batch_size is None else batch_size
    index = x.coords[:, 0].long().unsqueeze(1).expand_as(x.feats)
    out = x.feats.new_zeros(b, x.feats.shape[1])
    return out.scatter_reduce(0, index, x.feats, reduce, include_self=False)


class GlobalMaxPool(nn.Module):
    """VoxelTensor -> [B, C] max over each sample's voxels."""

    def forward(self, x: VoxelTensor) -> Tensor:
        return global_pool(x, "amax")


class GlobalAvgPool(nn.Module):
    """VoxelTensor -> [B, C] mean over each sample's voxels."""

    def forward(self, x: VoxelTensor) -> Tensor:
        return global_pool(x, "mean")
