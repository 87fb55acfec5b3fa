"""CPU smoke test of the benchmark harness on tiny sizes: rows, fields and agreement, never timings."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch_geometric")
pytest.importorskip("matplotlib")

from benchmarks import run  # noqa: E402
from benchmarks.harness.schema import ROW_FIELDS  # noqa: E402
from benchmarks.harness.tolerances import TOLERANCE  # noqa: E402

FIELDS = {"suite", "dtype", *ROW_FIELDS}
# A peer that cannot run here (CUDA-only wheels, CPU machine) says so; an adapter that crashes
# ("error") or disagrees ("mismatch") fails the test.
NOT_RUN = ("missing", "unsupported")


def _assert_no_errors(rows: list[dict]) -> None:
    bad = [r for r in rows if r["status"].split(":")[0] in ("error", "mismatch", "oom")]
    assert not bad, [(r["case"], r["impl"], r["status"], r.get("traceback", "")) for r in bad]


def _run(tmp_path, *args) -> dict:
    assert run.main(["--device", "cpu", "--tiny", "--runs", "2", "--out", str(tmp_path), *args]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert {"device", "torch", "relconv_commit", "peers", "ceilings"} <= set(data["environment"])
    return data


def test_graph_suite_agrees_with_pyg(tmp_path):
    data = _run(tmp_path, "--suite", "graph", "--peers", "pyg,dgl")
    rows = data["rows"]
    assert rows and all(FIELDS <= set(r) for r in rows)
    _assert_no_errors(rows)
    cases = {r["case"] for r in rows}
    assert any("/layer/" in c for c in cases) and any("/rgcn2/" in c for c in cases)
    for case in cases:
        by_impl = {r["impl"]: r for r in rows if r["case"] == case}
        assert by_impl["relconv"]["status"] == "ok", by_impl["relconv"]
        rc = by_impl["relconv"]
        assert rc["latency_ms"] > 0 and rc["throughput_ms"] > 0 and rc["p20_ms"] <= rc["p80_ms"]
        pyg = by_impl["pyg"]
        assert pyg["status"] == "ok" and pyg["agrees_with"] == "relconv", pyg
        assert pyg["max_rel_err"] <= TOLERANCE[pyg["dtype"]]
        if data["environment"]["peers"]["dgl"]["available"]:
            assert by_impl["dgl"]["status"] == "ok", by_impl["dgl"]
    assert (tmp_path / "speedup_graph_cpu_layer.png").exists() and (
        tmp_path / "floor_graph_cpu_layer.png"
    ).exists()


def test_voxel_suite_agrees_with_dense_conv(tmp_path):
    data = _run(
        tmp_path,
        "--suite",
        "voxel",
        "--peers",
        "spconv,warpconvnet,torchsparse",
        "--cases",
        "*/layer/*/fwd,*/map/*,*/e2e/*/infer/*",
    )
    rows = data["rows"]
    assert rows and all(FIELDS <= set(r) for r in rows)
    _assert_no_errors(rows)
    layer_cases = {r["case"] for r in rows if "/layer/" in r["case"]}
    assert {c.split("/")[4] for c in layer_cases} == {"subm3", "down2", "down3", "up2"}
    for case in layer_cases:
        by_impl = {r["impl"]: r for r in rows if r["case"] == case}
        assert by_impl["relconv"]["status"] == "ok", by_impl["relconv"]
        dense = by_impl["ref-dense"]
        assert dense["status"] == "reference" and dense["agrees_with"] == "relconv", dense
        assert dense["max_rel_err"] <= TOLERANCE["fp32"]
        assert by_impl["relconv"]["x_floor"] > 0
        # Peers are CUDA-only wheels: on a CPU machine they are reported, not failed.
        for peer in ("spconv", "warpconvnet", "torchsparse"):
            assert by_impl[peer]["status"].split(":")[0] in ("ok", *NOT_RUN), by_impl[peer]
    assert any(r["case"].endswith("/map/tiny/subm3") and r["status"] == "ok" for r in rows)
    assert any("/e2e/" in r["case"] and r["impl"] == "relconv" and r["status"] == "ok" for r in rows)
    # The layer-by-layer inference row is timed only after agreeing with the default (folded) network.
    unfolded = [r for r in rows if r["impl"] == "relconv-unfolded"]
    assert unfolded and all(r["status"] == "ok" and r["agrees_with"] == "relconv" for r in unfolded), unfolded
