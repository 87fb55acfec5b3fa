"""Cross-check: the harness's numbers against minimal standalone twins, in one process.

    python -m benchmarks.crosscheck --out DIR

For a fixed set of cases (subm 3^3 C64 fp16 with a cached and a fresh map, down 2^3 C64 fp16 fresh,
MinkUNet 1.0 fp16 inference at batch 1 on the 64-beam scan, one R-GCN layer on AIFB at C64, mean,
fp32), runs the harness case (benchmarks.voxel_suite / graph_suite, every available peer) and each
library's standalone twin (benchmarks/standalone/<library>.py: the library as its README shows,
its own timing loop, no harness code), then writes DIR/crosscheck.json (the harness rows in the
common row schema plus the twin's times and the ratios) and DIR/crosscheck.md (the table). A
harness number more than 20% away from its twin, in latency or in throughput, is flagged: the
harness is not measuring the library as its users run it, and the adapter needs fixing before any
number is published. A library without a twin for a case (spconv and WarpConvNet have no U-Net of
their own) gets no row for it.

Harness and twin passes alternate for `--rounds` rounds and each side reports its median over the
rounds with its spread (max / min): one pass of each, run one after the other, disagreed by up to
1.7x on host-bound cases (MinkUNet inference) in both directions between two calls on the same
H100, so a single pass cannot tell an adapter defect from drift over the run.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import traceback
from pathlib import Path

import torch

from benchmarks import graph_suite, voxel_suite
from benchmarks.harness import report
from benchmarks.harness.floor import measure_ceilings
from benchmarks.harness.timing import TimingConfig

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


def harness_rows(timing: TimingConfig) -> list[dict]:
    device = torch.device("cuda")
    ceilings = {"cuda": measure_ceilings(device)}
    wanted = set(CASES.values())
    rows: list[dict] = []
    for suite in (voxel_suite, graph_suite):
        peers = {name: check() for name, check in suite.PEERS.items()}
        ctx: dict = {}
        for spec in suite.case_specs(["cuda"], tiny=False):
            if spec["case"] in wanted:
                rows.extend(suite.run(spec, ctx, peers, timing, ceilings["cuda"]))
    return rows


def twin_results(libraries: list[str]) -> dict[str, dict[str, dict]]:
    """library -> twin case -> {"latency_ms", "throughput_ms"} or {"error": ...}."""
    from benchmarks.workloads.graphs import make_kg
    from benchmarks.workloads.voxels import load_scene

    scene = load_scene("scan64", torch.device("cuda"))
    ei, et, n, r, _ = make_kg("AIFB", seed=0)
    graph = (ei.cuda(), et.cuda(), n, r)
    out: dict[str, dict[str, dict]] = {}
    for lib in libraries:
        try:
            twin = importlib.import_module(f"benchmarks.standalone.{lib}")
            results: dict[str, dict] = {}
            if hasattr(twin, "voxel_cases"):
                results |= twin.voxel_cases(scene)
            if hasattr(twin, "graph_cases"):
                results |= twin.graph_cases(graph)
            out[lib] = results
        except Exception as err:  # a library missing here, or a twin that fails, is reported
            out[lib] = {
                "error": {"error": f"{type(err).__name__}: {err}"[:300], "tb": traceback.format_exc(limit=4)}
            }
        torch.cuda.empty_cache()
    return out


METRICS = ("latency_ms", "throughput_ms")


def _median_and_spread(values: list[float]) -> tuple[float | None, float | None]:
    values = [v for v in values if v]
    if not values:
        return None, None
    return statistics.median(values), max(values) / min(values)


def harness_medians(passes: list[list[dict]]) -> list[dict]:
    """One row per (case, impl): the first pass's row with each metric's median over ok passes."""
    groups: dict[tuple, list[dict]] = {}
    for rows in passes:
        for r in rows:
            groups.setdefault((r["case"], r["impl"]), []).append(r)
    out = []
    for group in groups.values():
        ok = [r for r in group if r.get("status") == "ok"]
        row = dict(ok[0] if ok else group[0], rounds=len(ok))
        for m in METRICS:
            row[m], row[m.replace("_ms", "_spread")] = _median_and_spread([r.get(m) for r in ok])
        out.append(row)
    return out


def twin_medians(passes: list[dict[str, dict[str, dict]]]) -> dict[str, dict[str, dict]]:
    """library -> case -> medians and spreads over the passes; a library that failed in any pass keeps
    that pass's error."""
    out: dict[str, dict[str, dict]] = {}
    for lib in passes[0]:
        results = [p[lib] for p in passes]
        failed = next((r for r in results if "error" in r), None)
        if failed is not None:
            out[lib] = failed
            continue
        out[lib] = {}
        for case in results[0]:
            entry = {}
            for m in METRICS:
                values = [r[case].get(m) for r in results]
                entry[m], entry[m.replace("_ms", "_spread")] = _median_and_spread(values)
            out[lib][case] = entry
    return out


def pair_rows(rows: list[dict], twins: dict[str, dict[str, dict]]) -> list[dict]:
    by_key = {(r["case"], r["impl"]): r for r in rows}
    out = []
    for lib, results in twins.items():
        for twin_case, res in results.items():
            if twin_case not in CASES:
                continue
            impl = IMPL_NAMES.get(lib, {}).get(twin_case, lib)
            h = by_key.get((CASES[twin_case], impl), {"status": "no harness row"})
            row = dict(h, case=CASES[twin_case], impl=impl, twin=f"standalone/{lib}.py:{twin_case}")
            for m in METRICS:
                row[f"standalone_{m}"] = res.get(m)
                spread = m.replace("_ms", "_spread")
                row[f"standalone_{spread}"] = res.get(spread)
            flag = []
            for metric in ("latency", "throughput"):
                hm, sm = h.get(f"{metric}_ms"), res.get(f"{metric}_ms")
                ratio = hm / sm if h.get("status") == "ok" and hm and sm else None
                row[f"{metric}_ratio"] = ratio
                if ratio is not None and abs(ratio - 1) > THRESHOLD:
                    flag.append(metric)
            row["flag"] = ", ".join(flag) or ("" if h.get("status") == "ok" else h.get("status", "?")[:60])
            out.append(row)
    return out


def markdown(pairs: list[dict], env: dict) -> str:
    lines = [
        "# Harness vs standalone twins",
        "",
        f"{env.get('device')}, torch {env.get('torch')}, relconv {env.get('relconv_commit')}. ms; "
        f"ratio = harness / standalone of the medians over {env.get('rounds', 1)} alternating rounds; "
        "(xN) = that side's max / min over the rounds; flagged when a ratio is off by more than "
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

    for p in pairs:
        lines.append(
            f"| {p['case']} | {p['impl']} | {ms(p.get('latency_ms'), p.get('latency_spread'))} | "
            f"{ms(p['standalone_latency_ms'], p.get('standalone_latency_spread'))} | "
            f"{f(p['latency_ratio'], '.2f')} | {ms(p.get('throughput_ms'), p.get('throughput_spread'))} | "
            f"{ms(p['standalone_throughput_ms'], p.get('standalone_throughput_spread'))} | "
            f"{f(p['throughput_ratio'], '.2f')} | {p['flag']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.crosscheck", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--libraries", default=",".join(LIBRARIES), help="comma-separated subset of twins")
    p.add_argument("--runs", type=int, default=20, help="harness timed runs per case")
    p.add_argument("--rounds", type=int, default=3, help="alternating harness / twin passes")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("the cross-check needs a GPU", file=sys.stderr)
        return 2
    libraries = [name for name in args.libraries.split(",") if name in LIBRARIES]
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    timing = TimingConfig(warmup_runs=5, warmup_seconds=0.3, runs=args.runs)
    harness_passes, twin_passes = [], []
    for _ in range(args.rounds):
        harness_passes.append(harness_rows(timing))
        twin_passes.append(twin_results(libraries))
    twins = twin_medians(twin_passes)
    pairs = pair_rows(harness_medians(harness_passes), twins)
    errors = {lib: res["error"]["error"] for lib, res in twins.items() if "error" in res}
    peers = {name: check() for s in (voxel_suite, graph_suite) for name, check in s.PEERS.items()}
    env = report.environment(torch.device("cuda"), peers, {})
    env["twin_errors"] = errors
    env["rounds"] = args.rounds
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(args.out / "crosscheck.json", env, pairs, {k: str(v) for k, v in vars(args).items()})
    text = markdown(pairs, env)
    if errors:
        text += "\nTwins that did not run: " + "; ".join(f"{k}: {v}" for k, v in errors.items()) + "\n"
    (args.out / "crosscheck.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
