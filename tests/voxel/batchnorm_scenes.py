"""The scan and BatchNorm state the BatchNorm-folding tests share."""

from __future__ import annotations

import torch

from relconv.voxel import VoxelTensor, voxelize
from relconv.voxel.synthetic import raycast_scan


def scan(dtype: torch.dtype = torch.float64, voxel: float = 0.4) -> VoxelTensor:
    """A small synthetic 16-beam scan, features (x, y, z, intensity)."""
    points, intensity = raycast_scan(beams=16, azimuth_steps=256, seed=0)
    pts = torch.from_numpy(points)
    feats = torch.cat([pts, torch.from_numpy(intensity)[:, None]], 1).to(dtype)
    return voxelize(pts, voxel, feats=feats).tensor


def randomise_batchnorm(model: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial running statistics and affine parameters (fresh BN layers are near-identity)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen))
                m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                m.weight.copy_(torch.randn(n, generator=gen))
                m.bias.copy_(torch.randn(n, generator=gen))
