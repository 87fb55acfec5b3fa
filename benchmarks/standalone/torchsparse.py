"""TorchSparse++ 2.1 used as its README and examples show (default configuration, SparseTensor
(feats, coords) with batch-first int32 coordinates, maps cached on the tensor), timed with the twins'
own loop (standalone twin of the harness's torchsparse rows; see benchmarks/crosscheck.py). Run as
a module, so `import torchsparse` finds the library and not this file:

    python -m benchmarks.standalone.torchsparse
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.standalone.loop import report, time_call
from benchmarks.workloads.voxels import load_scene

C = 64


def voxel_cases(scene) -> dict[str, dict]:
    import torchsparse.nn as spnn
    from torchsparse import SparseTensor
    from torchsparse.backbones import SparseResUNet42

    coords = scene.coords.int()
    # The harness's grid (batch, X, Y, Z), each extent max + 1 rounded up to a multiple of 16, computed
    # once: without it every SparseTensor recomputes its extent with a host sync inside the timed call.
    grid = (1, *[(int(v) + 16) // 16 * 16 for v in coords[:, 1:].max(0).values.tolist()])
    feats = torch.randn(len(coords), C, device="cuda", dtype=torch.half)
    subm = spnn.Conv3d(C, C, 3).cuda().half().eval()
    down = spnn.Conv3d(C, C, 2, stride=2).cuda().half().eval()
    out = {}
    with torch.no_grad():
        x = SparseTensor(feats, coords, spatial_range=grid)
        subm(x)  # builds and caches the map in x's cache
        out["subm3-cached"] = time_call(lambda: subm(x))
        out["subm3-fresh"] = time_call(lambda: subm(SparseTensor(feats, coords, spatial_range=grid)))
        out["down2-fresh"] = time_call(lambda: down(SparseTensor(feats, coords, spatial_range=grid)))
        backbone = SparseResUNet42(in_channels=4).cuda().eval()
        head = nn.Linear(96, 19).cuda()
        half_feats = scene.feats.half()  # its convs ignore autocast: fp16 inputs make them run fp16
        with torch.autocast("cuda", dtype=torch.half):
            out["minkunet-infer"] = time_call(
                lambda: head(backbone(SparseTensor(half_feats, coords, spatial_range=grid))[-1].feats)
            )
    return out


def main() -> None:
    report("torchsparse", voxel_cases(load_scene("scan64", torch.device("cuda"))))


if __name__ == "__main__":
    main()
