"""The GPU gate: the whole CUDA test suite, nothing deselected, and compute-sanitizer, summarised in
benchmarks/results/gpu_checks.md and gpu_checks.json.

    python -m benchmarks.gpu_checks [suite] [sanitize] [summary]     (all three when none is named)

suite     `pytest -m cuda tests` with a JUnit report. Under pytest-xdist (when installed) the tests
          run in worker processes, so a test that kills its process (a segfault) is reported as a
          failed test and the run goes on; without it such a crash ends the run, and the summary
          says so.
sanitize  tests/gpu_host/sanitize.sh: memcheck, initcheck, synccheck and racecheck over CUDA tests
          that run every kernel in every dtype.
summary   counts per test folder (passed, failed, crashed, skipped), the sanitizers' error counts,
          device, driver, torch and CUDA versions and the commit, from what the other steps left in
          build/gpu_checks/ (so the steps may run as separate calls).

Builds the extension first (benchmarks/gpu_host.sh build) when relconv has no CUDA kernels.
GPU_CHECKS_WORKERS sets the number of xdist workers (default 4). The summary is also copied into
$OUT when that is set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "gpu_checks"
RESULTS = ROOT / "benchmarks" / "results"
STEPS = ("suite", "sanitize", "summary")
# What pytest-xdist reports for a test whose worker process died under it.
CRASH = re.compile(r"worker '\w+' crashed while running")


def _run_logged(cmd: list[str], log: Path) -> dict:
    start = time.time()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    return {"command": " ".join(cmd), "exit_code": rc, "seconds": round(time.time() - start)}


def _ensure_cuda_build() -> None:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gpu_checks runs on a GPU host: torch sees no CUDA device")
    probe = "import relconv._ext as e; raise SystemExit(0 if e.cuda_built else 1)"
    if subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True).returncode != 0:
        subprocess.run(["bash", "benchmarks/gpu_host.sh", "build"], cwd=ROOT, check=True)


def _has_xdist() -> bool:
    return subprocess.run([sys.executable, "-c", "import xdist"], capture_output=True).returncode == 0


def run_suite() -> None:
    _ensure_cuda_build()
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests", "-p", "no:cacheprovider"]
    cmd += ["--junitxml", str(WORK / "cuda_suite.xml"), "-o", "junit_family=xunit2"]
    if _has_xdist():
        cmd += ["-n", os.environ.get("GPU_CHECKS_WORKERS", "4")]
    (WORK / "cuda_suite.xml").unlink(missing_ok=True)
    meta = _run_logged(cmd, WORK / "cuda_suite.log")
    (WORK / "cuda_suite.json").write_text(json.dumps(meta, indent=1))
    print(f"suite: exit {meta['exit_code']} in {meta['seconds']} s")


def run_sanitizers() -> None:
    _ensure_cuda_build()
    cmd = ["bash", "tests/gpu_host/sanitize.sh", str(WORK / "sanitize.txt")]
    meta = _run_logged(cmd, WORK / "sanitize.log")
    (WORK / "sanitize.json").write_text(json.dumps(meta, indent=1))
    print(f"sanitize: exit {meta['exit_code']} in {meta['seconds']} s")


def _suite_of(classname: str) -> str:
    """The test folder of a JUnit classname (`tests.ops.test_x` -> ops; `tests.test_x` -> tests)."""
    parts = classname.split(".")
    return parts[1] if len(parts) > 2 else parts[0]


def suite_counts() -> dict:
    meta_file, xml = WORK / "cuda_suite.json", WORK / "cuda_suite.xml"
    if not meta_file.exists():
        return {"ran": False}
    meta = json.loads(meta_file.read_text())
    if not xml.exists():
        tail = (WORK / "cuda_suite.log").read_text(errors="replace").strip().splitlines()[-5:]
        return {"ran": True, "report": False, **meta, "log_tail": tail}
    counts: dict[str, Counter] = defaultdict(Counter)
    failed = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        suite = _suite_of(case.get("classname", ""))
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            crashed = bool(CRASH.search((problem.get("message") or "") + (problem.text or "")))
            counts[suite]["crashed" if crashed else "failed"] += 1
            failed.append(f"{case.get('classname')}::{case.get('name')}" + (" (crashed)" if crashed else ""))
        elif case.find("skipped") is not None:
            counts[suite]["skipped"] += 1
        else:
            counts[suite]["passed"] += 1
    total = sum(counts.values(), Counter())
    return {
        "ran": True,
        "report": True,
        **meta,
        "suites": {k: dict(v) for k, v in sorted(counts.items())},
        "total": dict(total),
        "failed": failed,
        "deselected": [],
    }


def sanitizer_counts() -> dict:
    summary = WORK / "sanitize.txt"
    if not summary.exists():
        return {"ran": False}
    tools = {}
    for block in re.split(r"\n(?=== )", summary.read_text()):
        head = re.match(r"== (\w+): (.*)", block)
        if not head:
            continue
        field = dict(re.findall(r"^(errors found|exit code|pytest|seconds): (.*)$", block, re.M))
        errors = field.get("errors found", "unknown")
        tools[head.group(1)] = {
            "verdict": head.group(2),
            "errors": int(errors) if errors.isdigit() else None,
            "exit_code": int(field.get("exit code", -1)),
            "pytest": field.get("pytest", ""),
            "seconds": int(field.get("seconds", 0)),
        }
    overall = re.search(r"^overall: (.*)$", summary.read_text(), re.M)
    return {"ran": True, "tools": tools, "overall": overall.group(1) if overall else "unfinished"}


def _out(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def environment() -> dict:
    import torch

    dirty = subprocess.run(["git", "diff", "--quiet"], cwd=ROOT).returncode != 0
    gpu = _out(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _out(["git", "rev-parse", "--short", "HEAD"]) + (" (+ local changes)" if dirty else ""),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device",
        "gpu_and_driver": gpu[0] if gpu else "",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }


def _markdown(report: dict) -> str:
    env, suite, san = report["environment"], report["cuda_suite"], report["sanitizers"]
    lines = [
        "# GPU checks",
        "",
        "Written by `python -m benchmarks.gpu_checks` (benchmarks/gpu_checks.py) on the GPU host: the",
        "whole CUDA suite (`pytest -m cuda tests`, nothing deselected) and compute-sanitizer",
        "(tests/gpu_host/sanitize.sh).",
        "",
        f"- date: {env['date']}, commit {env['commit']}",
        f"- device: {env['device']} ({env['gpu_and_driver']})",
        f"- torch {env['torch']}, CUDA {env['cuda']}, Python {env['python']}",
        "",
        "## CUDA suite",
        "",
    ]
    if not suite["ran"]:
        lines.append("Not run.")
    elif not suite["report"]:
        lines += [f"pytest ended with exit code {suite['exit_code']} before writing its report:", ""]
        lines += ["    " + ln for ln in suite["log_tail"]]
    else:
        cols = ("passed", "failed", "crashed", "skipped")
        lines += ["| folder | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for name, c in [*suite["suites"].items(), ("**total**", suite["total"])]:
            lines.append(f"| {name} | " + " | ".join(str(c.get(k, 0)) for k in cols) + " |")
        lines += ["", f"Deselected: none. Command: `{suite['command']}` ({suite['seconds']} s)."]
        if suite["failed"]:
            lines += ["", "Failed:", ""] + [f"- `{t}`" for t in suite["failed"][:50]]
    lines += ["", "## compute-sanitizer", ""]
    if not san["ran"]:
        lines.append("Not run.")
    else:
        lines += ["| tool | verdict | errors | pytest | seconds |", "|---|---|---|---|---|"]
        for tool, t in san["tools"].items():
            errors = "?" if t["errors"] is None else t["errors"]
            lines.append(f"| {tool} | {t['verdict']} | {errors} | {t['pytest']} | {t['seconds']} |")
        lines += ["", f"Overall: {san['overall']}. Commands and logs: tests/gpu_host/sanitize.sh."]
    return "\n".join(lines) + "\n"


def write_summary() -> dict:
    report = {"environment": environment(), "cuda_suite": suite_counts(), "sanitizers": sanitizer_counts()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gpu_checks.json").write_text(json.dumps(report, indent=1) + "\n")
    (RESULTS / "gpu_checks.md").write_text(_markdown(report))
    if os.environ.get("OUT"):
        for name in ("gpu_checks.json", "gpu_checks.md"):
            shutil.copy(RESULTS / name, Path(os.environ["OUT"]) / name)
    print(_markdown(report))
    return report


def passed(report: dict) -> bool:
    suite, san = report["cuda_suite"], report["sanitizers"]
    suite_ok = not suite["ran"] or (
        suite["report"] and not suite["total"].get("failed") and not suite["total"].get("crashed")
    )
    return suite_ok and (not san["ran"] or san["overall"] == "clean")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("steps", nargs="*", metavar="STEP", help=f"any of {', '.join(STEPS)} (default: all)")
    steps = parser.parse_args().steps or list(STEPS)
    if unknown := set(steps) - set(STEPS):
        parser.error(f"unknown step {', '.join(sorted(unknown))}: choose from {', '.join(STEPS)}")
    WORK.mkdir(parents=True, exist_ok=True)
    if "suite" in steps:
        run_suite()
    if "sanitize" in steps:
        run_sanitizers()
    if "summary" in steps:
        return 0 if passed(write_summary()) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
