"""spconv's functional helpers: `sparse_add` (sum over the union of sites)."""

from __future__ import annotations

import torch

from relconv.spconv._missing import missing
from relconv.spconv.core import SparseConvTensor


def sparse_add(*tens: SparseConvTensor) -> SparseConvTensor:
    """Sum of tensors on one grid: features added where sites coincide, over the union of sites.

    Output sites are sorted by (batch, d0, ..), as spconv's (torch.sparse coalesce order), except
    when the largest operand already holds every site: then the result is on that operand's sites,
    in its row order, and keeps its maps stored by `indice_key` (spconv keeps the maps too, but
    reorders the rows they index).
    """
    if not tens or not all(isinstance(t, SparseConvTensor) for t in tens):
        raise TypeError("sparse_add takes one or more SparseConvTensor")
    first = tens[0]
    for i, t in enumerate(tens[1:], start=1):
        if (
            t.spatial_shape != first.spatial_shape
            or t.batch_size != first.batch_size
            or t.features.shape[1] != first.features.shape[1]
        ):
            raise ValueError(
                f"sparse_add needs tensors of one grid and channel count: input {i} has spatial_shape "
                f"{t.spatial_shape}, batch_size {t.batch_size}, {t.features.shape[1]} channels; input 0 has "
                f"{first.spatial_shape}, {first.batch_size}, {first.features.shape[1]}"
            )
    largest = max(range(len(tens)), key=lambda i: tens[i].indices.shape[0])
    indices = torch.cat([t.indices for t in tens]).long()
    key = indices[:, 0]
    for n, col in zip(first.spatial_shape, indices[:, 1:].t(), strict=True):
        key = key * n + col
    keys, inverse = torch.unique(key, sorted=True, return_inverse=True)
    out_indices = indices.new_zeros(keys.numel(), indices.shape[1])
    out_indices[inverse] = indices
    features = torch.cat([t.features for t in tens])
    out = features.new_zeros(keys.numel(), features.shape[1]).index_add(0, inverse, features)
    big = tens[largest]
    if keys.numel() == big.indices.shape[0]:
        start = sum(t.indices.shape[0] for t in tens[:largest])
        return big.replace_feature(out[inverse[start : start + keys.numel()]])
    return SparseConvTensor(
        out, out_indices.int(), first.spatial_shape, first.batch_size, benchmark=first.benchmark
    )


def __getattr__(name: str):
    raise missing("spconv.pytorch.functional", name)
