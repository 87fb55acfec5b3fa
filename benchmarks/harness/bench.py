"""One case across implementations: agree with the reference first, then time (or, in the
instrument phase, profile one call of each).

A suite describes each implementation of a case as a `Prepared`: the function timed per run, the
rotated inputs it is fed, and a way to get a comparable output. The first implementation that
prepares successfully (relconv, when it can) is the reference; every other one is timed only after
its output agrees with the reference's, else its row says "mismatch". An implementation named
"ref-..." (e.g. a dense conv3d on a tiny grid) is only a reference: checked against, never timed.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchmarks.harness.floor import Ceilings
from benchmarks.harness.instrument import profile_call
from benchmarks.harness.schema import empty_row
from benchmarks.harness.timing import TimingConfig, measure, warm_up
from benchmarks.harness.tolerances import TOLERANCE

# Called with the implementation's name before each one is built and run (benchmarks.run records
# it next to the case in flight, so a native crash is attributed to relconv or to the peer).
ON_IMPL: Callable[[str], None] | None = None

# What run_case does per implementation: "time" (agreement check, then timing) or "instrument" (the
# profiler's counts only: host_syncs, kernel_launches, gpu_ms). benchmarks.run runs the two in
# separate processes: a profile leaves CUPTI attached to its process, and every CUDA call after it
# pays for that (see instrument.py).
PHASE = "time"


class Unsupported(Exception):
    """The implementation does not offer this case (reported as its status, not as an error)."""


class PeerMissing(Exception):
    """The peer library is not importable here (reported as "missing: <why>")."""


@dataclass
class Prepared:
    """An implementation ready to time.

    fn: one run of the case, taking one of `inputs`.
    inputs: rotated through so caches don't hold the previous run's data.
    output: returns `(key, values)`: `values` [M, C] rows of the case's result and `key` [M, k]
        integer row identities (coordinates) to align rows between implementations, or None when
        rows are already in the same order.
    held: a context manager factory entered once around the warm-up, the timed calls and the
        profiled ones: the state a user sets once before a loop (TF32 switches, a library's own
        precision switch), not per call. Entered per call, a generator context manager cost every
        implementation ~10-15 us of harness time per call, a large share of a host-bound case.
    """

    fn: Callable[[object], object]
    inputs: list
    output: Callable[[], tuple[torch.Tensor | None, torch.Tensor]]
    note: str = ""
    extra: dict = field(default_factory=dict)
    held: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


def _align(key: torch.Tensor | None, values: torch.Tensor, ref_key: torch.Tensor | None):
    """Rows of `values` in the order of `ref_key`; None when some reference row is missing."""
    if ref_key is None or key is None:
        return values
    k = key.long().cpu()
    rk = ref_key.long().cpu()
    lo = torch.minimum(k.min(0).values, rk.min(0).values)
    span = torch.maximum(k.max(0).values, rk.max(0).values) - lo + 1
    mult = torch.ones_like(span)
    for d in range(span.numel() - 2, -1, -1):
        mult[d] = mult[d + 1] * span[d + 1]
    flat, rflat = ((k - lo) * mult).sum(1), ((rk - lo) * mult).sum(1)
    order = torch.argsort(flat)
    pos = torch.searchsorted(flat[order], rflat).clamp(max=flat.numel() - 1)
    found = flat[order][pos] == rflat
    if not bool(found.all()):
        return None
    return values.cpu()[order[pos]]


def relative_error(values, ref_values) -> float:
    a = values.detach().double().cpu()
    b = ref_values.detach().double().cpu()
    if a.shape != b.shape:
        return float("inf")
    if b.numel() == 0:
        return 0.0
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def run_case(
    meta: dict,
    impls: list[tuple[str, Callable[[], Prepared]]],
    device: torch.device,
    timing: TimingConfig,
    ceilings: Ceilings,
    work: tuple[float, float] | None,
    tolerance: float | None = None,
) -> list[dict]:
    """Rows (one per implementation) for one case described by `meta` (must hold case and dtype).

    `tolerance` overrides the per-dtype relative tolerance (whole networks compare in fp32 with a
    looser bound than one layer)."""
    tol = TOLERANCE[meta["dtype"]] if tolerance is None else tolerance
    rows = []
    ref = None
    ref_name = None
    floor_ms = ceilings.floor_ms(work[0], work[1], meta["dtype"]) if work else None
    for name, build in impls:
        row = empty_row(meta, name)
        row.update(floor_ms=floor_ms, bytes=work[0] if work else None, flops=work[1] if work else None)
        if ON_IMPL is not None:
            ON_IMPL(name)
        try:
            prepared = build()
            row["note"] = prepared.note
            row.update(prepared.extra)
            if PHASE == "instrument":
                if not name.startswith("ref-"):
                    with prepared.held():
                        warm_up(prepared.fn, prepared.inputs, device, timing)  # autotuners first
                        row.update(profile_call(prepared.fn, prepared.inputs[0], device))
                rows.append(row)
                continue
            key, values = prepared.output()
            if ref is None:
                ref, ref_name = (key, values), name
            else:
                aligned = _align(key, values, ref[0])
                err = float("inf") if aligned is None else relative_error(aligned, ref[1])
                row["max_rel_err"], row["agrees_with"] = err, ref_name
                if not err <= tol:
                    row["status"] = "mismatch"
                    rows.append(row)
                    continue
            if name.startswith("ref-"):
                row["status"] = "reference"
                rows.append(row)
                continue
            with prepared.held():
                t = measure(prepared.fn, prepared.inputs, device, timing)
            row.update(
                latency_ms=t.latency_ms,
                p20_ms=t.p20_ms,
                p80_ms=t.p80_ms,
                throughput_ms=t.throughput_ms,
                runs=t.runs,
                peak_mem_mib=t.peak_mem_mib,
            )
            if floor_ms:
                # Against the queued time: the floor is device work, and queuing hides host work.
                row["x_floor"] = t.throughput_ms / floor_ms
            del prepared
        except Unsupported as err:
            row["status"] = f"unsupported: {err}"
        except PeerMissing as err:
            row["status"] = f"missing: {err}"[:300]
        except torch.cuda.OutOfMemoryError:
            row["status"] = "oom"
        except Exception as err:  # a peer's crash must not end the suite; the row carries it
            row["status"] = f"error: {type(err).__name__}: {err}"[:300]
            row["traceback"] = traceback.format_exc(limit=6)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
    return rows
