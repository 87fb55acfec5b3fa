"""Where a compat backbone's call leaves the GPU idle: consecutive calls under torch.profiler (two
warm-up steps of the profiler's schedule take its buffer requests), each call's GPU busy time (the
union of its kernels, memcpys and memsets), its idle gaps and the host ops running in the largest,
next to the median synchronised time of the same call without the profiler. A profiling aid (is a
call GPU-bound or host-bound, and where does the host make the GPU wait), not a benchmark.

    python -m benchmarks.compat.idle BACKBONE LIBRARY PHASE DTYPE [--calls 4] [--gaps 6] [--top 8]
                                     [--stack]

LIBRARY is `shim`, `native` or `real` (the real library after `source benchmarks/peers/activate.sh`),
PHASE `inference` or `training`, DTYPE `fp32` or `fp16`; the call is `speed.py`'s. Each call's idle
time is also summed by what the host was running in the middle of each gap: the innermost host
event there, or, where the host ran Python between ops, the next op it started ("before ...").
`--stack` records Python frames too (`with_stack`, which slows the host further): as host events
of their own, or as each op's stack, which torch version by version does; a stack's innermost
frame of relconv's, the harness's or the backbone's own code is added to the op's name. Either way
a gap names the code that kept the GPU waiting.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.compat import backbones as bb
from benchmarks.compat import child, scenes
from benchmarks.compat.host_split import package_path
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


def _innermost(host: list, t: float, skip) -> str:
    """What the host ran at time `t`: the shortest host event running then (other than `skip`), or
    else "before " the next one to start ("-" after the last), each named by `_named`."""
    best, length, following = None, float("inf"), None
    for e in host:
        r = e.time_range
        if e is skip or e.name.startswith("ProfilerStep"):
            continue
        if r.start <= t <= r.end and r.end - r.start < length:
            best, length = e, r.end - r.start
        elif r.start > t and (following is None or r.start < following.time_range.start):
            following = e
    if best is not None:
        return _named(best)
    return "before " + _named(following) if following is not None else "-"


def _named(event) -> str:
    """A host event's name, with the innermost frame of its recorded Python stack (`--stack`) that
    lies outside torch: the code of relconv, of the harness or of the backbone that ran it."""
    for frame in getattr(event, "stack", None) or ():
        own = _code_path(frame.partition("(")[0])
        if own and own[0] != "torch":
            return f"{_short(event.name)} from {_short(frame)}"
    return _short(event.name)


def _short(name: str) -> str:
    """A profiler event name or stack frame with its Python file's path
    (`/.../relconv/voxel/conv.py(123): f`) cut as `_code_path` cuts it."""
    path, paren, rest = name.partition("(")
    inner = _code_path(path) if paren else None
    return "/".join(inner) + paren + rest if inner else name


def _code_path(path: str) -> list[str] | None:
    """A Python file's path from its package root on (host_split's `package_path`), or a backbone's
    (benchmarks/compat's downstream snapshots) from its repository on; None for other files."""
    parts = path.split("/")
    return parts[parts.index("downstream") + 1 :] if "downstream" in parts else package_path(path)


def _timed_then_profiled(fn, inputs, device, calls: int, stack: bool = False):
    """The median synchronised latency of `fn` (the harness's warm-up and per-call timing), then a
    profile of `calls` more calls after the schedule's warm-up steps."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    config = TimingConfig()
    start = warm_up(fn, inputs, device, config)
    latency = statistics.median(latencies_ms(fn, inputs, device, config.runs, start=start))
    steps = schedule(wait=0, warmup=WARMUP_STEPS, active=calls)
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=steps,
        acc_events=True,
        with_stack=stack,
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
    p.add_argument("--top", type=int, default=8, help="host events listed in each call's idle summary")
    p.add_argument("--stack", action="store_true", help="record Python frames (with_stack)")
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
        lambda fn, inputs, device: _timed_then_profiled(fn, inputs, device, args.calls, args.stack),
    )
    name = f"{args.backbone} {args.library} {args.phase} {args.dtype}"
    print(f"{name}: synchronised call, median of {TimingConfig.runs}: {latency:.2f} ms")
    events = prof.events()
    gpu = _gpu_intervals(events)
    host = [e for e in events if e.device_type != torch.autograd.DeviceType.CUDA]
    calls = sorted((e for e in host if e.name.startswith("call ")), key=lambda e: e.time_range.start)
    for k, call in enumerate(calls):
        t1 = calls[k + 1].time_range.start if k + 1 < len(calls) else float("inf")
        print("\n".join(call_report(call, t1, gpu, host, args.gaps, args.top)))


def call_report(call, t1: float, gpu: list, host: list, largest: int, top: int) -> list[str]:
    """Lines on one profiled `call` (its host range event; the next call starts at `t1`): its GPU
    busy and idle time, its `largest` gaps and what the host ran in each, and its idle time summed
    by that host event (the `top` largest)."""
    t0 = call.time_range.start
    mine = [g for g in gpu if t0 <= g[0] < t1]
    busy, gaps = _busy_and_gaps(mine, t0)
    end = max([e for _, e in mine] + [call.time_range.end])
    lines = [
        f"  {call.name}: {(end - t0) / 1e3:.2f} ms to its last GPU work, GPU busy {busy / 1e3:.2f} ms,"
        f" idle {sum(b - a for a, b in gaps) / 1e3:.2f} ms in {len(gaps)} gaps"
    ]
    mine_host = [e for e in host if e.time_range.end >= t0 and e.time_range.start < end]
    named = [(a, b, _innermost(mine_host, (a + b) / 2, call)) for a, b in gaps]
    for a, b, name in sorted(named, key=lambda g: g[0] - g[1])[:largest]:
        lines.append(f"    at {(a - t0) / 1e3:6.2f} ms idle {(b - a) / 1e3:.3f} ms  host in {name}")
    by_host: dict[str, float] = {}
    for a, b, name in named:
        by_host[name] = by_host.get(name, 0.0) + (b - a)
    lines.append("    idle ms by what the host ran mid-gap:")
    for name, us in sorted(by_host.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"      {us / 1e3:7.3f}  {name}")
    return lines


if __name__ == "__main__":
    main()
