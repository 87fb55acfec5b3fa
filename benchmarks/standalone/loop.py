"""The twins' own timing loop: deliberately simple and independent of benchmarks.harness, so that a
harness defect cannot hide in both numbers of the cross-check.

latency: CUDA events around one call, synchronised after every call, median over `runs`;
throughput: `runs` calls queued between two events, total / runs. One input, reused (as a user's
loop over one scan does).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def time_call(fn: Callable[[], object], runs: int = 50, warmup: int = 20) -> dict:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(runs):
        start.record()
        fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end))
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    end.synchronize()
    return {"latency_ms": statistics.median(per_call), "throughput_ms": start.elapsed_time(end) / runs}


def report(name: str, results: dict[str, dict]) -> None:
    for case, r in results.items():
        print(
            f"{name:<12} {case:<16} latency {r['latency_ms']:8.3f} ms   queued {r['throughput_ms']:8.3f} ms"
        )
