"""The one JSON row schema shared by run.py, crosscheck.py and the layer scripts.

Every row holds these fields (None where a field does not apply); suites add their case
description (suite, case, kind, workload, op, C, dtype, map, pass, ...).
"""

from __future__ import annotations

TIMING_FIELDS = ("latency_ms", "p20_ms", "p80_ms", "throughput_ms", "gpu_ms", "runs", "peak_mem_mib")
COUNT_FIELDS = ("host_syncs", "kernel_launches")
FLOOR_FIELDS = ("floor_ms", "x_floor", "bytes", "flops")
AGREEMENT_FIELDS = ("max_rel_err", "agrees_with")
ROW_FIELDS = (
    "case",
    "impl",
    "status",
    *TIMING_FIELDS,
    *COUNT_FIELDS,
    *FLOOR_FIELDS,
    *AGREEMENT_FIELDS,
    "note",
)


def empty_row(meta: dict, impl: str) -> dict:
    """A row of `meta` for `impl` with every schema field present and unset, status "ok"."""
    row = dict(meta, impl=impl, status="ok", note="")
    for name in ROW_FIELDS:
        row.setdefault(name, None)
    row["runs"] = 0
    return row


def time_ms(row: dict, metric: str = "latency") -> float | None:
    """A row's time in ms by metric ("latency" or "throughput"); rows written before latency and
    throughput were separate carry one `median_ms` (events around queued calls), used for both."""
    value = row.get(f"{metric}_ms")
    return value if value is not None else row.get("median_ms")
