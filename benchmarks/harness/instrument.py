"""Host synchronisations, kernel launches and GPU time of one call, from torch.profiler.

A whole network that waits on the host shows it here before it shows in a time: every
`.item()`, `.tolist()` or sizing step costs a stream synchronisation, and every small torch op a
launch. Counted over one call of the timed function (after warm-up, so autotuners are done):
- kernel_launches: GPU kernels that ran (CUPTI kernel activity; counts launches made through the
  runtime or the driver API alike, which matters for spconv's cumm kernels);
- host_syncs: CUDA runtime calls that block the host until the device catches up (stream, device
  and event synchronisation, and synchronous memcpy), and relconv's waits for a published word;
- gpu_ms: the device time of the call's kernels, memcpys and memsets (CUPTI activity durations),
  the median over PROFILED_CALLS calls. It does not depend on the host's speed: what the call
  costs the GPU, which the queued throughput approaches when the host keeps the GPU fed. On a
  shared host whose speed swings between runs it is the stable figure to compare libraries by.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

import torch

# A profile leaves CUPTI attached to its process, and every later CUDA call and autograd backward
# pays for it: on an H100 host a cached subm 3^3 C64 fp16 forward + backward went from ~190-250 us
# per step to 320-510 us after one profiled call, a one-node backward from ~100-170 to 140-340 us.
# So benchmarks.run profiles in a process of its own, after the timings (bench.PHASE): profiling
# each case right after timing it would time every case but the first of a process with CUPTI
# attached, the host-bound ones (relconv's most) hurt the most.

SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        # relconv's coordinate checks wait for an error word a kernel publishes to pinned host
        # memory, with no CUDA call; the wait is recorded under this name.
        "relconv::wait_published_word",
    }
)


PROFILED_CALLS = 3


def _profile_one_call(fn: Callable[[object], object], inp: object, device: torch.device) -> tuple:
    """(sync calls, kernel launches, GPU µs, {kernel: [launches, GPU µs]}) seen while profiling one
    `fn(inp)`; the sync count includes the profiler's own (see `_profiler_syncs`)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(inp)
        torch.cuda.synchronize(device)  # so that the call's GPU work is inside the profile
    syncs = launches = 0
    gpu_us = 0.0
    kernels: dict[str, list] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            gpu_us += ev.device_time
            entry = kernels.setdefault(ev.name, [0, 0.0])
            entry[0] += 1
            entry[1] += ev.device_time
            if not ev.name.startswith(("Memcpy", "Memset")):
                launches += 1
        elif ev.name in SYNC_CALLS:
            syncs += 1
    return syncs, launches, gpu_us, kernels


@functools.cache
def _profiler_syncs(device: torch.device) -> int:
    """Sync calls seen while profiling a call that makes none: the explicit synchronize above plus
    whatever the profiler itself issues (it varies between torch versions). Subtracted, so that a
    call that never waits on the device counts 0."""
    return _profile_one_call(lambda _: None, None, device)[0]


def profile_call(fn: Callable[[object], object], inp: object, device: torch.device, top: int = 0) -> dict:
    """{"host_syncs", "kernel_launches"} of the first of PROFILED_CALLS calls of `fn(inp)` and
    their median "gpu_ms"; None values off CUDA. With `top`, also "top_kernels": that first call's
    `top` kernels by GPU time, as [name, launches, GPU µs]."""
    if device.type != "cuda":
        return {"host_syncs": None, "kernel_launches": None, "gpu_ms": None}
    calls = [_profile_one_call(fn, inp, device) for _ in range(PROFILED_CALLS)]
    row = {
        "host_syncs": max(0, calls[0][0] - _profiler_syncs(device)),
        "kernel_launches": calls[0][1],
        "gpu_ms": statistics.median(c[2] for c in calls) / 1e3,
    }
    if top:
        ranked = sorted(calls[0][3].items(), key=lambda kv: -kv[1][1])[:top]
        row["top_kernels"] = [[name, n, round(us, 1)] for name, (n, us) in ranked]
    return row
