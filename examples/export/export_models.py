"""Exports a relconv MinkUNet and an R-GCN to AOTInductor packages (.pt2) for run_pt2.cpp.

    python examples/export/export_models.py --device cpu --out build/export

For each model this writes <name>.pt2 (the compiled package) and <name>_io.pt (the example inputs
and the eager output, `[input_0, ..., expected]`, CPU tensors, read by run_pt2), checks the package
against eager in Python too, and prints eager and package timings on the same inputs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch._inductor import aoti_compile_and_package, aoti_load_package

from relconv.export import export_minkunet, export_rgcn, voxel_export_check
from relconv.graph import RGCNConv, build_rgcn_map
from relconv.voxel import VoxelTensor, voxelize
from relconv.voxel.models import MinkUNet
from relconv.voxel.nn import inference_folding
from relconv.voxel.synthetic import raycast_scan


class RGCN(torch.nn.Module):
    """Two RGCNConv layers (mean aggregation, ReLU between) over one graph's `RGCNMap`."""

    def __init__(self, channels: int, hidden: int, classes: int, relations: int) -> None:
        super().__init__()
        self.conv1 = RGCNConv(channels, hidden, relations)
        self.conv2 = RGCNConv(hidden, classes, relations)

    def forward(self, x, graph):
        return self.conv2(self.conv1(x, graph).relu(), graph)


def median_ms(fn, device: torch.device, iterations: int) -> float:
    times = []
    for i in range(iterations + 3):  # 3 warm-up runs
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def scene(device: torch.device, beams: int, voxel_size: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic LiDAR sweep voxelised to (x, y, z, intensity) features and int32 coordinates."""
    points, intensity = raycast_scan(beams=beams, seed=0)
    points = torch.from_numpy(points)
    feats = torch.cat([points, torch.from_numpy(intensity)[:, None]], 1)
    voxels = voxelize(points, voxel_size, feats=feats).tensor
    return voxels.feats.to(device), voxels.coords.to(device)


def package(name: str, ep, inputs: tuple, eager, device, out: str, iterations: int, load: bool) -> None:
    path = aoti_compile_and_package(ep, package_path=os.path.join(out, f"{name}.pt2"))
    with torch.no_grad():
        expected = eager()
        eager_ms = median_ms(eager, device, iterations)
    # Saved before the package is loaded here: run_pt2 needs only these two files.
    torch.save([t.cpu() for t in inputs] + [expected.cpu()], os.path.join(out, f"{name}_io.pt"))
    if not load:
        print(f"{name} ({device.type}): eager {eager_ms:.3f} ms; package written, not loaded in Python")
        return
    with torch.no_grad():
        compiled = aoti_load_package(path)
        got = compiled(*inputs)
        pt2_ms = median_ms(lambda: compiled(*inputs), device, iterations)
    diff = (got - expected).abs().max().item()
    ok = torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
    print(
        f"{name} ({device.type}): output {tuple(got.shape)}, max |pt2 - eager| = {diff:.3g}, "
        f"equal (1e-5): {'yes' if ok else 'NO'}; eager {eager_ms:.3f} ms, pt2 from Python {pt2_ms:.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="build/export")
    parser.add_argument("--beams", type=int, default=16, help="LiDAR beams of the MinkUNet example scene")
    parser.add_argument("--voxel-size", type=float, default=0.1, help="voxel edge of that scene, metres")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument(
        "--no-python-load",
        action="store_true",
        help="write the packages without loading them in this process (run them with run_pt2)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)

    model = MinkUNet(in_channels=4, num_classes=19, width=0.5).to(device).eval()
    feats, coords = scene(device, args.beams, args.voxel_size)
    voxel_export_check(coords)
    ep = export_minkunet(model, feats, coords)

    # A new VoxelTensor per call: eager builds the maps every call, as the exported program does.
    def eager_minkunet():
        # Eager's own inference path (BatchNorm folded into the convs).
        return model(VoxelTensor(feats, coords))

    def eager_unfolded():
        # The layers one by one, as exported: the reference for equality.
        with inference_folding(False):
            return model(VoxelTensor(feats, coords))

    package(
        "minkunet",
        ep,
        (feats, coords),
        eager_unfolded,
        device,
        args.out,
        args.iterations,
        not args.no_python_load,
    )
    with torch.no_grad():
        folded_ms = median_ms(eager_minkunet, device, args.iterations)
    print(f"minkunet ({device.type}): eager with BatchNorm folding {folded_ms:.3f} ms")

    relations = 8
    rgcn = RGCN(32, 64, 10, relations).to(device).eval()
    num_nodes, num_edges = 20_000, 200_000
    x = torch.randn(num_nodes, 32, device=device)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), device=device)
    edge_type = torch.randint(0, relations, (num_edges,), device=device)
    ep = export_rgcn(rgcn, x, edge_index, edge_type, relations)

    def eager_rgcn():
        # The graph's map built every call, as the exported program does (eager code that reuses
        # one graph caches it on edge_index: see the cached timing below).
        graph = build_rgcn_map(edge_index, edge_type, num_nodes, relations)
        return rgcn(x, graph)

    def eager_cached():
        h = rgcn.conv1(x, edge_index, edge_type).relu()
        return rgcn.conv2(h, edge_index, edge_type)

    package(
        "rgcn",
        ep,
        (x, edge_index, edge_type),
        eager_rgcn,
        device,
        args.out,
        args.iterations,
        not args.no_python_load,
    )
    with torch.no_grad():
        cached_ms = median_ms(eager_cached, device, args.iterations)
    print(f"rgcn ({device.type}): eager with the map cached on edge_index {cached_ms:.3f} ms")


if __name__ == "__main__":
    main()
