"""Micro-benchmark of kernel-map builds: subm 3^3 and down 2^3 on the synthetic 64-beam scan.

Builds each map from scratch per call (fresh coordinate index, nothing cached) and reports, per case:
median ms over the runs, queued (runs back to back, one event pair around them all / runs) and
per call (synchronised after each call), plus the host synchronisations one build performs.
Checks the CUDA map against the torch (CPU) reference before timing.

    python benchmarks/voxel/bench_maps.py [--runs 50] [--warmup 10] [--voxel-size 0.05]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from relconv.voxel import kernel_map as km
from relconv.voxel import voxelize
from relconv.voxel.synthetic import raycast_scan

ONE = (1, 1, 1)


def count_syncs(fn) -> int:
    """Host synchronisations of one call, counted by the sync-debug hook (warnings, not errors)."""
    import warnings

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def time_ms(fn, runs: int, warmup: int) -> tuple[float, float]:
    """(queued ms per call, median per-call ms) with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    torch.cuda.synchronize()
    queued = start.elapsed_time(end) / runs
    per_call = []
    for _ in range(runs):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end))
    return queued, statistics.median(per_call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--voxel-size", type=float, default=0.05)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_maps needs a CUDA GPU")
    points, _ = raycast_scan(beams=64, seed=0)
    coords = voxelize(torch.from_numpy(points).cuda(), args.voxel_size).tensor.coords
    cpu = coords.cpu()
    print(f"scan: {coords.shape[0]} voxels at {args.voxel_size} m, {torch.cuda.get_device_name()}")

    validated = km.CoordIndex(coords)
    validated.ensure_valid()
    cases = {
        # Fresh coordinates: hash build and validation read included (the first map of a scan).
        "subm 3^3 (new coords)": lambda c: km.submanifold_map(c, (3, 3, 3), ONE, ONE),
        # Coordinates validated (and hashed) by an earlier map of the same scan: no host sync.
        "subm 3^3 (validated coords)": lambda c: km.submanifold_map(c, (3, 3, 3), ONE, ONE, index=validated),
        # One sync to size the coarse output (the input's validation rides along).
        "down 2^3 (new coords)": lambda c: km.strided_map(c, (2, 2, 2), (2, 2, 2), ONE, ONE)[0],
    }

    ref_sub = km.submanifold_map(cpu, (3, 3, 3), ONE, ONE)
    ref_down, _ = km.strided_map(cpu, (2, 2, 2), (2, 2, 2), ONE, ONE)
    for name, build in cases.items():
        rmap = build(coords)
        ref = ref_down if name.startswith("down") else ref_sub
        if rmap.num_pairs != ref.num_pairs or not torch.equal(rmap.rel_ptr.cpu(), ref.rel_ptr):
            raise SystemExit(f"{name}: CUDA map disagrees with the torch reference")
        syncs = count_syncs(lambda b=build: b(coords))
        queued, per_call = time_ms(lambda b=build: b(coords), args.runs, args.warmup)
        print(f"{name:30s} queued {queued:7.3f} ms  per call {per_call:7.3f} ms  host syncs {syncs}")


if __name__ == "__main__":
    main()
