"""TorchSparse's point-voxel ops (SPVCNN's point branch), in torch on any device.

`sphash` is the hash of TorchSparse 2.1's CUDA kernels (64-bit FNV-1a over the four int32 columns,
as int64), so hashes agree with those TorchSparse computes on the GPU; with `offsets`, the offsets
are added to the x, y, z columns. (TorchSparse's CPU kernels differ: they fold the top 4 bits into
the rest and add the offsets to columns 0..2.) `sphashquery` finds each query hash among the
reference hashes, `spcount` counts rows per voxel, `spvoxelize` averages point features per voxel,
`calc_ti_weights` and `spdevoxelize` interpolate voxel features back to points (8 corners).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["calc_ti_weights", "spcount", "spdevoxelize", "sphash", "sphashquery", "spvoxelize"]

# FNV-1a 64-bit constants as int64 (torch's int64 arithmetic wraps like the uint64 original).
_OFFSET_BASIS = 14695981039346656037 - (1 << 64)
_PRIME = 1099511628211


def _fnv(columns: list[Tensor]) -> Tensor:
    h = torch.full_like(columns[0], _OFFSET_BASIS, dtype=torch.int64)
    for col in columns:
        h = (h ^ (col.to(torch.int64) & 0xFFFFFFFF)) * _PRIME
    return h


def sphash(coords: Tensor, offsets: Tensor | None = None) -> Tensor:
    """[N] int64 hashes of int32 `coords [N, 4]` (batch, x, y, z); with int32 `offsets [K, 3]`,
    [K, N] hashes of the rows with each offset added to (x, y, z)."""
    if (
        not isinstance(coords, Tensor)
        or coords.dtype != torch.int32
        or coords.dim() != 2
        or coords.shape[1] != 4
    ):
        raise ValueError(f"coords must be an int32 [N, 4] tensor, got {getattr(coords, 'dtype', coords)}")
    cols = [coords[:, j] for j in range(4)]
    if offsets is None:
        return _fnv(cols)
    if (
        not isinstance(offsets, Tensor)
        or offsets.dtype != torch.int32
        or offsets.dim() != 2
        or offsets.shape[1] != 3
    ):
        raise ValueError("offsets must be an int32 [K, 3] tensor")
    off = offsets.to(coords.device)
    moved = [cols[j + 1][None, :] + off[:, j, None] for j in range(3)]
    return _fnv([cols[0][None, :].expand_as(moved[0]), *moved])


def sphashquery(queries: Tensor, references: Tensor) -> Tensor:
    """For each query hash (any shape), the row of `references [M]` with that hash, else -1."""
    flat = queries.reshape(-1)
    if references.numel() == 0:
        return torch.full_like(queries, -1, dtype=torch.int64)
    keys, order = torch.sort(references)
    pos = torch.searchsorted(keys, flat).clamp_(max=keys.numel() - 1)
    found = keys[pos] == flat
    out = torch.where(found, order[pos], torch.full_like(pos, -1))
    return out.view(queries.shape)


def spcount(coords: Tensor, num: int) -> Tensor:
    """[num] int32 number of entries of `coords` (voxel indices; negatives skipped) per voxel."""
    idx = coords.reshape(-1).long()
    return torch.bincount(idx[idx >= 0], minlength=int(num)).to(torch.int32)


def spvoxelize(feats: Tensor, coords: Tensor, counts: Tensor) -> Tensor:
    """[M, C] mean of the point features `feats [N, C]` per voxel `coords [N]` (M = len(counts))."""
    idx = coords.reshape(-1).long()
    keep = idx >= 0
    out = feats.new_zeros(counts.shape[0], feats.shape[1], dtype=torch.float32)
    out = out.index_add(0, idx[keep], feats[keep].float())
    return (out / counts.clamp(min=1).to(out.dtype)[:, None]).to(feats.dtype)


def calc_ti_weights(coords: Tensor, idx_query: Tensor, scale: float = 1) -> Tensor:
    """[N, 8] trilinear weights of points `coords [N, 3]` to the 8 corners of their cell of size
    `scale` (corner order x-major: (0,0,0), (0,0,1), (0,1,0) ...), zero where `idx_query [N, 8]`
    is -1, normalised to sum 1."""
    with torch.no_grad():
        lo = torch.floor(coords / scale) * scale if scale != 1 else torch.floor(coords)
        hi = lo + scale
        near = (hi - coords).float()  # weight factor towards the low corner per axis
        far = (coords - lo).float()
        parts = []
        for bx in (near[:, 0], far[:, 0]):
            for by in (near[:, 1], far[:, 1]):
                for bz in (near[:, 2], far[:, 2]):
                    parts.append(bx * by * bz)
        w = torch.stack(parts, 1)
        if scale != 1:
            w /= scale**3
        w[idx_query == -1] = 0
        return w / (w.sum(1, keepdim=True) + 1e-8)


def spdevoxelize(feats: Tensor, coords: Tensor, weights: Tensor) -> Tensor:
    """[N, C] = sum_k weights[n, k] * feats[coords[n, k]] over the corners with coords >= 0."""
    idx = coords.long()
    valid = idx >= 0
    gathered = feats[idx.clamp(min=0)]  # [N, 8, C]
    w = torch.where(valid, weights, torch.zeros_like(weights)).to(feats.dtype)
    return (gathered * w.unsqueeze(-1)).sum(1)
