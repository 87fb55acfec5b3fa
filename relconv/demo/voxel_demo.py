"""Voxel part of the demo: a real outdoor LiDAR scan through MinkUNet, forward and backward.

The scan is `data/source.ply` of the PyPI sdist `small-gicp==1.0.1` (fetched once and cached under
~/.cache/relconv); offline, a synthetic 64-beam ray-cast street scan stands in and the demo says so.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from relconv.datasets import DataUnavailable
from relconv.datasets.lidar import small_gicp_scan
from relconv.voxel import devoxelize, voxelize
from relconv.voxel.models import MinkUNet
from relconv.voxel.synthetic import raycast_scan


def load_scan() -> tuple[np.ndarray, np.ndarray, str]:
    """(points [N, 3] float32, intensity [N] float32, description of the source)."""
    try:
        points, intensity = small_gicp_scan("source")
        if intensity is None:
            intensity = np.zeros(len(points), np.float32)
        return points, intensity, "real scan small-gicp==1.0.1 data/source.ply"
    except (DataUnavailable, OSError, ValueError, KeyError) as err:
        points, intensity = raycast_scan(beams=64, seed=0)
        return points, intensity, f"synthetic 64-beam ray-cast scan (real scan unavailable: {err})"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(device: torch.device | str) -> None:
    """Voxelises the scan, runs MinkUNet forward (fresh and cached maps) and backward, prints timings."""
    device = torch.device(device)
    points, intensity, source = load_scan()
    print(f"[voxel] scan: {source}")
    # The CPU build of the core is for correctness, not speed: keep the CPU demo short.
    voxel_size, width = (0.05, 1.0) if device.type == "cuda" else (0.1, 0.5)
    if device.type != "cuda":
        print(f"[voxel] no GPU: using a coarser {voxel_size} m voxel and MinkUNet width {width}")
    pts = torch.from_numpy(points).to(device)
    i = torch.from_numpy(intensity).to(device)
    feats = torch.cat([pts, (i / i.max().clamp(min=1e-6)).unsqueeze(1)], 1)
    _sync(device)
    t0 = time.perf_counter()
    vox = voxelize(pts, voxel_size, feats=feats)
    _sync(device)
    t_vox = time.perf_counter() - t0
    x = vox.tensor
    print(f"[voxel] {points.shape[0]} points -> {len(x)} voxels at {voxel_size} m ({t_vox * 1e3:.1f} ms)")
    torch.manual_seed(0)
    model = MinkUNet(in_channels=4, num_classes=19, width=width).to(device)
    times = {}
    for name in ("forward (fresh maps)", "forward (cached maps)"):
        _sync(device)
        t0 = time.perf_counter()
        logits = model(x)
        _sync(device)
        times[name] = time.perf_counter() - t0
    t0 = time.perf_counter()
    logits.logsumexp(1).mean().backward()
    _sync(device)
    times["backward"] = time.perf_counter() - t0
    per_point = devoxelize(logits.detach(), vox.point_to_voxel)
    for name, t in times.items():
        print(f"[voxel] MinkUNet(width={width}) {name}: {t * 1e3:.1f} ms")
    print(f"[voxel] per-point logits {tuple(per_point.shape)}, {len(x.cache.maps)} kernel maps cached")
