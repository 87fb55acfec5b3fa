"""benchmarks.merge: later runs replace a case's rows, and a merged directory's runs stay one flat list."""

import json

from benchmarks import merge


def _write(path, env, rows, args):
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps({"environment": env, "args": args, "rows": rows}))


def _row(case, impl, ms):
    row = {"case": case, "impl": impl, "status": "ok", "latency_ms": ms, "throughput_ms": ms}
    return dict(row, suite="voxel", kind="layer")


def test_merging_into_a_merged_directory_extends_its_runs(tmp_path):
    env = {"device": "cpu", "peers": {}}
    _write(tmp_path / "a", env, [_row("x", "relconv", 1.0), _row("y", "relconv", 2.0)], {"out": "a"})
    _write(tmp_path / "b", env, [_row("y", "relconv", 3.0)], {"out": "b"})
    merged = tmp_path / "merged"
    assert merge.main(["--out", str(merged), str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    _write(tmp_path / "c", env, [_row("x", "relconv", 4.0)], {"out": "c"})
    assert merge.main(["--out", str(merged), str(merged), str(tmp_path / "c")]) == 0
    data = json.loads((merged / "results.json").read_text())
    assert [r["dir"] for r in data["environment"]["runs"]] == [str(tmp_path / d) for d in "abc"]
    assert all("runs" not in r["environment"] for r in data["environment"]["runs"])
    assert data["args"]["merged_from"] == [str(tmp_path / d) for d in "abc"]
    assert {r["case"]: r["latency_ms"] for r in data["rows"]} == {"x": 4.0, "y": 3.0}


def test_rows_keep_the_card_they_ran_on(tmp_path):
    _write(tmp_path / "a", {"device": "NVIDIA H100", "peers": {}}, [_row("x", "relconv", 1.0)], {"out": "a"})
    _write(tmp_path / "b", {"device": "NVIDIA H200", "peers": {}}, [_row("y", "relconv", 2.0)], {"out": "b"})
    merged = tmp_path / "merged"
    assert merge.main(["--out", str(merged), str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    # A second merge keeps each row's card rather than taking the merged environment's.
    assert merge.main(["--out", str(merged), str(merged)]) == 0
    data = json.loads((merged / "results.json").read_text())
    assert data["environment"]["device"] == "NVIDIA H100"
    assert {r["case"]: r["gpu"] for r in data["rows"]} == {"x": "NVIDIA H100", "y": "NVIDIA H200"}
