"""TorchSparse's `spcrop`: keeps the voxels inside a box."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relconv.torchsparse.tensor import SparseTensor

__all__ = ["spcrop"]


def spcrop(
    input: SparseTensor, coords_min: Sequence[int] | None = None, coords_max: Sequence[int] | None = None
) -> SparseTensor:
    """Voxels with `coords_min <= coords[:, :3] < coords_max`.

    As in TorchSparse 2.1, the bounds apply to the first three coordinate columns, which since 2.1
    are (batch, x, y): a box over (x, y, z) needs a batch bound in front of it.
    """
    if not isinstance(input, SparseTensor):
        raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
    coords, feats = input.coords, input.feats
    mask = torch.ones(coords.shape[0], 3, dtype=torch.bool, device=coords.device)
    for bound, keep in ((coords_min, torch.ge), (coords_max, torch.lt)):
        if bound is not None:
            if len(bound) != 3:
                raise ValueError(f"crop bounds must have 3 values, got {bound!r}")
            mask &= keep(coords[:, :3], torch.tensor(bound, dtype=coords.dtype, device=coords.device))
    mask = mask.all(1)
    return SparseTensor(feats[mask], coords[mask], input.stride)
