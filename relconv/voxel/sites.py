"""Operations on a tensor's set of sites: keeping some rows (`prune`) and merging tensors (`union`),
MinkowskiEngine's `MinkowskiPruning` and `MinkowskiUnion`.

Both return a tensor over a new coordinate set, so its maps are built afresh (one cache per set);
the features keep their autograd graph.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relconv.voxel.tensor import VoxelTensor


def prune(x: VoxelTensor, keep: Tensor) -> VoxelTensor:
    """The rows of `x` where the boolean `keep [N]` is true, at the same tensor stride and in the
    same order (on a GPU one host sync, for the number of rows kept)."""
    if not isinstance(x, VoxelTensor):
        raise TypeError(f"x must be a VoxelTensor, got {type(x).__name__}")
    if not isinstance(keep, Tensor) or keep.dtype != torch.bool:
        raise TypeError(f"keep must be a bool tensor, got {getattr(keep, 'dtype', type(keep).__name__)}")
    if keep.shape != (x.feats.shape[0],):
        raise ValueError(
            f"keep must have shape [{x.feats.shape[0]}] (one flag per row), got {tuple(keep.shape)}"
        )
    if keep.device != x.feats.device:
        raise ValueError(f"keep is on {keep.device}, the tensor on {x.feats.device}")
    rows = keep.nonzero().squeeze(1)
    return VoxelTensor(x.feats.index_select(0, rows), x.coords.index_select(0, rows), x.stride)


def union(*tensors: VoxelTensor) -> VoxelTensor:
    """One tensor over the union of the inputs' sites, the features of a site summed over the inputs
    that hold it; rows sorted by coordinate. The inputs share a tensor stride, channel count, dtype
    and device."""
    if not tensors:
        raise ValueError("union needs at least one tensor")
    for i, t in enumerate(tensors):
        if not isinstance(t, VoxelTensor):
            raise TypeError(f"tensors[{i}] must be a VoxelTensor, got {type(t).__name__}")
    first = tensors[0]
    for i, t in enumerate(tensors[1:], 1):
        if t.stride != first.stride:
            raise ValueError(f"tensors[{i}] has tensor stride {t.stride}, tensors[0] {first.stride}")
        if t.feats.shape[1] != first.feats.shape[1]:
            raise ValueError(
                f"tensors[{i}] has {t.feats.shape[1]} channels, tensors[0] {first.feats.shape[1]}"
            )
        if t.feats.dtype != first.feats.dtype or t.feats.device != first.feats.device:
            raise ValueError(
                f"tensors[{i}] holds {t.feats.dtype} on {t.feats.device}, "
                f"tensors[0] {first.feats.dtype} on {first.feats.device}"
            )
    merged = VoxelTensor(
        torch.cat([t.feats for t in tensors]), torch.cat([t.coords for t in tensors]), first.stride
    )
    return merged.coalesce("sum")


class Prune(nn.Module):
    """`Prune()(x, keep)`: `prune(x, keep)` as a module (MinkowskiEngine's `MinkowskiPruning`)."""

    def forward(self, x: VoxelTensor, keep: Tensor) -> VoxelTensor:
        return prune(x, keep)


class Union(nn.Module):
    """`Union()(a, b, ...)`: `union(a, b, ...)` as a module (MinkowskiEngine's `MinkowskiUnion`)."""

    def forward(self, *tensors: VoxelTensor) -> VoxelTensor:
        return union(*tensors)
