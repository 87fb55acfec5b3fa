"""TorchSparse's `torchsparse.utils`: tuple/tensor helpers and `to_dense`."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from relconv.torchsparse.tensor import make_ntuple

__all__ = ["make_divisible", "make_ntuple", "make_tensor", "to_dense"]


@functools.lru_cache
def make_tensor(x: tuple, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    return torch.tensor(x, dtype=dtype, device=device)


def make_divisible(x: int, divisor: int) -> int:
    return (x + divisor - 1) // divisor * divisor


def to_dense(feats: Tensor, coords: Tensor, spatial_range: Sequence[int]) -> Tensor:
    """Dense `[*spatial_range, C]` (B, X, Y, Z, C) with `feats[i]` at `coords[i]` (batch, x, y, z)."""
    if not isinstance(feats, Tensor) or feats.dim() != 2:
        raise ValueError(
            f"feats must be a [N, C] tensor, got {getattr(feats, 'shape', type(feats).__name__)}"
        )
    if not isinstance(coords, Tensor) or coords.dim() != 2 or coords.shape[1] != 4:
        raise ValueError(
            f"coords must be a [N, 4] tensor, got {getattr(coords, 'shape', type(coords).__name__)}"
        )
    rng = tuple(int(r) for r in spatial_range)
    if len(rng) != 4:
        raise ValueError(f"spatial_range must be (batch, X, Y, Z), got {spatial_range!r}")
    c = coords.long()
    out = feats.new_zeros(*rng, feats.shape[1])
    return out.index_put((c[:, 0], c[:, 1], c[:, 2], c[:, 3]), feats)
