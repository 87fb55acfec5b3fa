"""WarpConvNet used as its README shows (Voxels(coords, feats, offsets), SparseConv3d; maps cached
on the input tensor and carried by replace_features), timed with the twins' own loop (standalone
twin of the harness's warpconvnet rows; see benchmarks/crosscheck.py).

    python -m benchmarks.standalone.warpconvnet
"""

from __future__ import annotations

import torch

from benchmarks.standalone.loop import feature_copies, report
from benchmarks.workloads.voxels import load_scene

C = 64


def voxel_cases(scene) -> dict:
    from warpconvnet.geometry.types.voxels import Voxels
    from warpconvnet.nn.modules.sparse_conv import SparseConv3d

    coords = scene.coords[:, 1:].int().contiguous()
    offsets = torch.tensor([0, len(coords)])
    feats = feature_copies(len(coords), C, torch.half)
    subm = SparseConv3d(C, C, 3, bias=False).cuda().half().eval()
    down = SparseConv3d(C, C, 2, stride=2, bias=False).cuda().half().eval()
    with torch.no_grad():
        x = Voxels(coords, next(feats), offsets=offsets)
        subm(x)  # builds and caches the map on x

    @torch.no_grad()
    def subm_cached():
        return subm(x.replace_features(next(feats)))

    @torch.no_grad()
    def subm_fresh():
        return subm(Voxels(coords, next(feats), offsets=offsets))

    @torch.no_grad()
    def down_fresh():
        return down(Voxels(coords, next(feats), offsets=offsets))

    return {"subm3-cached": subm_cached, "subm3-fresh": subm_fresh, "down2-fresh": down_fresh}


def main() -> None:
    report("warpconvnet", voxel_cases(load_scene("scan64", torch.device("cuda"))))


if __name__ == "__main__":
    main()
