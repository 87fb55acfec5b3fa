"""spconv 2.x used as its README shows (SubMConv3d with an indice_key; the output tensor reused
through replace_feature), timed with the twins' own loop (standalone twin of the harness's spconv
rows; see benchmarks/crosscheck.py). Run as a module, so `import spconv` finds the library:

    python -m benchmarks.standalone.spconv
"""

from __future__ import annotations

import torch

from benchmarks.standalone.loop import feature_copies, report
from benchmarks.workloads.voxels import load_scene

C = 64


def voxel_cases(scene) -> dict:
    import spconv.pytorch as spconv

    coords = scene.coords.int()
    # The harness's grid: max + 1 rounded up to a multiple of 16, computed once before timing (a
    # per-call `.tolist()` would add a host sync that a user who knows the scene's extent skips).
    shape = [(int(v) + 16) // 16 * 16 for v in coords[:, 1:].max(0).values.tolist()]
    feats = feature_copies(len(coords), C, torch.half)
    subm = spconv.SubMConv3d(C, C, 3, padding=1, bias=False, indice_key="subm1").cuda().half().eval()
    down = spconv.SparseConv3d(C, C, 2, stride=2, bias=False).cuda().half().eval()
    with torch.no_grad():
        y = subm(spconv.SparseConvTensor(next(feats), coords, shape, 1))  # builds the "subm1" pairs

    @torch.no_grad()
    def subm_cached():
        return subm(y.replace_feature(next(feats)))

    @torch.no_grad()
    def subm_fresh():
        return subm(spconv.SparseConvTensor(next(feats), coords, shape, 1))

    @torch.no_grad()
    def down_fresh():
        return down(spconv.SparseConvTensor(next(feats), coords, shape, 1))

    return {"subm3-cached": subm_cached, "subm3-fresh": subm_fresh, "down2-fresh": down_fresh}


def main() -> None:
    report("spconv", voxel_cases(load_scene("scan64", torch.device("cuda"))))


if __name__ == "__main__":
    main()
