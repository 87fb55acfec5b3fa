"""`benchmarks.run --resume` after a process died: crash rows, re-runs without the crashed peer, and
no crash row for a run that was only stopped."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch_geometric")
pytest.importorskip("matplotlib")

from benchmarks import graph_suite, run  # noqa: E402

CASE = "graph/cpu/tiny/layer/C8/mean/fp32/cached/fwd/t1"


def _resume(out, *args) -> list[dict]:
    argv = [
        "--device",
        "cpu",
        "--tiny",
        "--runs",
        "2",
        "--suite",
        "graph",
        "--cases",
        CASE,
        "--out",
        str(out),
    ]
    assert run.main([*argv, "--phase", "time", "--resume", *args]) == 0
    return [r for r in json.loads((out / "results.json").read_text())["rows"] if r["case"] == CASE]


def test_a_case_whose_peer_crashed_runs_again_without_it(tmp_path):
    (tmp_path / "running.case").write_text(f"{CASE}\npyg")
    rows = {r["impl"]: r for r in _resume(tmp_path, "--peers", "pyg")}
    assert "native crash" in rows["pyg"]["status"] and "in pyg" in rows["pyg"]["status"]
    assert rows["relconv"]["status"] == "ok" and rows["relconv"]["latency_ms"] > 0
    assert not (tmp_path / "running.case").exists()


def test_a_case_relconv_crashed_in_is_not_run_again(tmp_path):
    (tmp_path / "running.case").write_text(f"{CASE}\nrelconv")
    rows = _resume(tmp_path, "--peers", "pyg")
    assert [r["impl"] for r in rows] == ["relconv"] and "native crash" in rows[0]["status"]


def test_a_stopped_run_leaves_no_crash_behind(tmp_path, monkeypatch):
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt  # as `timeout`'s SIGTERM arrives, through run._exit_on_sigterm

    monkeypatch.setattr(graph_suite, "run", stopped)
    argv = ["--device", "cpu", "--tiny", "--suite", "graph", "--cases", CASE, "--out", str(tmp_path)]
    with pytest.raises(KeyboardInterrupt):
        run.main([*argv, "--phase", "time", "--peers", "pyg"])
    assert not (tmp_path / "running.case").exists()
    monkeypatch.undo()
    rows = _resume(tmp_path, "--peers", "pyg")
    statuses = {r["impl"]: r["status"] for r in rows}
    assert {"relconv", "pyg"} <= statuses.keys() and set(statuses.values()) == {"ok"}


def test_sigterm_becomes_a_python_exit():
    with pytest.raises(SystemExit) as stop:
        run._exit_on_sigterm(15, None)
    assert stop.value.code == 143
