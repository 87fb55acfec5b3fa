"""relconv used as its README shows, timed with the twins' own loop (standalone twin of the
harness's relconv rows; see benchmarks/crosscheck.py).

    python -m benchmarks.standalone.relconv
"""

from __future__ import annotations

import torch

from benchmarks.standalone.loop import report, time_call
from benchmarks.workloads.voxels import load_scene

C = 64


def voxel_cases(scene) -> dict[str, dict]:
    from relconv.voxel import Conv3d, VoxelTensor
    from relconv.voxel.models import MinkUNet

    coords = scene.coords
    feats = torch.randn(len(coords), C, device="cuda", dtype=torch.half)
    out = {}
    subm = Conv3d(C, C, 3).cuda().half().eval()
    down = Conv3d(C, C, 2, stride=2).cuda().half().eval()
    with torch.no_grad():
        x = VoxelTensor(feats, coords)
        subm(x)  # builds and caches the map on x
        out["subm3-cached"] = time_call(lambda: subm(x))
        out["subm3-fresh"] = time_call(lambda: subm(VoxelTensor(feats, coords)))
        out["down2-fresh"] = time_call(lambda: down(VoxelTensor(feats, coords)))
        model = MinkUNet(4, 19, width=1.0).cuda().eval()
        with torch.autocast("cuda", dtype=torch.half):
            out["minkunet-infer"] = time_call(lambda: model(VoxelTensor(scene.feats, coords)))
    return out


def graph_cases(graph) -> dict[str, dict]:
    from relconv.graph import RGCNConv, build_rgcn_map

    edge_index, edge_type, n, r = graph
    conv = RGCNConv(C, C, r, aggr="mean").cuda()
    x = torch.randn(n, C, device="cuda")
    graph_map = build_rgcn_map(edge_index, edge_type, n, r, "mean")
    with torch.no_grad():
        return {"rgcn-layer": time_call(lambda: conv(x, graph_map))}


def main() -> None:
    from benchmarks.workloads.graphs import make_kg

    scene = load_scene("scan64", torch.device("cuda"))
    ei, et, n, r, _ = make_kg("AIFB", seed=0)
    report("relconv", voxel_cases(scene) | graph_cases((ei.cuda(), et.cuda(), n, r)))


if __name__ == "__main__":
    main()
