"""Speed of the real spconv / TorchSparse, relconv's shim of it, and relconv's native twin, per backbone.

    source benchmarks/peers/activate.sh
    python -m benchmarks.compat.speed --out OUT_DIR            # GPU host
    python -m benchmarks.compat.speed --out OUT_DIR --dry-run  # CPU, shims and twins only, tiny scans

Each backbone's real library runs in a process of its own (`child.py speed`), and so do the shim
and relconv's native twin, together: they take turns on every case in one process, so that the
host's speed, which differs from one process to the next by up to 1.6x on the GPU hosts, falls on
both alike (`--separate-twin`: a process each). Each child times inference (eval mode,
`torch.no_grad()`) and a training step (forward, fixed projection, backward), fp32 (TF32 off) and
fp16 (autocast with fp16 features), on a batch of four 64-beam scans, timed by the shared harness
(`benchmarks.harness.timing.measure`: medians of synchronised-call latency and of queued
throughput). A library's input tensor is built inside every call (one scan batch, fresh maps), as a
training or inference loop over new scans does. The summary gives the real library's time over the
shim's (the bar: >= 1.5) and the shim's time over the native twin's (bar: <= 1.05).
`--rounds N` runs every child N times, the libraries in a rotated order each round, so that a
drift of the host's speed falls on every library alike: each time is the median over the rounds,
each ratio the median of the rounds' ratios (both from the same round).
Writes speed.json and speed.md to OUT_DIR after every child.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.compat import backbones as bb
from benchmarks.compat import native
from benchmarks.compat.spawn import run_child

HEADER = ("backbone", "dtype", "phase", "real", "shim", "native")
HEADER += ("real/shim lat", "real/shim queued", "real/shim GPU", "shim/native lat", "shim/native queued")
METRICS = ("latency_ms", "throughput_ms", "gpu_ms")
SPEEDUP_BAR = 1.5
OVERHEAD_BAR = 1.05
RATIOS = (("real_over_shim", "real", "shim"), ("shim_over_native", "shim", "native"))


def _ratio(num: dict | None, den: dict | None, key: str) -> float | None:
    if not num or not den or key not in num or key not in den or not den[key]:
        return None
    return num[key] / den[key]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _over_rounds(rows: list[dict]) -> dict:
    """One library's rows of a case over the rounds: the first round's row with each metric the median
    over the rounds that timed it (an error row where no round did)."""
    timed = [r for r in rows if "error" not in r]
    if not timed:
        return rows[0]
    out = dict(timed[0], rounds=len(timed))
    for metric in METRICS:
        out[metric] = _median([r.get(metric) for r in timed])
    return out


def summarise(results: list[dict]) -> list[dict]:
    """One row per (backbone, dtype, phase) with every library's times and the two ratios, over
    the rounds (`round` of each result; 0 when absent)."""
    table: dict[tuple, dict] = {}
    for r in results:
        for row in r.get("rows", []):
            key = (r["backbone"], row["dtype"], row["phase"])
            by_round = table.setdefault(key, {})
            by_round.setdefault(r.get("round", 0), {})[r["library_kind"]] = row
    out = []
    for key, by_round in table.items():
        row = {"backbone": key[0], "dtype": key[1], "phase": key[2]}
        for library in {lib for libs in by_round.values() for lib in libs}:
            row[library] = _over_rounds([libs[library] for libs in by_round.values() if library in libs])
        for metric in METRICS:
            for name, num, den in RATIOS:
                ratios = [_ratio(libs.get(num), libs.get(den), metric) for libs in by_round.values()]
                row[f"{name}_{metric}"] = _median(ratios)
        out.append(row)
    return out


def _t(row: dict | None) -> str:
    if not row:
        return "-"
    if "error" in row:
        return "error"
    text = f"{row['latency_ms']:.2f} / {row['throughput_ms']:.2f}"
    if row.get("gpu_ms") is not None:
        text += f" / {row['gpu_ms']:.2f} ({row['kernel_launches']} launches, {row['host_syncs']} waits)"
    return text


def _r(v: float | None, good) -> str:
    return "-" if v is None else f"{v:.2f}" + ("" if good(v) else " (!)")


def _cells(*values) -> str:
    return "| " + " | ".join(str(v) for v in values) + " |"


def markdown(results: list[dict]) -> str:
    fast, cheap = (lambda v: v >= SPEEDUP_BAR), (lambda v: v <= OVERHEAD_BAR)
    rounds = len({r.get("round", 0) for r in results})
    over_rounds = f" Medians over {rounds} rounds, ratios paired within each round." if rounds > 1 else ""
    lines = [
        "# Shim speed on downstream backbones",
        "",
        "Times in ms, `latency / queued / GPU` (medians; GPU: kernel time of one call from the "
        "profiler, with its kernel launches and host waits; the costliest kernels are in speed.json). "
        "real/shim: the real library's time over the shim's "
        f"(bar >= {SPEEDUP_BAR}); shim/native: the shim's time over relconv's native twin's "
        f"(bar <= {OVERHEAD_BAR}). (!) marks a ratio that misses its bar.{over_rounds}",
        "",
        _cells(*HEADER),
        _cells(*["---"] * len(HEADER)),
    ]
    for row in summarise(results):
        times = [_t(row.get(lib)) for lib in ("real", "shim", "native")]
        ratios = [_r(row[f"real_over_shim_{m}"], fast) for m in METRICS]
        ratios += [_r(row[f"shim_over_native_{m}"], cheap) for m in ("latency_ms", "throughput_ms")]
        lines.append(_cells(row["backbone"], row["dtype"], row["phase"], *times, *ratios))
    errors = [f"{r['backbone']} / {r['library_kind']}: {r['error']}" for r in results if "error" in r]
    errors += [
        f"{r['backbone']} / {r['library_kind']}: {x['dtype']} {x['phase']}: {x['error']}"
        for r in results
        for x in r.get("rows", [])
        if "error" in x
    ]
    if errors:
        lines += ["", "Errors:", "", *(f"- {e.splitlines()[-1]}" for e in errors)]
    libraries = sorted({f"{r['library_kind']} = {r['library']}" for r in results if "library" in r})
    lines += ["", "Libraries: " + "; ".join(libraries)]
    return "\n".join(lines) + "\n"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for speed.json and speed.md")
    p.add_argument("--backbones", default=",".join(bb.BACKBONES), help="comma-separated subset")
    p.add_argument("--libraries", default="real,shim,native")
    p.add_argument("--downstream", type=Path, default=bb.DEFAULT_DOWNSTREAM)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="fp32,fp16")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--runs", type=int, default=20, help="timed calls per latency / queued block")
    p.add_argument("--queued-blocks", type=int, default=3)
    p.add_argument("--warmup-runs", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per child process")
    p.add_argument("--rounds", type=int, default=1, help="children per (backbone, library), in rotated order")
    p.add_argument(
        "--separate-twin",
        action="store_true",
        help="run the shim and the native twin in processes of their own instead of one, taking turns",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny scans, fp32, shim and native only, 3 runs"
    )
    args = p.parse_args(argv)
    if args.dry_run:
        args.device, args.tiny, args.dtypes, args.libraries = "cpu", True, "fp32", "shim,native"
        args.runs, args.queued_blocks, args.warmup_runs = 3, 1, 1
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    args.libraries = [x for x in args.libraries.split(",") if x]
    args.backbones = [b for b in args.backbones.split(",") if b]
    bad = [b for b in args.backbones if b not in bb.BACKBONES]
    bad += [x for x in args.libraries if x not in bb.LIBRARIES]
    if bad:
        p.error(f"unknown backbones or libraries {bad}; known: {sorted(bb.BACKBONES)}, {bb.LIBRARIES}")
    args.downstream = args.downstream.resolve()
    return args


def _child_args(name: str, library: str, out: Path, work: Path, args) -> list[str]:
    cmd = ["speed", name, library, str(out), "--downstream", str(args.downstream), "--device", args.device]
    cmd += ["--dtypes", args.dtypes, "--runs", str(args.runs), "--queued-blocks", str(args.queued_blocks)]
    cmd += ["--warmup-runs", str(args.warmup_runs), "--scene-cache", str(work / "scenes")]
    return cmd + (["--tiny"] if args.tiny else [])


def _children(libraries: list[str], separate: bool) -> list[tuple[str, ...]]:
    """The libraries each child process runs: the shim and the native twin share one unless
    `separate` (`child.speed` has them take turns)."""
    if separate or "shim" not in libraries or "native" not in libraries:
        return [(lib,) for lib in libraries]
    return [("shim", "native") if lib == "shim" else (lib,) for lib in libraries if lib != "native"]


def main(argv=None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    children = _children(args.libraries, args.separate_twin)
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="relconv-compat-") as tmp:
        for rnd in range(args.rounds):
            shift = rnd % len(children)
            for name in args.backbones:
                for kinds in children[shift:] + children[:shift]:
                    if name not in native.TWINS:
                        kinds = tuple(k for k in kinds if k != "native")
                    if not kinds:
                        continue
                    out = Path(tmp) / f"{name}-{kinds[0]}.json"
                    cmd = _child_args(name, kinds[0], out, Path(tmp), args)
                    err = run_child(cmd + (["--with-native"] if len(kinds) > 1 else []), args.timeout)
                    if err:
                        got = [{"backbone": name, "error": err, "library_kind": kind} for kind in kinds]
                    else:
                        got = json.loads(out.read_text())
                    for result in got:
                        results.append({**result, "round": rnd})
                    summary = {"results": results, "summary": summarise(results)}
                    (args.out / "speed.json").write_text(json.dumps(summary, indent=1))
                    (args.out / "speed.md").write_text(markdown(results))
                    status = "error: " + err.splitlines()[-1] if err else "done"
                    print(f"round {rnd}: {name} / {' + '.join(kinds)}:", status, flush=True)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
