"""A fresh grid map per call (`relconv::grid_conv_map`, the map of spconv's and TorchSparse's
strided layers) on real scenes: per-call latency, queued time, GPU time and CUDA API calls of one
strided 3^3 map at each level. A profiling aid for the map build, not a benchmark.

    python -m benchmarks.grid_map [--scenes NAME,...] [--strides 1,2] [--runs 30]

A level's sites are the scene's at that tensor stride (`benchmarks.workloads.voxels.at_stride`); the map
is the dense conv's: kernel 3, stride 2, padding 1, onto the grid the sites span.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.harness.timing import TimingConfig, measure
from benchmarks.workloads.voxels import at_stride, load_scene

SCENES = "batch4-64beam,room-3cm,aggregate-1m"


def profile_once(fn) -> tuple[float, int]:
    """(GPU µs, CUDA API calls) of one `fn()`, after the caller's warm-up; the calls include the
    closing synchronize."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.events()
    gpu = sum(e.device_time for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    host = torch.autograd.DeviceType.CPU
    calls = sum(1 for e in events if e.device_type == host and e.name.startswith("cuda"))
    return gpu, calls


def grid_args(coords: torch.Tensor) -> tuple:
    """grid_conv_map's arguments for the strided 3^3 map of `coords` ([N, 4] int32) on its grid."""
    shape = [int(v) + 1 for v in coords[:, 1:].amax(0).tolist()]
    batch = int(coords[:, 0].max()) + 1
    out_shape = [(e + 2 - 3) // 2 + 1 for e in shape]
    return coords, batch, shape, out_shape, [3] * 3, [2] * 3, [1] * 3, [1] * 3, False


def main() -> None:
    import relconv  # noqa: F401  (registers the op)

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenes", default=SCENES)
    p.add_argument("--strides", default="1,2", help="levels: the scenes' sites at these tensor strides")
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()
    op = torch.ops.relconv.grid_conv_map.default
    print(torch.cuda.get_device_name(), "- grid_conv_map, kernel 3, stride 2, padding 1")
    print("scene stride rows grid -> sites | latency us | queued us | GPU us | CUDA API calls")
    for name in args.scenes.split(","):
        scene = load_scene(name, torch.device("cuda")).coords.int()
        for stride in (int(s) for s in args.strides.split(",")):
            call = grid_args(at_stride(scene, stride).int().contiguous())
            wall = measure(lambda a: op(*a), [call], torch.device("cuda"), TimingConfig(runs=args.runs))
            gpu, api = profile_once(lambda c=call: op(*c))
            sites = op(*call)[0].shape[0]
            print(
                f"{name:16s} {stride} {len(call[0]):8d} {call[1]}x{call[2]} -> {sites:8d} | "
                f"{wall.latency_ms * 1e3:7.1f} | {wall.throughput_ms * 1e3:7.1f} | {gpu:7.1f} | {api}",
                flush=True,
            )


if __name__ == "__main__":
    main()
