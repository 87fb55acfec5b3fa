"""The table-sort rule (relconv.ops.map_views.SORT_WORK) against measurement: for each scene and
width, a fresh subm 3^3 layer with its table left unsorted and sorted in the call (GPU time per call
from the profiler, latency and queued time), which of the two the rule picks and which is faster;
then the order op's own kernels per scene. A calibration aid, not a benchmark.

    python -m benchmarks.sort_rule [--scenes NAME,...] [--channels 32,64,128] [--dtype fp16|fp32]
        [--stride S]

`--dtype fp32` runs exact fp32 (TF32 off), whose narrow layers take the SIMT table kernels;
`--stride S` takes each scene's sites at tensor stride S (coordinates floor-divided, duplicates
merged), the level of a network after its strided convs.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.harness.floor import DTYPES
from benchmarks.harness.prepare import set_tf32
from benchmarks.harness.timing import TimingConfig, measure
from benchmarks.profile_voxel import kernel_times
from benchmarks.workloads.voxels import at_stride, load_scene

SCENES = (
    "scan-64beam,batch4-64beam,room-3cm,room-5cm,airborne-100m-25cm,object-128,object-256,"
    "aggregate-0.5m,aggregate-1m"
)


def fresh_layer_times(conv, feats, coords, threshold: float) -> tuple[float, float, float]:
    """(GPU us, latency ms, queued ms) of `conv` over a map built in each call, with SORT_WORK at
    `threshold`: the profiler's kernel time, and the harness's median latency and queued time."""
    from relconv.ops import map_views
    from relconv.voxel import VoxelTensor

    rule, map_views.SORT_WORK = map_views.SORT_WORK, threshold
    try:
        with torch.no_grad():

            def call():
                return conv(VoxelTensor(feats, coords))

            wall = measure(lambda _: call(), [None], feats.device, TimingConfig(runs=30))
            return sum(t for _, t in kernel_times(call).values()), wall.latency_ms, wall.throughput_ms
    finally:
        map_views.SORT_WORK = rule


def order_op_times(coords) -> dict[str, tuple[int, float]]:
    from relconv.voxel import submanifold_map

    table = submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1)).neighbor_table()
    return kernel_times(lambda: torch.ops.relconv.neighbor_table_order(table))


def main() -> None:
    from relconv.ops import map_views
    from relconv.voxel import Conv3d

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenes", default=SCENES)
    p.add_argument("--channels", default="32,64,128")
    p.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16")
    p.add_argument("--stride", type=int, default=1, help="the scenes' sites at this tensor stride")
    args = p.parse_args()
    if args.stride < 1:
        p.error(f"--stride must be at least 1, got {args.stride}")
    dtype = DTYPES[args.dtype]
    set_tf32(False)  # fp32 is exact fp32
    rule = map_views.SORT_WORK
    print(
        torch.cuda.get_device_name(),
        f"{args.dtype}, stride {args.stride}: tables sorted once their forwards reach SORT_WORK = {rule:.1e}",
    )
    print("scene rows C rule work | GPU us unsorted / sorted | latency us | queued us | picked | faster")
    for name in args.scenes.split(","):
        coords = at_stride(load_scene(name, torch.device("cuda")).coords, args.stride)
        for c in (int(v) for v in args.channels.split(",")):
            feats = torch.randn(len(coords), c, device="cuda", dtype=dtype)
            conv = Conv3d(c, c, 3).cuda().to(dtype).eval()
            work = map_views.table_work(len(coords), conv.weight) * map_views.sort_weight(dtype)
            unsorted, in_order = (fresh_layer_times(conv, feats, coords, t) for t in (float("inf"), 0.0))
            (gu, lu, qu), (gs, ls, qs) = unsorted, in_order
            picks = "sorted" if work >= rule else "unsorted"
            faster = "sorted" if gs < gu else "unsorted"
            print(
                f"{name:20s} {len(coords):8d} {c:5d} {work:8.2e} | {gu:8.1f} / {gs:8.1f} | {lu * 1e3:5.0f} / "
                f"{ls * 1e3:5.0f} | {qu * 1e3:5.0f} / {qs * 1e3:5.0f} | {picks:8s} {faster}",
                flush=True,
            )
        ops = order_op_times(coords)
        print(
            "   order op:",
            ", ".join(f"{k[:48]} {t:.1f}" for k, (_, t) in sorted(ops.items(), key=lambda kv: -kv[1][1])),
            flush=True,
        )


if __name__ == "__main__":
    main()
