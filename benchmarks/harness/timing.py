"""Timing and peak-memory measurement shared by every suite.

GPU: one pair of CUDA events per run, medians over runs, warm-up by count *and* by time so that
peers' autotuners (spconv, WarpConvNet) finish before the first timed run. Inputs are rotated
through several copies so the L2 cache never holds the previous run's data. CPU: perf_counter.
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


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    runs: int
    peak_mem_mib: float | None


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


def measure(
    fn: Callable[[object], object],
    inputs: Sequence[object],
    device: torch.device,
    config: TimingConfig,
) -> Timing:
    """Median time of `fn(inputs[i % len(inputs)])` after warm-up; `fn` must do the whole case.

    The result of each call is dropped right away so that fwd+bwd graphs are freed between runs.
    """
    n = len(inputs)
    start = time.perf_counter()
    i = 0
    while i < config.warmup_runs or time.perf_counter() - start < config.warmup_seconds:
        fn(inputs[i % n])
        i += 1
        if i % 4 == 0:
            _sync(device)
    _sync(device)
    peak = peak_extra_memory_mib(fn, inputs[0], device)

    times: list[float] = []
    if device.type == "cuda":
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(config.runs)
        ]
        for r, (a, b) in enumerate(events):
            a.record()
            fn(inputs[(i + r) % n])
            b.record()
        torch.cuda.synchronize(device)
        times = [a.elapsed_time(b) for a, b in events]
    else:
        for r in range(config.runs):
            t0 = time.perf_counter()
            fn(inputs[(i + r) % n])
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return Timing(
        median_ms=statistics.median(times),
        p20_ms=_percentile(times, 0.2),
        p80_ms=_percentile(times, 0.8),
        runs=len(times),
        peak_mem_mib=peak,
    )
