"""Timing and peak-memory measurement shared by every suite.

Two numbers per case, because they answer different questions:
- latency: one call, then a device synchronisation, timed around call + sync. What a user waiting
  for one scan feels; host overheads (Python, launches, host syncs) count in full.
- throughput: `runs` calls queued back to back, one sync at the end, total / runs; the median of
  `queued_blocks` such blocks. Host work of call i overlaps GPU work of call i - 1, so a host-bound
  library looks better here than in latency. A median of blocks, because the GPU hosts stall a
  host thread now and then for 10-50 ms, in every library's loops (spconv's and relconv's alike,
  with Python's garbage collector on or off: benchmarks/README.md), and one stall in a single
  40-call block added up to a millisecond to every call's share.
Warm-up runs by count *and* by time so that peers' autotuners (spconv, WarpConvNet) finish before
the first timed run. Inputs are rotated through several copies so the L2 cache never holds the
previous run's data. GPU latency uses a CUDA event pair per call; CPU uses perf_counter.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TimingConfig:
    warmup_runs: int = 5
    warmup_seconds: float = 0.5
    runs: int = 20
    queued_blocks: int = 5


@dataclass(frozen=True)
class Timing:
    latency_ms: float  # median of per-call latencies (sync after every call)
    p20_ms: float
    p80_ms: float
    throughput_ms: float  # total time of `runs` queued calls / runs, median over queued_blocks
    runs: int
    peak_mem_mib: float | None

    @property
    def median_ms(self) -> float:
        """The median latency, under the name scripts outside the suites read."""
        return self.latency_ms


def _percentile(sorted_values: list[float], q: float) -> float:
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def rotation_count(bytes_per_input: int, device: torch.device, limit: int = 8) -> int:
    """How many input copies to rotate through so that they jointly exceed twice the L2 cache."""
    if device.type != "cuda" or bytes_per_input <= 0:
        return 2
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
    return max(2, min(limit, -(-2 * l2 // bytes_per_input)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_extra_memory_mib(fn: Callable[[object], object], inp: object, device: torch.device) -> float | None:
    """Memory one call needs beyond what was allocated before it (outputs, workspaces, maps)."""
    if device.type != "cuda":
        return None
    _sync(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn(inp)
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return (peak - base) / 2**20


def latencies_ms(
    fn: Callable[[object], object], inputs: Sequence[object], device: torch.device, runs: int, start: int = 0
) -> list[float]:
    """Per-call times with a synchronisation after every call (sorted)."""
    n = len(inputs)
    times: list[float] = []
    if device.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for r in range(runs):
            _sync(device)
            a.record()
            fn(inputs[(start + r) % n])
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    else:
        for r in range(runs):
            t0 = time.perf_counter()
            fn(inputs[(start + r) % n])
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)


def throughput_ms(
    fn: Callable[[object], object], inputs: Sequence[object], device: torch.device, runs: int, start: int = 0
) -> float:
    """Mean time per call of `runs` calls queued back to back (one sync at the end). On CUDA between
    two events, like the standalone twins' loop: a wall clock read around the final synchronisation
    would add its own latency to every call's share."""
    n = len(inputs)
    _sync(device)
    if device.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for r in range(runs):
            fn(inputs[(start + r) % n])
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / runs
    t0 = time.perf_counter()
    for r in range(runs):
        fn(inputs[(start + r) % n])
    return (time.perf_counter() - t0) * 1e3 / runs


def warm_up(
    fn: Callable[[object], object], inputs: Sequence[object], device: torch.device, config: TimingConfig
) -> int:
    """Runs `fn` for config.warmup_runs calls and at least config.warmup_seconds; returns the count."""
    n = len(inputs)
    start = time.perf_counter()
    i = 0
    while i < config.warmup_runs or time.perf_counter() - start < config.warmup_seconds:
        fn(inputs[i % n])
        i += 1
        if i % 4 == 0:
            _sync(device)
    _sync(device)
    return i


def measure(
    fn: Callable[[object], object],
    inputs: Sequence[object],
    device: torch.device,
    config: TimingConfig,
) -> Timing:
    """Latency (median, p20, p80) and throughput of `fn(inputs[i % len(inputs)])` after warm-up.

    `fn` must do the whole case. The result of each call is dropped right away so that fwd+bwd
    graphs are freed between runs.
    """
    i = warm_up(fn, inputs, device, config)
    peak = peak_extra_memory_mib(fn, inputs[0], device)
    times = latencies_ms(fn, inputs, device, config.runs, start=i)
    blocks = [
        throughput_ms(fn, inputs, device, config.runs, start=i + config.runs * (1 + b))
        for b in range(config.queued_blocks)
    ]
    queued = statistics.median(blocks)
    return Timing(
        latency_ms=statistics.median(times),
        p20_ms=_percentile(times, 0.2),
        p80_ms=_percentile(times, 0.8),
        throughput_ms=queued,
        runs=len(times),
        peak_mem_mib=peak,
    )
