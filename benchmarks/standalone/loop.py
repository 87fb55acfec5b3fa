"""The twins' own timing loop: deliberately simple and independent of benchmarks.harness, so that a
harness defect cannot hide in both numbers of the cross-check.

latency: CUDA events around one call, synchronised after every call, median over `runs`;
throughput: `runs` calls queued between two events, total / runs. A case is a call with no
arguments that feeds the library its next input: the features rotate through a few copies
(`feature_copies`), as a user's loop over a dataset never hands the same features twice, so the
L2 cache (50 MB on an H100, larger than one 64-beam scan's C64 fp16 features) does not keep the
previous call's input.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable

import torch

# Enough copies of a 64-beam scan's C64 fp16 features (9.6 MB each) to overflow an H100's L2 twice.
LAYER_COPIES = 8


def feature_copies(n: int, c: int, dtype: torch.dtype, count: int = LAYER_COPIES, seed: int = 0):
    """A cycle over `count` random [n, c] CUDA feature tensors (`next()` gives the next one)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    copies = [torch.randn(n, c, device="cuda", dtype=dtype, generator=gen) for _ in range(count)]
    return itertools.cycle(copies)


def time_block(fn: Callable[[], object], runs: int, warmup: int) -> dict:
    """{"latency_ms", "throughput_ms"} of `runs` calls after `warmup` untimed ones."""
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


def time_call(fn: Callable[[], object], runs: int = 50, warmup: int = 20) -> dict:
    """One long block: what a twin run on its own reports."""
    return time_block(fn, runs, warmup)


def report(name: str, cases: dict[str, Callable[[], object]]) -> None:
    """Times every case of a twin on its own and prints it."""
    for case, fn in cases.items():
        r = time_call(fn)
        print(
            f"{name:<12} {case:<16} latency {r['latency_ms']:8.3f} ms   queued {r['throughput_ms']:8.3f} ms"
        )
