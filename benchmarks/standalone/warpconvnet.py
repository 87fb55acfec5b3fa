"""WarpConvNet used as its README shows (Voxels(coords, feats, offsets), SparseConv3d; maps cached
on the input tensor), timed with the twins' own loop (standalone twin of the harness's warpconvnet
rows; see benchmarks/crosscheck.py).

    python -m benchmarks.standalone.warpconvnet
"""

from __future__ import annotations

import torch

from benchmarks.standalone.loop import report, time_call
from benchmarks.workloads.voxels import load_scene

C = 64


def voxel_cases(scene) -> dict[str, dict]:
    from warpconvnet.geometry.types.voxels import Voxels
    from warpconvnet.nn.modules.sparse_conv import SparseConv3d

    coords = scene.coords[:, 1:].int().contiguous()
    offsets = torch.tensor([0, len(coords)])
    feats = torch.randn(len(coords), C, device="cuda", dtype=torch.half)
    subm = SparseConv3d(C, C, 3, bias=False).cuda().half().eval()
    down = SparseConv3d(C, C, 2, stride=2, bias=False).cuda().half().eval()
    out = {}
    with torch.no_grad():
        x = Voxels(coords, feats, offsets=offsets)
        subm(x)  # builds and caches the map on x
        out["subm3-cached"] = time_call(lambda: subm(x))
        out["subm3-fresh"] = time_call(lambda: subm(Voxels(coords, feats, offsets=offsets)))
        out["down2-fresh"] = time_call(lambda: down(Voxels(coords, feats, offsets=offsets)))
    return out


def main() -> None:
    report("warpconvnet", voxel_cases(load_scene("scan64", torch.device("cuda"))))


if __name__ == "__main__":
    main()
