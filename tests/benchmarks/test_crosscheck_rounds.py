"""The cross-check's comparison of interleaved harness / twin blocks (CPU: synthetic block times;
the cross-check itself needs a GPU)."""

import random

import pytest

from benchmarks import crosscheck as cc

CASE = cc.CASES["subm3-cached"]


def _noisy(base: float, rounds: int, rng: random.Random, sigma: float = 0.08) -> list[float]:
    """Block times around `base` with log-normal host noise."""
    return [base * rng.lognormvariate(0.0, sigma) for _ in range(rounds)]


def test_a_genuine_gap_with_noise_and_outliers_is_flagged():
    rng = random.Random(0)
    harness = _noisy(1.3, 16, rng)
    twin = _noisy(1.0, 16, rng)
    # Bursts of host work hit a few blocks of either side hard.
    harness[3] *= 5.0
    twin[7] *= 4.0
    twin[11] *= 3.0
    c = cc.compare(harness, twin)
    assert c["flagged"]
    assert 1.2 < c["ratio"] < 1.4
    assert 1.15 < c["ratio_iqr"][0] <= c["ratio_iqr"][1] < 1.5
    assert c["harness_spread"] > 4  # the outlier shows in the spread, not in the ratio


def test_equal_timings_with_one_outlier_block_are_not_flagged():
    rng = random.Random(1)
    harness = _noisy(0.25, 16, rng, sigma=0.03)
    twin = _noisy(0.25, 16, rng, sigma=0.03)
    harness[5] *= 5.65  # the spread of the committed down2 fresh row, in one block
    c = cc.compare(harness, twin)
    assert not c["flagged"]
    assert abs(c["ratio"] - 1) < 0.1


def test_a_gap_in_the_other_direction_is_flagged_too():
    rng = random.Random(2)
    c = cc.compare(_noisy(0.75, 12, rng), _noisy(1.0, 12, rng))
    assert c["flagged"] and c["ratio"] < 0.8


def test_compare_rejects_unpaired_or_empty_blocks():
    with pytest.raises(ValueError, match="same non-zero number"):
        cc.compare([1.0, 1.0], [1.0])
    with pytest.raises(ValueError, match="same non-zero number"):
        cc.compare([], [])
    with pytest.raises(ValueError, match="positive"):
        cc.compare([1.0, 0.0], [1.0, 1.0])


def test_interleave_alternates_which_side_goes_first():
    order = []
    sides = {name: (lambda name=name: order.append(name) or {"latency_ms": 1.0}) for name in ("a", "b")}
    blocks = cc.interleave(sides, rounds=4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert {name: len(b) for name, b in blocks.items()} == {"a": 4, "b": 4}
    with pytest.raises(ValueError, match="rounds"):
        cc.interleave(sides, rounds=0)


def test_block_runs_scale_with_the_call_time():
    assert cc.block_runs(0.05) == cc.MAX_RUNS
    assert cc.block_runs(2.0) == 10
    assert cc.block_runs(35.0) == cc.MIN_RUNS
    assert cc.block_runs(None) == cc.MAX_RUNS


def _row():
    return dict(case=CASE, impl="relconv", status="ok", floor_ms=0.01, latency_ms=9.0, throughput_ms=9.0)


def test_pair_row_replaces_the_harness_times_by_block_medians_and_flags():
    blocks = {
        "harness": [{"latency_ms": v, "throughput_ms": v / 2} for v in (1.0, 3.0, 2.0)],
        "twin": [{"latency_ms": v, "throughput_ms": v / 2} for v in (1.5, 1.5, 1.5)],
    }
    pair = cc.pair_row(_row(), "standalone/relconv.py:subm3-cached", blocks, runs=20)
    assert pair["rounds"] == 3 and pair["runs"] == 60 and pair["block_runs"] == 20
    assert pair["latency_ms"] == 2.0 and pair["latency_spread"] == 3.0
    assert pair["standalone_latency_ms"] == 1.5 and pair["standalone_latency_spread"] == 1.0
    assert abs(pair["latency_ratio"] - 2.0 / 1.5) < 1e-12 and pair["flag"] == "latency, throughput"
    assert pair["p20_ms"] <= pair["latency_ms"] <= pair["p80_ms"]
    assert abs(pair["x_floor"] - 1.0 / 0.01) < 1e-9
    text = cc.markdown([pair], {"rounds": 3})
    assert "(x3.00)" in text and "1.33 [" in text and "latency, throughput |" in text


def test_a_pair_that_could_not_be_timed_says_why():
    row = dict(_row(), status="mismatch")
    pair = cc.unpaired_row(row, "standalone/relconv.py:subm3-cached", "mismatch")
    assert pair["flag"] == "mismatch" and pair["latency_ratio"] is None
    assert "| mismatch |" in cc.markdown([pair], {"rounds": 16})


def test_capturing_keeps_what_the_harness_timed_and_restores_the_hooks():
    from benchmarks import voxel_suite
    from benchmarks.harness import bench
    from benchmarks.harness.floor import Ceilings
    from benchmarks.harness.timing import TimingConfig

    spec = next(
        s for s in voxel_suite.case_specs(["cpu"], tiny=True) if s["kind"] == "layer" and s["map"] == "fresh"
    )
    before = bench.ON_IMPL, bench.measure
    store = {}
    ceilings = Ceilings(copy_bytes_per_s=1e10, gemm_flops_per_s={"fp32": 1e11})
    config = TimingConfig(warmup_runs=1, warmup_seconds=0.0, runs=2)
    with cc.capturing(store):
        rows = voxel_suite.run(spec, {}, {}, config, ceilings)
    assert (bench.ON_IMPL, bench.measure) == before
    assert [r["impl"] for r in rows if r["status"] == "ok"] == ["relconv"]
    fn, inputs = store["relconv"]
    assert fn(inputs[0]).shape[1] == spec["C"]
