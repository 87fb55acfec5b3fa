"""The compat harness's input: a batch of four synthetic 64-beam scans, voxelized per backbone family.

* `kitti_voxels`: OpenPCDet's KITTI voxel set-up (the one `VoxelBackBone8x`'s layer comments
  assume): range [0, 70.4] x [-40, 40] x [-3, 1] m, voxels 0.05 x 0.05 x 0.1 m, grid [1408, 1600,
  40] (x, y, z), mean (x, y, z, intensity) per voxel (OpenPCDet's MeanVFE).
* `fine_voxels`: the benchmarks' 0.05 m scan workload (`benchmarks/workloads/voxels.py`): the whole
  sweep, coordinates shifted to be non-negative by a multiple of 16, mean (x, y, z, intensity).

Both are sorted by (batch, x, y, z) and computed on the CPU, so every child process gets the same
rows in the same order.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

KITTI_RANGE = (0.0, -40.0, -3.0, 70.4, 40.0, 1.0)
KITTI_VOXEL = (0.05, 0.05, 0.1)
FINE_VOXEL = 0.05


@dataclass
class Voxels:
    coords: torch.Tensor  # [N, 4] int32 (b, x, y, z), non-negative
    feats: torch.Tensor  # [N, 4] float32 (x, y, z, intensity) means
    batch_size: int
    grid_size: tuple[int, int, int]  # (x, y, z) extent of the grid

    # What each family's data loader hands the model beside the coordinates, computed once here as a
    # loader computes it once per batch: not CPU work inside every timed call (a bincount over the
    # rows alone takes milliseconds of host time).

    @functools.cached_property
    def torchsparse_range(self) -> tuple[int, int, int, int]:
        """TorchSparse's `spatial_range` of these coordinates."""
        from benchmarks.peers.torchsparse import spatial_range

        return spatial_range(self.coords, self.batch_size)

    @functools.cached_property
    def offsets(self) -> torch.Tensor:
        """Pointcept's `offset`: the cumulative row count of each scan."""
        return torch.cumsum(torch.bincount(self.coords[:, 0].long(), minlength=self.batch_size), 0)

    @functools.cached_property
    def coords_bzyx(self) -> torch.Tensor:
        """OpenPCDet's `voxel_coords`: (batch, z, y, x)."""
        return self.coords[:, [0, 3, 2, 1]].contiguous()


def scans(count: int = 4, beams: int = 64, azimuth_steps: int = 1800) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` synthetic sweeps (seeds 0 .. count-1): points [N, 3] and intensity [N]."""
    from relconv.voxel import synthetic

    return [synthetic.raycast_scan(beams=beams, seed=s, azimuth_steps=azimuth_steps) for s in range(count)]


def tiny_scans() -> list[tuple[np.ndarray, np.ndarray]]:
    """The benchmarks' "tiny" workload for CPU dry runs: two 8-beam sweeps within 6 m of the sensor."""
    out = []
    for p, i in scans(count=2, beams=8, azimuth_steps=180):
        keep = (np.abs(p[:, 0]) < 6) & (np.abs(p[:, 1]) < 6)
        out.append((p[keep], i[keep]))
    return out


def _voxelize(clouds, voxel_size) -> tuple[torch.Tensor, torch.Tensor]:
    from relconv.voxel import voxelize

    points = torch.cat([torch.from_numpy(np.ascontiguousarray(p)) for p, _ in clouds])
    inten = torch.cat([torch.from_numpy(np.ascontiguousarray(i)).float() for _, i in clouds])
    batch = torch.cat([torch.full((len(p),), b, dtype=torch.int64) for b, (p, _) in enumerate(clouds)])
    vt = voxelize(points, voxel_size, batch=batch, feats=torch.cat([points, inten[:, None]], 1)).tensor
    return vt.coords.clone(), vt.feats.clone()


def kitti_voxels(clouds) -> Voxels:
    lo, hi = np.array(KITTI_RANGE[:3], np.float32), np.array(KITTI_RANGE[3:], np.float32)
    cropped = []
    for p, i in clouds:
        keep = np.all((p >= lo) & (p < hi), axis=1)
        cropped.append((p[keep] - lo, i[keep]))
    coords, feats = _voxelize(cropped, KITTI_VOXEL)
    feats[:, :3] += torch.from_numpy(lo)  # features in the sensor frame, as the VFE sees them
    grid = tuple(int(round(float(h - low) / v)) for low, h, v in zip(lo, hi, KITTI_VOXEL, strict=True))
    return Voxels(coords, feats, len(clouds), grid)


def fine_voxels(clouds) -> Voxels:
    coords, feats = _voxelize(clouds, FINE_VOXEL)
    shift = torch.div(coords[:, 1:].min(0).values, 16, rounding_mode="floor") * 16
    coords[:, 1:] -= shift
    grid = tuple(int(v) + 1 for v in coords[:, 1:].max(0).values)
    return Voxels(coords, feats, len(clouds), grid)


def load(kind: str, tiny: bool, cache: Path | None = None) -> Voxels:
    """The `kind` ("kitti" or "fine") voxels of the four scans (or of `tiny_scans`), kept in `cache`
    when given: every child process of one harness run then reads the same file instead of
    ray-casting and voxelizing again."""
    if kind not in ("kitti", "fine"):
        raise ValueError(f"kind must be 'kitti' or 'fine', got {kind!r}")
    file = cache / f"{kind}{'-tiny' if tiny else ''}.pt" if cache is not None else None
    if file is not None and file.is_file():
        return Voxels(**torch.load(file))
    clouds = tiny_scans() if tiny else scans()
    voxels = kitti_voxels(clouds) if kind == "kitti" else fine_voxels(clouds)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(asdict(voxels), file)
    return voxels
