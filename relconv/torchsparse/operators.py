"""TorchSparse's tensor operators: `cat` (channels) and `generative_add` (union of sites)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relconv.torchsparse.tensor import SparseTensor

__all__ = ["cat", "generative_add"]


def cat(inputs: Sequence[SparseTensor]) -> SparseTensor:
    """Features of tensors on the same sites concatenated along channels; the first input's
    coordinates, stride and cache (no spatial_range, as TorchSparse)."""
    if not inputs:
        raise ValueError("inputs must be a non-empty sequence of SparseTensor")
    for i, x in enumerate(inputs):
        if not isinstance(x, SparseTensor):
            raise TypeError(f"inputs[{i}] must be a SparseTensor, got {type(x).__name__}")
        if x.feats.shape[0] != inputs[0].feats.shape[0]:
            raise ValueError(
                f"inputs[{i}] has {x.feats.shape[0]} voxels but inputs[0] has {inputs[0].feats.shape[0]}; "
                "cat needs tensors on the same sites"
            )
    out = inputs[0]._like(torch.cat([x.feats for x in inputs], dim=1))
    out.spatial_range = None
    return out


def generative_add(a: SparseTensor, b: SparseTensor) -> SparseTensor:
    """Sum over the union of both tensors' sites (sorted by (batch, x, y, z)); stride, range and
    cache of the larger input."""
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, SparseTensor):
            raise TypeError(f"{name} must be a SparseTensor, got {type(x).__name__}")
    big, small = (a, b) if a.feats.shape[0] >= b.feats.shape[0] else (b, a)
    coords = torch.cat([big.coords, small.coords], 0)
    feats = torch.cat([big.feats, small.feats], 0)
    unique, inverse = torch.unique(coords, dim=0, return_inverse=True)
    summed = feats.new_zeros(unique.shape[0], feats.shape[1]).index_add_(0, inverse, feats)
    out = SparseTensor(summed, unique, big.stride, spatial_range=big.spatial_range)
    out._caches = big._caches
    return out
