"""TorchSparse's `sparse_quantize`: points -> unique voxel coordinates (numpy, as TorchSparse)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ravel_hash", "sparse_quantize"]


def ravel_hash(x: np.ndarray) -> np.ndarray:
    """[N, D] integer rows -> [N] uint64 keys, ordered like the rows' lexicographic order (each
    column shifted to start at 0 and weighted by the spans of the columns after it)."""
    if x.ndim != 2:
        raise ValueError(f"x must be a 2-D array, got shape {x.shape}")
    x = (x - np.min(x, axis=0)).astype(np.uint64, copy=False)
    span = np.max(x, axis=0).astype(np.uint64) + 1
    h = np.zeros(x.shape[0], dtype=np.uint64)
    for k in range(x.shape[1] - 1):
        h += x[:, k]
        h *= span[k + 1]
    h += x[:, -1]
    return h


def sparse_quantize(
    coords: np.ndarray,
    voxel_size: float | Sequence[float] = 1,
    *,
    return_index: bool = False,
    return_inverse: bool = False,
):
    """Voxel coordinates `floor(coords / voxel_size)` (int32), one row per occupied voxel.

    Args:
        coords: [N, 3] point coordinates (numpy array).
        voxel_size: one number or 3.
    Returns:
        the voxels' coordinates [M, 3], ordered by their ravel key (lexicographic (x, y, z)); with
        `return_index` also the index of each voxel's first point [M], with `return_inverse` also
        each point's voxel row [N], in that order (a single array when neither is asked).
    """
    if isinstance(voxel_size, (int, float)) and not isinstance(voxel_size, bool):
        voxel_size = (voxel_size,) * 3
    if not isinstance(voxel_size, (tuple, list)) or len(voxel_size) != 3:
        raise ValueError(f"voxel_size must be a number or a tuple of 3 numbers, got {voxel_size!r}")
    coords = np.asarray(coords)
    if coords.ndim != 2 or coords.shape[1] != 3:
        raise ValueError(f"coords must have shape [N, 3], got {coords.shape}")
    voxels = np.floor(coords / np.asarray(voxel_size, dtype=np.float64)).astype(np.int32)
    _, indices, inverse = np.unique(ravel_hash(voxels), return_index=True, return_inverse=True)
    outputs = [voxels[indices]]
    if return_index:
        outputs.append(indices)
    if return_inverse:
        outputs.append(inverse)
    return outputs[0] if len(outputs) == 1 else outputs
