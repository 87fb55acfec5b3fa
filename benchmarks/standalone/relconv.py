"""relconv used as its README shows, timed with the twins' own loop (standalone twin of the
harness's relconv rows; see benchmarks/crosscheck.py).

    python -m benchmarks.standalone.relconv

`voxel_cases` / `graph_cases` return each case as a call with no arguments (the cross-check
interleaves them with the harness's calls); every call runs under `torch.no_grad()` itself.
"""

from __future__ import annotations

import itertools

import torch

from benchmarks.standalone.loop import feature_copies, report
from benchmarks.workloads.voxels import load_scene

C = 64
E2E_COPIES = 3  # the scan's 4 input features, a few copies as for the layers


def voxel_cases(scene) -> dict:
    from relconv.voxel import Conv3d, VoxelTensor
    from relconv.voxel.models import MinkUNet

    coords = scene.coords
    feats = feature_copies(len(coords), C, torch.half)
    subm = Conv3d(C, C, 3).cuda().half().eval()
    down = Conv3d(C, C, 2, stride=2).cuda().half().eval()
    model = MinkUNet(4, 19, width=1.0).cuda().eval()
    scans = itertools.cycle([scene.feats.clone() for _ in range(E2E_COPIES)])
    with torch.no_grad():
        x = VoxelTensor(next(feats), coords)
        subm(x)  # builds and caches the map on x; replace_feature keeps that cache

    @torch.no_grad()
    def subm_cached():
        return subm(x.replace_feature(next(feats)))

    @torch.no_grad()
    def subm_fresh():
        return subm(VoxelTensor(next(feats), coords))

    @torch.no_grad()
    def down_fresh():
        return down(VoxelTensor(next(feats), coords))

    @torch.no_grad()
    def minkunet():
        with torch.autocast("cuda", dtype=torch.half):
            return model(VoxelTensor(next(scans), coords))

    return {
        "subm3-cached": subm_cached,
        "subm3-fresh": subm_fresh,
        "down2-fresh": down_fresh,
        "minkunet-infer": minkunet,
    }


def graph_cases(graph) -> dict:
    from relconv.graph import RGCNConv, build_rgcn_map

    edge_index, edge_type, n, r = graph
    conv = RGCNConv(C, C, r, aggr="mean").cuda()
    xs = feature_copies(n, C, torch.float32)
    graph_map = build_rgcn_map(edge_index, edge_type, n, r, "mean")

    @torch.no_grad()
    def layer():
        return conv(next(xs), graph_map)

    return {"rgcn-layer": layer}


def main() -> None:
    from benchmarks.workloads.graphs import make_kg

    scene = load_scene("scan64", torch.device("cuda"))
    ei, et, n, r, _ = make_kg("AIFB", seed=0)
    report("relconv", voxel_cases(scene) | graph_cases((ei.cuda(), et.cuda(), n, r)))


if __name__ == "__main__":
    main()
