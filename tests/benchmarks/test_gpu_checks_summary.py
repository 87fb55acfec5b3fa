"""CPU test of the GPU gate's summary (benchmarks/gpu_checks.py): counts per test folder from a JUnit
report in which one test crashed its xdist worker, and the sanitizers' verdicts and error counts."""

from __future__ import annotations

import json

from benchmarks import gpu_checks

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.ops.test_a" name="test_ok[cuda]"/>
<testcase classname="tests.ops.test_a" name="test_bad[cuda]"><failure message="assert 1 == 2"/></testcase>
<testcase classname="tests.voxel.test_b" name="test_ok"/>
<testcase classname="tests.voxel.test_b" name="test_gone">
<failure message="worker 'gw1' crashed while running 'tests/voxel/test_b.py::test_gone'"/></testcase>
<testcase classname="tests.test_c" name="test_skip"><skipped message="needs a CUDA GPU"/></testcase>
</testsuite></testsuites>
"""

SANITIZE = """relconv compute-sanitizer summary

== memcheck: ok
command: compute-sanitizer --tool memcheck ...
errors found: 0
exit code: 0
pytest: 40 passed, 900 deselected in 150.00s
seconds: 160
log: x

== racecheck: FAIL
command: compute-sanitizer --tool racecheck ...
errors found: 3
exit code: 1
pytest: 3 passed, 900 deselected in 100.00s
seconds: 120
log: y

overall: NOT clean
"""


def test_summary_counts_crashes_as_failures(tmp_path, monkeypatch):
    work, results = tmp_path / "work", tmp_path / "results"
    work.mkdir()
    (work / "cuda_suite.xml").write_text(JUNIT)
    (work / "cuda_suite.json").write_text(json.dumps({"command": "pytest", "exit_code": 1, "seconds": 9}))
    (work / "sanitize.txt").write_text(SANITIZE)
    monkeypatch.setattr(gpu_checks, "WORK", work)
    monkeypatch.setattr(gpu_checks, "RESULTS", results)
    monkeypatch.delenv("OUT", raising=False)
    report = gpu_checks.write_summary()
    suite = report["cuda_suite"]
    assert suite["suites"] == {
        "ops": {"passed": 1, "failed": 1},
        "voxel": {"passed": 1, "crashed": 1},
        "tests": {"skipped": 1},
    }
    assert suite["total"] == {"passed": 2, "failed": 1, "crashed": 1, "skipped": 1}
    assert suite["deselected"] == []
    assert "tests.voxel.test_b::test_gone (crashed)" in suite["failed"]
    tools = report["sanitizers"]["tools"]
    assert tools["memcheck"]["errors"] == 0 and tools["racecheck"]["errors"] == 3
    assert report["sanitizers"]["overall"] == "NOT clean"
    assert not gpu_checks.passed(report)
    assert json.loads((results / "gpu_checks.json").read_text()) == report
    assert "| **total** | 2 | 1 | 1 | 1 |" in (results / "gpu_checks.md").read_text()


def test_summary_says_when_pytest_died_before_its_report(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "cuda_suite.json").write_text(json.dumps({"command": "pytest", "exit_code": -11, "seconds": 9}))
    (work / "cuda_suite.log").write_text("....\nFatal Python error: Segmentation fault\n")
    monkeypatch.setattr(gpu_checks, "WORK", work)
    monkeypatch.setattr(gpu_checks, "RESULTS", tmp_path / "results")
    monkeypatch.delenv("OUT", raising=False)
    report = gpu_checks.write_summary()
    assert report["cuda_suite"]["report"] is False
    assert report["sanitizers"] == {"ran": False}
    assert not gpu_checks.passed(report)
    assert "exit code -11 before writing its report" in (tmp_path / "results" / "gpu_checks.md").read_text()
