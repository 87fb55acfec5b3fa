"""TorchSparse++ 2.1 used as its README and examples show (default configuration, SparseTensor
(feats, coords) with batch-first int32 coordinates, maps cached on the tensor), timed with the twins'
own loop (standalone twin of the harness's torchsparse rows; see benchmarks/crosscheck.py). Run as
a module, so `import torchsparse` finds the library and not this file:

    python -m benchmarks.standalone.torchsparse
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from benchmarks.standalone.loop import feature_copies, report
from benchmarks.workloads.voxels import load_scene

C = 64
E2E_COPIES = 3


def voxel_cases(scene) -> dict:
    import torchsparse.nn as spnn
    from torchsparse import SparseTensor
    from torchsparse.backbones import SparseResUNet42

    coords = scene.coords.int()
    # The harness's grid (batch, X, Y, Z), each extent max + 1 rounded up to a multiple of 16, computed
    # once: without it every SparseTensor recomputes its extent with a host sync inside the timed call.
    grid = (1, *[(int(v) + 16) // 16 * 16 for v in coords[:, 1:].max(0).values.tolist()])
    feats = feature_copies(len(coords), C, torch.half)
    subm = spnn.Conv3d(C, C, 3).cuda().half().eval()
    down = spnn.Conv3d(C, C, 2, stride=2).cuda().half().eval()
    backbone = SparseResUNet42(in_channels=4).cuda().eval()
    head = nn.Linear(96, 19).cuda()
    scans = itertools.cycle([scene.feats.clone() for _ in range(E2E_COPIES)])
    with torch.no_grad():
        x = SparseTensor(next(feats), coords, spatial_range=grid)
        subm(x)  # builds and caches the map in x's cache

    @torch.no_grad()
    def subm_cached():
        x.feats = next(feats)  # the next scan's features at the same sites: x's cache still holds
        return subm(x)

    @torch.no_grad()
    def subm_fresh():
        return subm(SparseTensor(next(feats), coords, spatial_range=grid))

    @torch.no_grad()
    def down_fresh():
        return down(SparseTensor(next(feats), coords, spatial_range=grid))

    @torch.no_grad()
    def minkunet():
        with torch.autocast("cuda", dtype=torch.half):
            # Its convs ignore autocast and run fp16 only for fp16 features: the scan's fp32 features
            # are cast in the call, as every other network here casts them (under autocast).
            x = SparseTensor(next(scans).half(), coords, spatial_range=grid)
            return head(backbone(x)[-1].feats)

    return {
        "subm3-cached": subm_cached,
        "subm3-fresh": subm_fresh,
        "down2-fresh": down_fresh,
        "minkunet-infer": minkunet,
    }


def main() -> None:
    report("torchsparse", voxel_cases(load_scene("scan64", torch.device("cuda"))))


if __name__ == "__main__":
    main()
