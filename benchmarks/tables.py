"""Markdown tables from benchmarks/results/results.json, written into README.md and docs/performance.md.

    python -m benchmarks.tables            # rewrite every generated block in place
    python -m benchmarks.tables --check    # exit 1 if a block differs from the results (CI runs this
                                           # through tests/benchmarks/test_tables.py)
    python -m benchmarks.tables --print headline

A generated block sits between `<!-- tables:NAME -->` and `<!-- /tables:NAME -->`; the text between
the two markers is the script's and is replaced whole. A speedup is the best peer's time over
relconv's, the lower of the latency and the queued-throughput ratios (`report.speedup`); the best
peer of a case is the one with the lowest speedup. GPU time (`gpu_ms`, from the profiler) gives the
host-free ratio where both sides have it.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import report
from benchmarks.harness.schema import time_ms

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "results.json"
# The scene-family run (`--family-set core`), kept apart: it ran on another card than RESULTS.
FAMILY_RESULTS = REPO / "benchmarks" / "results" / "families" / "results.json"
DOCS = (REPO / "README.md", REPO / "docs" / "performance.md")

WORKLOADS = {
    "scan32": "32-beam scan",
    "scan64": "64-beam scan",
    "scan128": "128-beam scan",
    "scan64b2": "two 64-beam scans",
    "scan64x3": "three 64-beam scans",
    "scan128x8": "3.5M-voxel scene",
    "indoor": "indoor room",
    "kitti-real": "real scan",
}
OPS = {"subm3": "subm 3³", "down2": "down 2³", "down3": "down 3³", "up2": "up 2³"}

# The README's rows: the layers a point-cloud network spends its time in, whole networks, and R-GCN.
HEADLINE = (
    "voxel/cuda/layer/scan64/subm3/C64/fp16/cached/fwd",
    "voxel/cuda/layer/scan64/subm3/C128/fp16/cached/fwd",
    "voxel/cuda/layer/kitti-real/subm3/C64/fp16/cached/fwd",
    "voxel/cuda/layer/scan64/subm3/C64/fp32/cached/fwd",
    "voxel/cuda/layer/scan64/subm3/C64/fp16/fresh/fwd",
    "voxel/cuda/layer/scan64/down2/C64/fp16/fresh/fwd",
    "voxel/cuda/layer/scan128x8/subm3/C64/fp16/fresh/fwd",
    "voxel/cuda/layer/scan64/subm3/C64/fp16/cached/fwd+bwd",
    "voxel/cuda/layer/scan64/subm3/C128/fp16/cached/fwd+bwd",
    "voxel/cuda/e2e/minkunet1.0/scan64/infer/fp16",
    "voxel/cuda/e2e/minkunet1.0/kitti-real/infer/fp16",
    "voxel/cuda/e2e/minkunet1.0/scan64b2/train/fp16",
    "graph/cuda/AIFB/layer/C64/mean/fp32/cached/fwd",
    "graph/cuda/AIFB/layer/C64/mean/fp32/cached/fwd+bwd",
    "graph/cuda/AIFB/rgcn2/fp32/cached/fwd+bwd",
)
PEER_NAMES = {
    "pyg": "PyG RGCNConv",
    "pyg-fast": "PyG FastRGCNConv",
    "torchsparse": "TorchSparse++",
    "warpconvnet": "WarpConvNet",
}


@dataclass
class Comparison:
    case: str
    relconv: dict
    peer: dict
    speedup: float
    gpu_speedup: float | None


def load(path: Path = RESULTS) -> list[dict]:
    return json.loads(path.read_text())["rows"]


def comparisons(rows: list[dict]) -> dict[str, Comparison]:
    """Per case that relconv and at least one peer timed: relconv against its best peer."""
    by_case: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok":
            by_case[r["case"]][r["impl"]] = r
    out = {}
    for case, impls in by_case.items():
        rc = impls.get("relconv")
        if rc is None:
            continue
        timed = [
            (sp, impl)
            for impl, row in impls.items()
            if not report.is_relconv(impl) and (sp := report.speedup(row, rc)) is not None
        ]
        if timed:
            sp, impl = min(timed)
            out[case] = Comparison(case, rc, impls[impl], sp, report.gpu_speedup(impls[impl], rc))
    return out


def label(row: dict) -> str:
    """A case in words, e.g. `subm 3³ C64 fp16, cached map, fwd+bwd (64-beam scan)`; a row measured
    on another card than the results' environment names it, e.g. `(AIFB, H200)`."""
    card = f", {_card(row['gpu'])}" if row.get("gpu") and row["gpu"] != _main_gpu() else ""
    if row["suite"] == "graph":
        what = "2-layer R-GCN" if row["kind"] == "rgcn2" else f"R-GCN layer C{row['C']} {row['aggr']}"
        return f"{what} {row['dtype']}, {row['map']} graph, {row['pass']} ({row['graph']}{card})"
    where = WORKLOADS.get(row["workload"]) or _scene(row["workload"])
    if row["kind"] == "e2e":
        mode = "inference" if row["mode"] == "infer" else "training step"
        return f"MinkUNet {row['width']} {mode} {row['dtype']} ({where}{card})"
    op = OPS.get(row["op"], row["op"])
    return f"{op} C{row['C']} {row['dtype']}, {row['map']} map, {row['pass']} ({where}{card})"


@functools.cache
def _main_gpu(path: Path = RESULTS) -> str:
    """The card of the results' environment (its first run's)."""
    return json.loads(path.read_text())["environment"]["device"]


def _card(device: str) -> str:
    """A GPU's model, e.g. `H200` for `NVIDIA H200`."""
    m = re.search(r"\b[A-Z]{1,2}\d{2,4}\b", device)
    return m.group(0) if m else device


def _scene(name: str) -> str:
    """A family scene with its voxel count, e.g. `aggregate-1m, 936,587 voxels`."""
    from benchmarks.workloads.families import load_stats

    voxels = load_stats().get(name, {}).get("voxels")
    return f"{name}, {voxels:,} voxels" if voxels else name


def _ms(row: dict) -> str:
    return f"{time_ms(row, 'latency'):.3f} / {time_ms(row, 'throughput'):.3f}"


def _table(comps: list[Comparison]) -> str:
    lines = [
        "| case | relconv ms | best peer | peer ms | speedup | GPU time |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for c in comps:
        gpu = f"{c.gpu_speedup:.2f}×" if c.gpu_speedup else "–"
        peer = PEER_NAMES.get(c.peer["impl"], c.peer["impl"])
        lines.append(
            f"| {label(c.relconv)} | {_ms(c.relconv)} | {peer} | {_ms(c.peer)} | {c.speedup:.2f}× | {gpu} |"
        )
    return "\n".join(lines)


def headline(comps: dict[str, Comparison]) -> str:
    return _table([comps[case] for case in HEADLINE if case in comps])


def summary(comps: dict[str, Comparison]) -> str:
    """One line per family of cases: how many relconv wins, by how much."""
    families = {
        "voxel layers": "voxel/cuda/layer/",
        "MinkUNet networks": "voxel/cuda/e2e/",
        "R-GCN layers and networks": "graph/cuda/",
    }
    lines = [
        "| cases with a peer | count | relconv faster | ≥ 1.5× | median speedup |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, prefix in families.items():
        sp = [c.speedup for case, c in comps.items() if case.startswith(prefix)]
        if sp:
            lines.append(
                f"| {name} | {len(sp)} | {sum(s > 1 for s in sp)} | {sum(s >= 1.5 for s in sp)} "
                f"| {statistics.median(sp):.2f}× |"
            )
    return "\n".join(lines)


def _below(comps: dict[str, Comparison], low: float, high: float) -> str:
    rows = sorted((c for c in comps.values() if low <= c.speedup < high), key=lambda c: c.speedup)
    return _table(rows) if rows else "None."


def losses(comps: dict[str, Comparison]) -> str:
    """Every case where the best peer is faster than relconv."""
    return _below(comps, 0.0, 1.0)


def narrow(comps: dict[str, Comparison]) -> str:
    """Every case where relconv wins by less than 1.5×."""
    return _below(comps, 1.0, 1.5)


def environment(path: Path = RESULTS) -> str:
    """The GPU, torch and every peer that ran, from the merged runs' environments."""
    data = json.loads(path.read_text())
    env = data["environment"]
    peers: dict[str, str] = {}
    for run_env in [env, *(run["environment"] for run in env.get("runs", []))]:
        for name, info in run_env["peers"].items():
            if info["available"]:
                peers[name] = info["version_or_reason"]
    versions = ", ".join(f"{PEER_NAMES.get(n, n)} {v}" for n, v in sorted(peers.items()))
    others = sorted({r["gpu"] for r in data["rows"] if r.get("gpu") and r["gpu"] != env["device"]})
    marked = "".join(f" (rows marked {_card(g)}: {g})" for g in others)
    return f"{env['device']}{marked}, torch {env['torch']}, CUDA {env['cuda']}; peers: {versions}."


def family_cases(path: Path = FAMILY_RESULTS) -> str:
    """Every case of the scene-family run against its best peer in wall time, then against the
    peer with the least GPU time, and peak extra memory beside that peer's."""
    env = json.loads(path.read_text())["environment"]
    rows = load(path)
    impls: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok":
            impls[r["case"]][r["impl"]] = r
    lines = [
        f"{env['device']}, relconv {env['relconv_commit'][:7]}; GPU time: the peer with the least.",
        "",
        "| case | relconv ms | best peer | peer ms | speedup | GPU time | peak MiB, relconv / peer |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for case, c in comparisons(rows).items():
        peers = [r for impl, r in impls[case].items() if not report.is_relconv(impl)]
        gpu = [(g, r) for r in peers if (g := report.gpu_speedup(r, c.relconv)) is not None]
        g_txt = "–"
        if gpu:
            g, r = min(gpu, key=lambda t: t[0])
            g_txt = f"{g:.2f}× {PEER_NAMES.get(r['impl'], r['impl'])}"
        mem = min((r["peak_mem_mib"] for r in peers if r.get("peak_mem_mib")), default=None)
        own = c.relconv.get("peak_mem_mib")
        mem_txt = f"{own:,.0f} / {mem:,.0f}" if mem and own else "–"
        peer = PEER_NAMES.get(c.peer["impl"], c.peer["impl"])
        lines.append(
            f"| {label(c.relconv)} | {_ms(c.relconv)} | {peer} | {_ms(c.peer)} | {c.speedup:.2f}× "
            f"| {g_txt} | {mem_txt} |"
        )
    return "\n".join(lines)


def family_summary(path: Path = FAMILY_RESULTS) -> str:
    """`report.family_summary` of the scene-family run as a table."""
    lines = [
        "| family | cases | median | min | < 1.5× | < 1.2× | GPU median | GPU min | GPU < 1.3× "
        "| GPU < 1.0× | GPU time over floor, median / max |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def x(v: float | None, unit: str = "×") -> str:
        return "–" if v is None else f"{v:.2f}{unit}"

    for e in report.family_summary(load(path)):
        lines.append(
            f"| {e['family']} | {e['rows']} | {x(e['median'])} | {x(e['min'])} | {e['below_1.5']} "
            f"| {e['below_1.2']} | {x(e['gpu_median'])} | {x(e['gpu_min'])} | {e['gpu_below_1.3']} "
            f"| {e['gpu_below_1.0']} | {x(e['floor_median'], '')} / {x(e['floor_max'], '')} |"
        )
    return "\n".join(lines)


BLOCKS = {
    "environment": lambda comps: environment(),
    "families": lambda comps: family_cases(),
    "family_summary": lambda comps: family_summary(),
    "headline": headline,
    "summary": summary,
    "losses": losses,
    "narrow": narrow,
}
MARKER = re.compile(r"(<!-- tables:(\w+) -->\n)(.*?)(<!-- /tables:\2 -->)", re.S)


def render(text: str, comps: dict[str, Comparison]) -> str:
    """`text` with every generated block replaced by its current content."""

    def fill(m: re.Match) -> str:
        if m.group(2) not in BLOCKS:
            raise ValueError(f"unknown table block {m.group(2)!r}; known: {', '.join(BLOCKS)}")
        return f"{m.group(1)}{BLOCKS[m.group(2)](comps)}\n{m.group(4)}"

    return MARKER.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tables", description=__doc__)
    p.add_argument("--check", action="store_true", help="report blocks that differ; change nothing")
    p.add_argument("--print", dest="block", choices=sorted(BLOCKS), help="print one block")
    args = p.parse_args(argv)
    comps = comparisons(load())
    if args.block:
        print(BLOCKS[args.block](comps))
        return 0
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        new = render(text, comps)
        if new != text:
            stale.append(doc.relative_to(REPO))
            if not args.check:
                doc.write_text(new)
    verb = "differ from the results" if args.check else "rewritten"
    print(f"{', '.join(map(str, stale))}: {verb}" if stale else "tables up to date")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
