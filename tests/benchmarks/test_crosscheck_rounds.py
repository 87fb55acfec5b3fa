"""Cross-check aggregation over alternating rounds (CPU; the cross-check itself needs a GPU)."""

from benchmarks import crosscheck as cc

CASE = cc.CASES["subm3-cached"]


def _row(latency, status="ok"):
    queued = None if latency is None else latency / 2
    return dict(case=CASE, impl="relconv", status=status, latency_ms=latency, throughput_ms=queued)


def test_medians_spreads_and_flags():
    harness = cc.harness_medians([[_row(1.0)], [_row(3.0)], [_row(2.0)], [_row(None, "error: x")]])
    twins = cc.twin_medians(
        [{"relconv": {"subm3-cached": {"latency_ms": v, "throughput_ms": v / 2}}} for v in (1.5, 1.5)]
    )
    (pair,) = cc.pair_rows(harness, twins)
    assert pair["rounds"] == 3 and pair["latency_ms"] == 2.0 and pair["latency_spread"] == 3.0
    assert pair["standalone_latency_ms"] == 1.5 and pair["standalone_latency_spread"] == 1.0
    assert abs(pair["latency_ratio"] - 2.0 / 1.5) < 1e-12 and pair["flag"] == "latency, throughput"
    assert "(x3.00)" in cc.markdown([pair], {"rounds": 3})


def test_a_twin_that_failed_in_any_round_reports_its_error():
    ok = {"relconv": {"subm3-cached": {"latency_ms": 1.0, "throughput_ms": 0.5}}}
    failed = {"relconv": {"error": {"error": "RuntimeError: boom"}}}
    assert cc.twin_medians([ok, failed])["relconv"] == failed["relconv"]
