"""Points -> voxels (unique coordinates, reduced features) and back; batching of samples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from relconv.voxel.kernel_map import make_packing
from relconv.voxel.tensor import VoxelTensor


class Voxelized(NamedTuple):
    """`tensor`: the voxels (sorted by (batch, x, y, z)); `point_to_voxel [N]` int64 row per point."""

    tensor: VoxelTensor
    point_to_voxel: Tensor


def voxelize(
    points: Tensor,
    voxel_size: float | Sequence[float],
    batch: Tensor | None = None,
    reduce: str = "mean",
    feats: Tensor | None = None,
) -> Voxelized:
    """Quantises points to voxels `floor(p / voxel_size)` and reduces their features per voxel.

    Same code on CPU and CUDA; the voxel order (sorted by (batch, x, y, z)) is identical on both.

    Args:
        points: [N, 3] float coordinates (negative values are fine).
        voxel_size: edge length, one float or (sx, sy, sz), all > 0.
        batch: optional [N] integer sample index per point (default: all 0).
        reduce: "mean", "sum" or "max" over the points of a voxel.
        feats: optional [N, C] float per-point features; default the points themselves.
    Returns:
        Voxelized(VoxelTensor with [M, C] features and int32 [M, 4] coords, point_to_voxel [N]).
    """
    if not isinstance(points, Tensor) or not points.dtype.is_floating_point:
        raise TypeError(f"points must be a floating-point tensor, got {_what(points)}")
    if points.dim() != 2 or points.shape[1] != 3:
        raise ValueError(f"points must have shape [N, 3], got {tuple(points.shape)}")
    reducer = {"mean": "mean", "sum": "sum", "max": "amax"}.get(reduce)
    if reducer is None:
        raise ValueError(f"reduce must be 'mean', 'sum' or 'max', got {reduce!r}")
    size = _voxel_size(voxel_size)
    n = points.shape[0]
    feats = points if feats is None else feats
    if not isinstance(feats, Tensor) or feats.dim() != 2 or feats.shape[0] != n:
        raise ValueError(f"feats must have shape [{n}, C] (one row per point), got {_what(feats)}")
    if feats.device != points.device:
        raise ValueError(f"feats is on {feats.device} but points is on {points.device}")
    if batch is None:
        batch = torch.zeros(n, dtype=torch.int64, device=points.device)
    elif not isinstance(batch, Tensor) or batch.shape != (n,) or batch.dtype.is_floating_point:
        raise ValueError(f"batch must be an integer tensor of shape [{n}], got {_what(batch)}")
    elif batch.device != points.device:
        raise ValueError(f"batch is on {batch.device} but points is on {points.device}")
    p = points.to(torch.float64)
    # Python scalars divide without a host-to-device copy (a blocking copy waits for the GPU).
    grid = torch.floor(
        p / size[0] if len(size) == 1 else torch.stack([p[:, a] / size[a] for a in range(3)], 1)
    )
    coords = torch.cat([batch.long().unsqueeze(1), grid.long()], 1)
    lo, hi = _checked_bounds(grid, coords)
    packing = make_packing(lo, hi, (0, 0, 0))
    keys, inverse = torch.unique(packing.pack(coords), sorted=True, return_inverse=True)
    index = inverse.unsqueeze(1).expand(n, feats.shape[1])
    out = feats.new_zeros(keys.numel(), feats.shape[1])
    out = out.scatter_reduce(0, index, feats, reducer, include_self=False)
    return Voxelized(VoxelTensor(out, packing.unpack(keys)), inverse)


def devoxelize(voxels: VoxelTensor | Tensor, point_to_voxel: Tensor) -> Tensor:
    """Per-point rows `[N, C]` of voxel features `[M, C]` (e.g. segmentation logits back to points)."""
    feats = voxels.feats if isinstance(voxels, VoxelTensor) else voxels
    if not isinstance(point_to_voxel, Tensor) or point_to_voxel.dim() != 1:
        raise ValueError(f"point_to_voxel must be a 1-D index tensor, got {_what(point_to_voxel)}")
    if point_to_voxel.device != feats.device:
        raise ValueError(f"point_to_voxel is on {point_to_voxel.device} but the voxels are on {feats.device}")
    return feats.index_select(0, point_to_voxel)


def collate(samples: Sequence[VoxelTensor]) -> VoxelTensor:
    """Stacks single-sample tensors into one batch; sample i gets batch index i (rows keep order)."""
    if not samples:
        raise ValueError("samples must be a non-empty sequence of VoxelTensor")
    for i, s in enumerate(samples):
        if not isinstance(s, VoxelTensor):
            raise TypeError(f"samples[{i}] must be a VoxelTensor, got {type(s).__name__}")
        if s.stride != samples[0].stride or s.device != samples[0].device:
            raise ValueError(f"samples[{i}] differs from samples[0] in stride or device")
    coords = torch.cat([s.coords for s in samples])
    start = 0
    for i, s in enumerate(samples):  # fills of host-known row ranges: nothing is read back
        coords[start : start + len(s), 0] = i
        start += len(s)
    return VoxelTensor(torch.cat([s.feats for s in samples]), coords, samples[0].stride)


def _voxel_size(voxel_size) -> list[float]:
    """The voxel edge lengths as Python floats (one or three, all > 0); read from the host, so a
    voxel size given as numbers costs no device read."""
    try:
        values = torch.as_tensor(voxel_size, dtype=torch.float64).reshape(-1).tolist()
    except (TypeError, ValueError, RuntimeError):
        values = []
    if len(values) not in (1, 3) or not all(v > 0 and v < float("inf") for v in values):
        raise ValueError(f"voxel_size must be one positive float or three, got {voxel_size!r}")
    return values


def _checked_bounds(grid: Tensor, coords: Tensor) -> tuple[list[int], list[int]]:
    """Per-column min and max of coords [N, 4] (batch, grid cells), after checking that the grid
    cells are finite and fit int32: one read of the device for all of it."""
    if not len(grid):
        return [0, 0, 0, 0], [0, 0, 0, 0]
    finite = torch.isfinite(grid).all().to(torch.float64).reshape(1)
    g_lo, g_hi = torch.aminmax(grid, dim=0)
    b_lo, b_hi = torch.aminmax(coords[:, 0], dim=0)
    read = torch.cat([finite, b_lo.reshape(1).double(), g_lo, b_hi.reshape(1).double(), g_hi]).tolist()
    if not read[0]:
        raise ValueError("points contain NaN or infinite values")
    lo, hi = read[1:5], read[5:9]
    if max(abs(v) for v in lo[1:] + hi[1:]) >= 2**31:
        raise ValueError("points / voxel_size leaves the int32 coordinate range; use a larger voxel_size")
    return [int(v) for v in lo], [int(v) for v in hi]


def _what(t: object) -> str:
    return f"shape {tuple(t.shape)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
