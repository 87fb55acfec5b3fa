"""The generated tables of README.md and docs/performance.md match benchmarks/results/results.json,
and the comparison they print picks the peer that relconv beats by the least."""

import pytest

from benchmarks import tables


def _row(case: str, impl: str, latency: float, queued: float, status: str = "ok") -> dict:
    return {"case": case, "impl": impl, "status": status, "latency_ms": latency, "throughput_ms": queued}


def test_best_peer_is_the_lowest_speedup_over_latency_and_queued():
    rows = [
        _row("a", "relconv", 1.0, 1.0),
        _row("a", "spconv", 3.0, 1.5),  # 1.5x: queued is the less favourable ratio
        _row("a", "torchsparse", 2.0, 2.0),
        _row("a", "relconv-unfolded", 0.5, 0.5),  # relconv's own variant, never a peer
        _row("a", "pyg", 0.1, 0.1, status="mismatch"),  # disagreed with relconv: not timed against
        _row("b", "spconv", 1.0, 1.0),  # no relconv row: no comparison
    ]
    comps = tables.comparisons(rows)
    assert list(comps) == ["a"]
    assert comps["a"].peer["impl"] == "spconv"
    assert comps["a"].speedup == pytest.approx(1.5)


@pytest.mark.parametrize("doc", tables.DOCS, ids=lambda p: p.name)
def test_generated_blocks_match_the_results(doc):
    text = doc.read_text()
    assert "<!-- tables:headline -->" in text
    assert tables.render(text, tables.comparisons(tables.load())) == text, (
        f"{doc.name}'s tables are stale: run python -m benchmarks.tables"
    )


def test_an_unknown_block_is_an_error():
    with pytest.raises(ValueError, match="unknown table block 'nope'"):
        tables.render("<!-- tables:nope -->\nx\n<!-- /tables:nope -->", {})


def test_a_row_from_another_card_names_it(monkeypatch):
    monkeypatch.setattr(tables, "_main_gpu", lambda: "NVIDIA H100 80GB HBM3")
    row = {"suite": "graph", "kind": "layer", "C": 16, "aggr": "add", "dtype": "fp32", "map": "fresh"}
    row |= {"pass": "fwd", "graph": "AIFB"}
    assert tables.label(row | {"gpu": "NVIDIA H200"}).endswith("(AIFB, H200)")
    assert tables.label(row | {"gpu": "NVIDIA H100 80GB HBM3"}).endswith("(AIFB)")
    assert tables.label(row).endswith("(AIFB)")  # rows of an unmerged run carry no card
