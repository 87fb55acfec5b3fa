"""Voxel workloads: synthetic ray-cast LiDAR scans, an indoor room and the small-gicp real scan.

`load_scene(name, device)` voxelizes a workload once and returns its coordinates and features.
Coordinates are shifted to be non-negative (by a multiple of 16, so every stride-2 level floors
identically for every implementation) and handed to every implementation in the same row order.
Standalone twins (benchmarks/standalone) import this module and nothing else from the harness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from benchmarks.workloads import real


@dataclass
class Scene:
    coords: torch.Tensor  # [N, 4] int32 (b, x, y, z), x, y, z >= 0, sorted by (b, x, y, z)
    feats: torch.Tensor  # [N, 4] float32 (x, y, z, intensity) per voxel
    batch_size: int


def _scan(beams: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from relconv.voxel import synthetic

    if beams == 32:
        # HDL-32E-like: +10.67 .. -30.67 deg vertical field of view, ~0.5 deg azimuth steps: ~20k
        # voxels at 0.05 m (the default 1800 steps of the 64-beam sensor would give ~38k).
        return synthetic.raycast_scan(beams=32, seed=seed, fov_up=10.67, fov_down=-30.67, azimuth_steps=720)
    return synthetic.raycast_scan(beams=beams, seed=seed)


def _scan_points(name: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Point clouds (points [N, 3], intensity [N]) of a workload, one per batch sample."""
    from relconv.voxel import synthetic

    if name in ("scan32", "scan64", "scan128"):
        return [_scan(int(name[4:]), seed=0)]
    if name.endswith("b2") and name[:-2] in ("scan32", "scan64", "scan128"):
        return [_scan(int(name[4:-2]), seed=0), _scan(int(name[4:-2]), seed=1)]
    if name == "scan64x3":
        # The generator has no sensor pose: three sweeps of a car driving at ~9 m/s (10 Hz) are
        # approximated by the scan repeated 0.9 m apart along the road, as an aggregate after
        # ego-motion compensation would look.
        p, i = synthetic.raycast_scan(beams=64, seed=0)
        return [
            (np.concatenate([p + np.array([0.9 * k, 0, 0], np.float32) for k in range(3)]), np.tile(i, 3))
        ]
    if name == "scan128x8":
        # Scale test (3.5M voxels at 0.01 m): eight sweeps of a dense 128-beam scan 0.675 m apart
        # along the road, the same pose-free aggregate approximation as scan64x3.
        p, i = synthetic.raycast_scan(beams=128, seed=0, azimuth_steps=4096)
        return [
            (np.concatenate([p + np.array([0.675 * k, 0, 0], np.float32) for k in range(8)]), np.tile(i, 8))
        ]
    if name == "indoor":
        p, colour = synthetic.indoor_room(seed=0)
        return [(p, colour.mean(1))]
    if name == "kitti-real":
        p, i = real.small_gicp_scans()["source"]
        return [
            (p.numpy(), np.zeros(len(p), np.float32) if i is None else i.numpy() / max(1.0, float(i.max())))
        ]
    if name in ("tiny", "tiny2"):
        scans = []
        for seed in range(1 if name == "tiny" else 2):
            p, i = synthetic.raycast_scan(beams=8, seed=seed, azimuth_steps=180)
            keep = (np.abs(p[:, 0]) < 6) & (np.abs(p[:, 1]) < 6)
            scans.append((p[keep], i[keep]))
        return scans
    raise ValueError(f"unknown voxel workload {name!r}")


def voxel_size(name: str) -> float:
    return {"indoor": 0.02, "scan128x8": 0.01, "tiny": 0.25, "tiny2": 0.25}.get(name, 0.05)


def load_scene(name: str, device: torch.device) -> Scene:
    """The suite's fixed workloads above, or a scene of benchmarks/workloads/families.py by its name
    (aggregate-1m, room-2cm, batch4-64beam, ...), generated at seed 0."""
    from benchmarks.workloads import families
    from relconv.voxel import voxelize

    if name in families.scene_names():
        s = families.make_scene(name)
        return Scene(
            torch.from_numpy(s.coords).to(device), torch.from_numpy(s.feats).to(device), s.batch_size
        )
    clouds = _scan_points(name)
    points = torch.cat([torch.from_numpy(np.ascontiguousarray(p)) for p, _ in clouds])
    inten = torch.cat([torch.from_numpy(np.ascontiguousarray(i)).float() for _, i in clouds])
    batch = torch.cat([torch.full((len(p),), b, dtype=torch.int64) for b, (p, _) in enumerate(clouds)])
    feats = torch.cat([points, inten[:, None]], 1)
    vt = voxelize(points, voxel_size(name), batch=batch, feats=feats).tensor
    coords = vt.coords.clone()
    shift = torch.div(coords[:, 1:].min(0).values, 16, rounding_mode="floor") * 16
    coords[:, 1:] -= shift
    return Scene(coords.to(device), vt.feats.to(device), len(clouds))


def at_stride(coords: torch.Tensor, stride: int) -> torch.Tensor:
    """The sites of `coords` ([N, 4] (b, x, y, z)) at tensor stride `stride`: floor-divided, unique."""
    if stride == 1:
        return coords
    scaled = coords.clone()
    scaled[:, 1:] = torch.div(scaled[:, 1:], stride, rounding_mode="floor")
    return torch.unique(scaled, dim=0)
