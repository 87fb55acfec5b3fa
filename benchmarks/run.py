"""The benchmark runner: `python -m benchmarks.run --suite voxel|graph|all --out DIR`.

Measures the copy-bandwidth and GEMM ceilings, runs every selected case for relconv and each
available peer (agreement check first, then timing), rewrites DIR/results.json after every case,
draws DIR/*.png and prints a compact table last. See benchmarks/README.md for the columns.
"""

from __future__ import annotations

import argparse
import faulthandler
import fnmatch
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch

from benchmarks import graph_suite, voxel_suite
from benchmarks.harness import bench, report
from benchmarks.harness.floor import Ceilings, measure_ceilings
from benchmarks.harness.timing import TimingConfig

SUITES = {"voxel": voxel_suite, "graph": graph_suite}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    p.add_argument("--suite", choices=["voxel", "graph", "all"], default="all")
    p.add_argument("--out", required=True, type=Path, help="directory for results.json and the plots")
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cuda also runs the graph suite's CPU cases (relconv vs PyG vs DGL on CPU)",
    )
    p.add_argument("--tiny", action="store_true", help="tiny sizes and few runs (CI smoke test)")
    p.add_argument("--cases", default="*", help="fnmatch pattern(s) over case names, comma-separated")
    p.add_argument(
        "--peers",
        default="all",
        help="comma-separated subset of: " + ",".join(sorted({*voxel_suite.PEERS, *graph_suite.PEERS})),
    )
    p.add_argument("--runs", type=int, default=None, help="timed runs per case (default 20; tiny 3)")
    p.add_argument(
        "--warmup-seconds", type=float, default=None, help="minimum warm-up per case (default 0.3 s)"
    )
    p.add_argument(
        "--families",
        default="",
        help="also run the voxel cases of the scene families (benchmarks/workloads/families.py) whose "
        "scene names match these comma-separated fnmatch patterns, e.g. '*' or 'aggregate-*,room-2cm'",
    )
    p.add_argument(
        "--family-set",
        choices=sorted(voxel_suite.FAMILY_SETS),
        help="a named selection of family scenes and cases (voxel_suite.FAMILY_SETS) in place of "
        "--families and --cases",
    )
    p.add_argument("--list", action="store_true", help="print the selected case names and exit")
    p.add_argument(
        "--phase",
        choices=["all", "time", "instrument"],
        default="all",
        help="time: agreement and timing only; instrument: add the profiler's counts (host syncs, "
        "kernel launches, GPU time) to DIR/results.json's timed rows; all (default): time here, "
        "then instrument in a child process (a profile slows every later CUDA call of its process)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep DIR/results.json's rows and run only the missing cases; a case during which an "
        "earlier process died (a native crash) is recorded as such, then run again without the peer "
        "that crashed, or skipped when relconv did",
    )
    args = p.parse_args(argv)
    if args.family_set:
        if args.families or args.cases != "*":
            p.error("--family-set replaces --families and --cases; give one or the other")
        scenes, cases = voxel_suite.FAMILY_SETS[args.family_set]()
        args.families, args.cases = ",".join(scenes), ",".join(cases)
    return args


def _peers(suite, wanted: str) -> dict[str, tuple[bool, str]]:
    names = suite.PEERS if wanted == "all" else [n for n in wanted.split(",") if n in suite.PEERS]
    return {n: suite.PEERS[n]() for n in names}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda requested but torch sees no GPU", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    patterns = [p.strip() for p in args.cases.split(",") if p.strip()]

    plan = []
    for name in suites:
        suite = SUITES[name]
        for spec in suite.case_specs(_devices(name, device), args.tiny):
            if any(fnmatch.fnmatchcase(spec["case"], pat) for pat in patterns):
                plan.append((suite, spec))
    families = [p.strip() for p in args.families.split(",") if p.strip()]
    if families and "voxel" in suites:
        for spec in voxel_suite.family_case_specs(_devices("voxel", device), families):
            if any(fnmatch.fnmatchcase(spec["case"], pat) for pat in patterns):
                plan.append((voxel_suite, spec))
    if args.list:
        print("\n".join(spec["case"] for _, spec in plan))
        return 0

    timing = TimingConfig(
        warmup_runs=1 if args.tiny else 5,
        warmup_seconds=args.warmup_seconds
        if args.warmup_seconds is not None
        else (0.0 if args.tiny else 0.3),
        runs=args.runs or (3 if args.tiny else 20),
        queued_blocks=1 if args.tiny else 5,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase == "instrument":
        return _instrument(args, plan, timing)
    ceilings = {dev: measure_ceilings(torch.device(dev), args.tiny) for dev in _all_devices(plan)}
    peers = {}
    for name in suites:
        peers.update(_peers(SUITES[name], args.peers))
    env = report.environment(device, peers, ceilings)
    env["queued_blocks"] = timing.queued_blocks  # the queued figure is the median of this many blocks
    json_path = args.out / "results.json"
    # The case in flight, so that a process killed by a segfault in a native extension can be
    # resumed (`--resume`) without running that case again.
    marker = args.out / "running.case"
    rows, crashed_peer = _resumed_rows(json_path, marker, plan) if args.resume else ([], {})
    done = {r["case"] for r in rows} - set(crashed_peer)
    plan = [(suite, spec) for suite, spec in plan if spec["case"] not in done]
    ctx: dict = {}
    # A segfault in a native extension prints the Python stack of every thread to stderr.
    faulthandler.enable()
    with _stops_cleanly(marker):
        for suite, spec in report.progress(plan, len(plan), "cases"):
            skip = crashed_peer.get(spec["case"])
            suite_peers = {n: peers[n] for n in suite.PEERS if n in peers and n != skip}
            marker.write_text(spec["case"])
            # Second line: the implementation in flight (relconv or a peer), for the crash row.
            bench.ON_IMPL = partial(_mark_impl, marker, spec["case"])
            rows.extend(suite.run(spec, ctx, suite_peers, timing, ceilings[spec["device"]]))
            report.write_json(json_path, env, rows, {k: str(v) for k, v in vars(args).items()})
    bench.ON_IMPL = None
    ctx.clear()
    report.write_json(json_path, env, rows, {k: str(v) for k, v in vars(args).items()})
    if args.phase == "time":
        print(f"\nwrote {json_path} (timings; the profiler's counts come with --phase instrument)")
        return 0
    if "cuda" in _all_devices(plan):
        argv = sys.argv[1:] if argv is None else argv
        return subprocess.call([sys.executable, "-m", "benchmarks.run", *argv, "--phase", "instrument"])
    _report(rows, args.out)  # nothing to profile off CUDA
    return 0


def _report(rows: list[dict], out: Path) -> None:
    plots = report.plot(rows, out)
    print(f"\nwrote {out / 'results.json'} and {', '.join(p.name for p in plots) or 'no plots'}")
    print(report.table(rows))


def _instrument(args: argparse.Namespace, plan, timing: TimingConfig) -> int:
    """Adds host_syncs, kernel_launches and gpu_ms to the timed rows of DIR/results.json that lack
    them, case by case (rewriting the file after each); then plots and prints the table. A case
    during which an earlier instrument process died keeps its rows uncounted."""
    json_path = args.out / "results.json"
    saved = json.loads(json_path.read_text())
    env, rows = saved["environment"], saved["rows"]
    marker = args.out / "instrumenting.case"
    crashed = marker.read_text().strip() if marker.exists() else None
    counted = ("host_syncs", "kernel_launches", "gpu_ms")
    todo = {
        r["case"]
        for r in rows
        if r.get("device") == "cuda" and r.get("latency_ms") is not None and r.get("kernel_launches") is None
    }
    todo.discard(crashed)
    bench.PHASE = "instrument"
    ctx: dict = {}
    peers = {}
    for suite in {suite for suite, _ in plan}:
        peers.update(_peers(suite, args.peers))
    # The timing phase's ceilings, as it saved them: the floors they give are not merged, but
    # suite.run needs them, and measuring them again would cost GEMMs and copies for nothing.
    ceilings = {
        dev: Ceilings(c["copy_GBps"] * 1e9, {k: v * 1e12 for k, v in c["gemm_TFLOPs"].items()})
        for dev, c in env["ceilings"].items()
    }
    faulthandler.enable()
    with _stops_cleanly(marker):
        for suite, spec in report.progress([p for p in plan if p[1]["case"] in todo], len(todo), "profiles"):
            marker.write_text(spec["case"])
            suite_peers = {n: peers[n] for n in suite.PEERS if n in peers}
            got = {r["impl"]: r for r in suite.run(spec, ctx, suite_peers, timing, ceilings[spec["device"]])}
            for r in rows:
                if r["case"] == spec["case"] and r.get("latency_ms") is not None and r["impl"] in got:
                    r.update({k: got[r["impl"]].get(k) for k in counted})
            report.write_json(json_path, env, rows, saved.get("args", {}))
    ctx.clear()
    _report(rows, args.out)
    return 0


@contextmanager
def _stops_cleanly(marker: Path) -> Iterator[None]:
    """Removes the case marker however the loop ends in Python: done, `timeout`'s SIGTERM, Ctrl-C
    or an exception. Only a process that dies natively (a segfault) leaves it, so `--resume`
    records crashes and nothing else, and runs an interrupted case again."""
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        marker.unlink(missing_ok=True)
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _resumed_rows(json_path: Path, marker: Path, plan) -> tuple[list[dict], dict[str, str]]:
    """Rows of an earlier run in the same directory, plus one row for the case it died in; and
    {that case: the peer that crashed} when a peer did, so that the case runs again without it."""
    rows = json.loads(json_path.read_text())["rows"] if json_path.exists() else []
    crashed_peer = {}
    if marker.exists():
        lines = marker.read_text().strip().splitlines() or [""]
        crashed, impl = lines[0].strip(), (lines[1].strip() if len(lines) > 1 else "")
        suite, spec = next(((su, s) for su, s in plan if s["case"] == crashed), (None, None))
        peer = next((n for n in suite.PEERS if impl.startswith(n)), None) if suite else None
        if peer is not None:
            crashed_peer[crashed] = peer
        if spec is not None and all(r["case"] != crashed for r in rows):
            meta = {k: v for k, v in spec.items() if k != "pass_"}
            if "pass_" in spec:
                meta["pass"] = spec["pass_"]
            where = f" in {impl}" if impl else ""
            rows.append(
                dict(
                    meta,
                    impl=impl or "all",
                    status=f"error: the process died during this case{where} (native crash)",
                )
            )
        marker.unlink()
    return rows, crashed_peer


def _mark_impl(marker: Path, case: str, impl: str) -> None:
    marker.write_text(f"{case}\n{impl}")


def _devices(suite_name: str, device: torch.device) -> list[str]:
    """The graph suite also runs its CPU cases on a GPU machine; the voxel suite stays on `device`."""
    if suite_name == "graph" and device.type == "cuda":
        return ["cuda", "cpu"]
    return [device.type]


def _all_devices(plan) -> list[str]:
    return sorted({spec["device"] for _, spec in plan})


if __name__ == "__main__":
    sys.exit(main())
