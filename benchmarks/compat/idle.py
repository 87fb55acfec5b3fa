"""Where a compat backbone's call leaves the GPU idle: consecutive calls under torch.profiler (two
warm-up steps of the profiler's schedule take its buffer requests), each call's GPU busy time (the
union of its kernels, memcpys and memsets), its idle gaps and the host ops running in the largest,
next to the median synchronised time of the same call without the profiler. A profiling aid (is a
call GPU-bound or host-bound, and where does the host make the GPU wait), not a benchmark.

    python -m benchmarks.compat.idle BACKBONE LIBRARY PHASE DTYPE [--calls 4] [--gaps 6]

LIBRARY is `shim`, `native` or `real` (the real library after `source benchmarks/peers/activate.sh`),
PHASE `inference` or `training`, DTYPE `fp32` or `fp16`; the call is `speed.py`'s.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.compat import backbones as bb
from benchmarks.compat import child, scenes
from benchmarks.harness.timing import TimingConfig, latencies_ms, warm_up

WARMUP_STEPS = 2


def _busy_and_gaps(
    intervals: list[tuple[float, float]], start: float
) -> tuple[float, list[tuple[float, float]]]:
    """The union's length of sorted (start, end) `intervals` from `start`, and the gaps between them."""
    busy, gaps, reached = 0.0, [], start
    for s, e in intervals:
        if s > reached:
            gaps.append((reached, s))
        busy += max(0.0, e - max(s, reached))
        reached = max(reached, e)
    return busy, gaps


def _gpu_intervals(events) -> list[tuple[float, float]]:
    """Sorted (start, end) of the kernels, memcpys and memsets among profiler `events`. A
    `record_function` range also appears on the device, as an annotation spanning its first to last
    GPU work; counting it as work would fill every gap it covers."""
    device = torch.autograd.DeviceType.CUDA
    return sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == device and not e.is_user_annotation
    )


def _timed_then_profiled(fn, inputs, device, calls: int):
    """The median synchronised latency of `fn` (the harness's warm-up and per-call timing), then a
    profile of `calls` more calls after the schedule's warm-up steps."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    config = TimingConfig()
    start = warm_up(fn, inputs, device, config)
    latency = statistics.median(latencies_ms(fn, inputs, device, config.runs, start=start))
    steps = schedule(wait=0, warmup=WARMUP_STEPS, active=calls)
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=steps, acc_events=True
    ) as prof:
        for i in range(WARMUP_STEPS + calls):
            with record_function(f"call {i}"):
                fn(inputs[i % len(inputs)])
            torch.cuda.synchronize(device)
            prof.step()
    return latency, prof


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("backbone", choices=sorted(bb.BACKBONES))
    p.add_argument("library", choices=("shim", "native", "real"))
    p.add_argument("phase", choices=("inference", "training"))
    p.add_argument("dtype", choices=("fp32", "fp16"))
    p.add_argument("--calls", type=int, default=4, help="profiled calls")
    p.add_argument("--gaps", type=int, default=6, help="largest gaps listed per call")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.compat.idle needs a CUDA GPU")
    backbone = bb.BACKBONES[args.backbone]
    voxels = scenes.load(backbone.scene, tiny=False)
    side = child.Side(backbone, args.library, bb.DEFAULT_DOWNSTREAM, voxels, torch.device("cuda"))
    latency, prof = child.in_case(
        side,
        args.dtype,
        args.phase,
        lambda fn, inputs, device: _timed_then_profiled(fn, inputs, device, args.calls),
    )
    name = f"{args.backbone} {args.library} {args.phase} {args.dtype}"
    print(f"{name}: synchronised call, median of {TimingConfig.runs}: {latency:.2f} ms")
    events = prof.events()
    gpu = _gpu_intervals(events)
    host = [e for e in events if e.device_type != torch.autograd.DeviceType.CUDA]
    calls = sorted((e for e in host if e.name.startswith("call ")), key=lambda e: e.time_range.start)
    for k, call in enumerate(calls):
        t0 = call.time_range.start
        t1 = calls[k + 1].time_range.start if k + 1 < len(calls) else float("inf")
        mine = [g for g in gpu if t0 <= g[0] < t1]
        busy, gaps = _busy_and_gaps(mine, t0)
        end = max([e for _, e in mine] + [call.time_range.end])
        print(
            f"  {call.name}: {(end - t0) / 1e3:.2f} ms to its last GPU work, GPU busy {busy / 1e3:.2f} ms,"
            f" idle {sum(b - a for a, b in gaps) / 1e3:.2f} ms in {len(gaps)} gaps"
        )
        for a, b in sorted(gaps, key=lambda g: g[0] - g[1])[: args.gaps]:
            mid = (a + b) / 2
            ops = {e.name for e in host if e.time_range.start <= mid <= e.time_range.end and e is not call}
            print(f"    at {(a - t0) / 1e3:6.2f} ms idle {(b - a) / 1e3:.3f} ms  {sorted(ops, key=len)[:5]}")


if __name__ == "__main__":
    main()
