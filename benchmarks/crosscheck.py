"""Cross-check: the harness's numbers against minimal standalone twins, in one process.

    python -m benchmarks.crosscheck --out DIR [--rounds 16] [--libraries relconv,spconv,...]

For a fixed set of cases (subm 3^3 C64 fp16 with a cached and a fresh map, down 2^3 C64 fp16 fresh,
MinkUNet 1.0 fp16 inference at batch 1 on the 64-beam scan, one R-GCN layer on AIFB at C64, mean,
fp32), runs the harness case (benchmarks.voxel_suite / graph_suite, every available peer: agreement
check, its own timing, sync and launch counts) and keeps the function the harness timed for each
implementation; each library's standalone twin (benchmarks/standalone/<library>.py: the library as
its README shows, no harness code) gives its own call for the case. The two are then timed in
interleaved blocks: harness block, twin block, twin block, harness block, ... (the side that goes
first alternates per round), each block preceded by a few warm-up calls of its own side and timed
by that side's own loop (the harness's `latencies_ms` / `throughput_ms`, the twin's `time_block`).
A block gives a median latency and a queued time per call; each side's number is the median over
its blocks, the ratio is harness / twin of those medians, and the interquartile range of the
per-round ratios (blocks adjacent in time) is reported beside it. A ratio more than 20% away from 1,
in latency or in throughput, is flagged: the harness is not measuring the library as its users run
it, and the adapter needs fixing before any number is published.

Why blocks: on a shared GPU host one whole pass of either side moved by up to x5.65 (max / min over
passes), so timing a whole harness pass and then a whole twin pass flags noise and can as well hide
a real gap; adjacent short
blocks see the same host, and a median over many blocks ignores the few a burst of host work hits.

Writes DIR/crosscheck.json (the harness rows in the common row schema, their times replaced by the
block medians, plus the twin's times, the ratios and the flags; rewritten after every case) and
DIR/crosscheck.md (the table). A library without a twin for a case (spconv and WarpConvNet have no
U-Net of their own) gets no row for it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks import graph_suite, voxel_suite
from benchmarks.harness import bench, report, timing
from benchmarks.harness.floor import measure_ceilings
from benchmarks.standalone.loop import time_block

THRESHOLD = 0.2  # relative difference that flags a pair
# twin case -> harness case
CASES = {
    "subm3-cached": "voxel/cuda/layer/scan64/subm3/C64/fp16/cached/fwd",
    "subm3-fresh": "voxel/cuda/layer/scan64/subm3/C64/fp16/fresh/fwd",
    "down2-fresh": "voxel/cuda/layer/scan64/down2/C64/fp16/fresh/fwd",
    "minkunet-infer": "voxel/cuda/e2e/minkunet1.0/scan64/infer/fp16",
    "rgcn-layer": "graph/cuda/AIFB/layer/C64/mean/fp32/cached/fwd",
    "rgcn-layer-fast": "graph/cuda/AIFB/layer/C64/mean/fp32/cached/fwd",
}
# library -> the harness's implementation name per twin case (default: the library's name)
IMPL_NAMES = {"pyg": {"rgcn-layer-fast": "pyg-fast"}}
LIBRARIES = ("relconv", "spconv", "torchsparse", "warpconvnet", "pyg")
METRICS = ("latency", "throughput")

# A block of one side lasts about BLOCK_MS of timed calls (latency and queued each), between
# MIN_RUNS and MAX_RUNS calls: short enough that the host rarely changes within a round, long
# enough that the queued time covers several calls. WARMUP untimed calls precede every block.
BLOCK_MS = 20.0
MIN_RUNS, MAX_RUNS = 3, 20
WARMUP = 3


# ---------------------------------------------------------------------------------------- method
def block_runs(call_ms: float | None) -> int:
    """Timed calls per block for a call of about `call_ms` ms."""
    if not call_ms or call_ms <= 0:
        return MAX_RUNS
    return max(MIN_RUNS, min(MAX_RUNS, int(BLOCK_MS / call_ms)))


def interleave(sides: dict[str, Callable[[], dict]], rounds: int) -> dict[str, list[dict]]:
    """Runs one block of every side per round, in the given order on even rounds and reversed on odd
    ones (A B, B A, A B, ...), so neither side always follows the other. `sides[name]()` times one
    block and returns its numbers; returns each side's blocks in time order."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(sides)
    blocks: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            blocks[name].append(sides[name]())
    return blocks


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolated q-quantile (0 <= q <= 1) of a non-empty list."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _quartiles(values: list[float]) -> tuple[float, float]:
    return _quantile(values, 0.25), _quantile(values, 0.75)


def compare(harness: list[float], twin: list[float], threshold: float = THRESHOLD) -> dict:
    """Harness vs twin of one metric from per-block times (ms; block i of both sides ran in round i).

    Returns harness_ms / twin_ms (median over blocks), harness_spread / twin_spread (max / min over
    blocks), ratio (harness_ms / twin_ms), ratio_iqr (quartiles of the per-round ratios) and flagged
    (|ratio - 1| > threshold). The medians ignore a minority of disturbed blocks, so one burst of
    host work flags nothing; a gap present in most rounds moves the medians apart and is flagged.
    """
    if not harness or len(harness) != len(twin):
        raise ValueError(
            f"harness and twin need the same non-zero number of blocks, got {len(harness)} and {len(twin)}"
        )
    if min(harness) <= 0 or min(twin) <= 0:
        raise ValueError("block times must be positive")
    h, t = statistics.median(harness), statistics.median(twin)
    ratio = h / t
    return {
        "harness_ms": h,
        "harness_spread": max(harness) / min(harness),
        "twin_ms": t,
        "twin_spread": max(twin) / min(twin),
        "ratio": ratio,
        "ratio_iqr": _quartiles([a / b for a, b in zip(harness, twin, strict=True)]),
        "flagged": abs(ratio - 1) > threshold,
    }


def pair_row(harness_row: dict, twin: str, blocks: dict[str, list[dict]], runs: int) -> dict:
    """The output row of one (harness implementation, twin case) pair from its interleaved blocks:
    the harness row (schema fields kept; times replaced by the block medians) plus the twin's
    numbers, the ratios and the flag. `blocks` holds "harness" and "twin" lists of
    {"latency_ms", "throughput_ms"}."""
    row = dict(harness_row, twin=twin, rounds=len(blocks["harness"]), block_runs=runs)
    flags = []
    for metric in METRICS:
        key = f"{metric}_ms"
        c = compare([b[key] for b in blocks["harness"]], [b[key] for b in blocks["twin"]])
        row[key], row[f"{metric}_spread"] = c["harness_ms"], c["harness_spread"]
        row[f"standalone_{key}"], row[f"standalone_{metric}_spread"] = c["twin_ms"], c["twin_spread"]
        row[f"{metric}_ratio"], row[f"{metric}_ratio_iqr"] = c["ratio"], list(c["ratio_iqr"])
        if c["flagged"]:
            flags.append(metric)
    # p20 / p80 of the harness's block medians, so that they bracket its latency_ms.
    latencies = [b["latency_ms"] for b in blocks["harness"]]
    row["p20_ms"], row["p80_ms"] = _quantile(latencies, 0.2), _quantile(latencies, 0.8)
    row["runs"] = row["rounds"] * runs
    if row.get("floor_ms"):
        row["x_floor"] = row["throughput_ms"] / row["floor_ms"]
    row["flag"] = ", ".join(flags)
    return row


def unpaired_row(harness_row: dict, twin: str, why: str) -> dict:
    """A pair that could not be timed (the harness row is not ok, or the twin failed): says why."""
    row = dict(harness_row, twin=twin, rounds=0, flag=why[:80])
    for metric in METRICS:
        for key in (f"standalone_{metric}_ms", f"standalone_{metric}_spread", f"{metric}_ratio"):
            row[key] = None
        row[f"{metric}_ratio_iqr"] = None
    return row


# ---------------------------------------------------------------------------------------- GPU side
def harness_block(fn, inputs: list, runs: int, start: int) -> dict:
    """One harness block through the harness's own loops: warm-up, then per-call latencies (median)
    and the queued time per call, rotating through the harness's inputs from `start`."""
    device = torch.device("cuda")
    n = len(inputs)
    for i in range(WARMUP):
        fn(inputs[(start + i) % n])
    torch.cuda.synchronize()
    start += WARMUP
    latency = statistics.median(timing.latencies_ms(fn, inputs, device, runs, start=start))
    queued = timing.throughput_ms(fn, inputs, device, runs, start=start + runs)
    return {"latency_ms": latency, "throughput_ms": queued}


def time_pair(fn, inputs: list, call: Callable[[], object], runs: int, rounds: int) -> dict[str, list[dict]]:
    """Interleaved blocks of the harness's `fn` over `inputs` and the twin's `call`."""
    position = [0]

    def harness():
        block = harness_block(fn, inputs, runs, position[0])
        position[0] += WARMUP + 2 * runs
        return block

    return interleave({"harness": harness, "twin": lambda: time_block(call, runs, WARMUP)}, rounds)


@contextlib.contextmanager
def capturing(store: dict):
    """While active, each implementation the harness times leaves `(fn, inputs)` in `store[impl]`
    (through bench.ON_IMPL, which names the implementation, and a pass-through of bench.measure),
    so the cross-check times exactly what the harness timed, after its agreement check."""
    current: dict[str, str] = {}
    on_impl, measure = bench.ON_IMPL, bench.measure

    def named(impl: str) -> None:
        current["impl"] = impl
        if on_impl is not None:
            on_impl(impl)

    def kept(fn, inputs, device, config):
        store[current["impl"]] = (fn, inputs)
        return measure(fn, inputs, device, config)

    bench.ON_IMPL, bench.measure = named, kept
    try:
        yield store
    finally:
        bench.ON_IMPL, bench.measure = on_impl, measure


def build_twins(libraries: list[str]) -> tuple[dict[str, dict], dict[str, str]]:
    """library -> twin case -> call, and library -> error for twins that could not be built."""
    from benchmarks.workloads.graphs import make_kg
    from benchmarks.workloads.voxels import load_scene

    scene = load_scene("scan64", torch.device("cuda"))
    ei, et, n, r, _ = make_kg("AIFB", seed=0)
    graph = (ei.cuda(), et.cuda(), n, r)
    twins, errors = {}, {}
    for lib in libraries:
        try:
            twin = importlib.import_module(f"benchmarks.standalone.{lib}")
            calls: dict = {}
            if hasattr(twin, "voxel_cases"):
                calls |= twin.voxel_cases(scene)
            if hasattr(twin, "graph_cases"):
                calls |= twin.graph_cases(graph)
            twins[lib] = calls
        except Exception as err:  # a library missing here, or a twin that fails, is reported
            errors[lib] = f"{type(err).__name__}: {err}"[:300]
            print(f"twin {lib}: {errors[lib]}\n{traceback.format_exc(limit=4)}", flush=True)
    return twins, errors


def check_case(
    suite, spec: dict, peers: dict, ctx: dict, config: timing.TimingConfig, ceilings, twins: dict, rounds: int
) -> list[dict]:
    """The pair rows of one harness case: the harness case run (and its timed functions kept), then
    every twin of it interleaved with the harness implementation it mirrors."""
    store: dict = {}
    with capturing(store):
        rows = {row["impl"]: row for row in suite.run(spec, ctx, peers, config, ceilings)}
    out = []
    for lib, calls in twins.items():
        for twin_case, call in calls.items():
            if CASES.get(twin_case) != spec["case"]:
                continue
            impl = IMPL_NAMES.get(lib, {}).get(twin_case, lib)
            label = f"standalone/{lib}.py:{twin_case}"
            row = rows.get(impl, dict(case=spec["case"], impl=impl, status="no harness row"))
            if row.get("status") != "ok" or impl not in store:
                out.append(unpaired_row(row, label, str(row.get("status"))))
                print(f"  {impl:<12} {twin_case:<16} not timed: {row.get('status')}", flush=True)
                continue
            fn, inputs = store[impl]
            runs = block_runs(row.get("latency_ms"))
            began = time.perf_counter()
            try:
                blocks = time_pair(fn, inputs, call, runs, rounds)
            except Exception as err:  # a twin (or a harness call) failing mid-way is reported on its row
                out.append(unpaired_row(row, label, f"error: {type(err).__name__}: {err}"))
                print(f"  {impl:<12} {twin_case:<16} error: {err}", flush=True)
                continue
            pair = pair_row(row, label, blocks, runs)
            out.append(pair)
            print(
                f"  {impl:<12} {twin_case:<16} latency {pair['latency_ms']:.3f} / "
                f"{pair['standalone_latency_ms']:.3f} ms = {pair['latency_ratio']:.2f}, queued "
                f"{pair['throughput_ms']:.3f} / {pair['standalone_throughput_ms']:.3f} ms = "
                f"{pair['throughput_ratio']:.2f} ({rounds} x {runs} calls, "
                f"{time.perf_counter() - began:.1f} s) {pair['flag']}",
                flush=True,
            )
    del store
    torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------------------- output
def markdown(pairs: list[dict], env: dict) -> str:
    lines = [
        "# Harness vs standalone twins",
        "",
        f"{env.get('device')}, torch {env.get('torch')}, relconv {env.get('relconv_commit')}. ms, "
        f"medians over {env.get('rounds', 1)} rounds of interleaved blocks (harness block, twin block; "
        "the side going first alternates; warm-up before every block); (xN) = that side's max / min "
        "over its blocks; ratio = harness / standalone of the medians, [q1-q3] = quartiles of the "
        "per-round ratios; flagged when a ratio is off by more than "
        f"{THRESHOLD:.0%}.",
        "",
        "| case | impl | harness latency | standalone latency | ratio | harness queued | standalone queued |"
        " ratio | flag |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def f(v, spec=".3f"):
        return format(v, spec) if isinstance(v, float) else "-"

    def ms(value, spread):
        return f(value) + (f" (x{spread:.2f})" if isinstance(spread, float) else "")

    def ratio(value, iqr):
        return f(value, ".2f") + (f" [{iqr[0]:.2f}-{iqr[1]:.2f}]" if iqr else "")

    for p in pairs:
        lines.append(
            f"| {p['case']} | {p['impl']} | {ms(p.get('latency_ms'), p.get('latency_spread'))} | "
            f"{ms(p['standalone_latency_ms'], p.get('standalone_latency_spread'))} | "
            f"{ratio(p['latency_ratio'], p.get('latency_ratio_iqr'))} | "
            f"{ms(p.get('throughput_ms'), p.get('throughput_spread'))} | "
            f"{ms(p['standalone_throughput_ms'], p.get('standalone_throughput_spread'))} | "
            f"{ratio(p['throughput_ratio'], p.get('throughput_ratio_iqr'))} | {p['flag']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.crosscheck",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--libraries", default=",".join(LIBRARIES), help="comma-separated subset of twins")
    p.add_argument("--runs", type=int, default=20, help="timed runs of the harness's own pass per case")
    p.add_argument("--rounds", type=int, default=16, help="interleaved harness / twin block pairs per case")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.runs < 1:
        p.error("--runs must be at least 1")
    unknown = [name for name in args.libraries.split(",") if name not in LIBRARIES]
    if unknown:
        p.error(f"--libraries: unknown {unknown}; choose from {', '.join(LIBRARIES)}")
    if not torch.cuda.is_available():
        print("the cross-check needs a GPU", file=sys.stderr)
        return 2
    began = time.perf_counter()
    libraries = args.libraries.split(",")
    device = torch.device("cuda")
    ceilings = measure_ceilings(device)
    config = timing.TimingConfig(warmup_runs=5, warmup_seconds=0.3, runs=args.runs)
    twins, errors = build_twins(libraries)
    peers = {name: check() for s in (voxel_suite, graph_suite) for name, check in s.PEERS.items()}
    env = report.environment(device, peers, {"cuda": ceilings})
    env.update(
        twin_errors=errors,
        rounds=args.rounds,
        method=f"interleaved blocks: {WARMUP} warm-up calls, then {MIN_RUNS}-{MAX_RUNS} timed calls "
        f"(~{BLOCK_MS:g} ms) per block and side",
    )
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = set(CASES.values())
    cli = {k: str(v) for k, v in vars(args).items()}
    pairs: list[dict] = []
    for suite in (voxel_suite, graph_suite):
        suite_peers = {name: check() for name, check in suite.PEERS.items()}
        ctx: dict = {}
        for spec in suite.case_specs(["cuda"], tiny=False):
            if spec["case"] not in wanted:
                continue
            print(f"[{time.perf_counter() - began:6.1f} s] {spec['case']}", flush=True)
            pairs += check_case(suite, spec, suite_peers, ctx, config, ceilings, twins, args.rounds)
            report.write_json(args.out / "crosscheck.json", env, pairs, cli)
    text = markdown(pairs, env)
    if errors:
        text += "\nTwins that did not run: " + "; ".join(f"{k}: {v}" for k, v in errors.items()) + "\n"
    (args.out / "crosscheck.md").write_text(text)
    print(text)
    print(f"cross-check done in {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
