"""Results: environment metadata, JSON, PNG plots, the compact table and the progress bar."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from benchmarks.harness.schema import time_ms

REPO = Path(__file__).resolve().parents[2]


def git_commit() -> str:
    """HEAD of the checkout (`-dirty` with uncommitted changes); copies of the tree without .git
    (the GPU host) pass it in $RELCONV_COMMIT."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if out.returncode == 0:
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except OSError:
        pass
    return os.environ.get("RELCONV_COMMIT", "unknown")


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def environment(device: torch.device, peers: dict[str, tuple[bool, str]], ceilings: dict) -> dict:
    """Everything needed to tell two result files apart."""
    env = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "device_type": device.type,
        "cpu_threads": torch.get_num_threads(),
        "driver": _driver() if device.type == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "relconv_commit": git_commit(),
        "peers": {name: {"available": ok, "version_or_reason": info} for name, (ok, info) in peers.items()},
        "ceilings": {
            dev: {
                "copy_GBps": c.copy_bytes_per_s / 1e9,
                "gemm_TFLOPs": {k: v / 1e12 for k, v in c.gemm_flops_per_s.items()},
            }
            for dev, c in ceilings.items()
        },
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["sm_count"] = props.multi_processor_count
        env["memory_GiB"] = props.total_memory / 2**30
    return env


def write_json(path: Path, env: dict, rows: list[dict], args: dict) -> None:
    """Rewritten after every case, so a run killed by a time limit still leaves its rows."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"environment": env, "args": args, "rows": rows}, indent=1, default=str))
    os.replace(tmp, path)


def speedup(peer: dict, rc: dict) -> float | None:
    """relconv's speedup over a peer (peer time / relconv time): the smaller of the latency and the
    throughput ratios, so a headline never quotes the metric that flatters relconv."""
    ratios = []
    for metric in ("latency", "throughput"):
        a, b = time_ms(peer, metric), time_ms(rc, metric)
        if a is not None and b:
            ratios.append(a / b)
    return min(ratios) if ratios else None


def gpu_speedup(peer: dict, rc: dict) -> float | None:
    """relconv's speedup over a peer in GPU time per call (instrument.py's gpu_ms): the host-free
    ratio, beside `speedup` rather than in place of it."""
    a, b = peer.get("gpu_ms"), rc.get("gpu_ms")
    return a / b if a and b else None


def is_relconv(impl: str) -> bool:
    """relconv itself or one of its own variants (e.g. `relconv-folded`): never a peer to compare with."""
    return impl == "relconv" or impl.startswith("relconv-")


def speedups(rows: list[dict]) -> list[tuple[str, str, float]]:
    """(case, peer, speedup) for every case both relconv and the peer timed (see `speedup`)."""
    by_case: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok":
            by_case[r["case"]][r["impl"]] = r
    out = []
    for case, impls in by_case.items():
        if "relconv" not in impls:
            continue
        for impl, row in impls.items():
            if not is_relconv(impl) and (sp := speedup(row, impls["relconv"])) is not None:
                out.append((case, impl, sp))
    return out


def plot(rows: list[dict], out_dir: Path) -> list[Path]:
    """Per (suite, device, kind): speedup_<...>.png (relconv over each peer) and floor_<...>.png
    (relconv's time as a multiple of the floor)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["suite"], r.get("device", "?"), r.get("kind", "case"))].append(r)
    written = []
    for (suite, device, kind), grows in sorted(groups.items()):
        tag = f"{suite}_{device}_{kind}"
        sp = speedups(grows)
        if sp:
            peers = sorted({p for _, p, _ in sp})
            cases = sorted({c for c, _, _ in sp})
            fig, ax = plt.subplots(figsize=(11, max(3, 0.2 * len(cases) * len(peers) ** 0.5 + 1)))
            height = 0.8 / len(peers)
            index = {c: i for i, c in enumerate(cases)}
            for j, peer in enumerate(peers):
                pts = [(index[c], s) for c, p, s in sp if p == peer]
                ax.barh([i + j * height for i, _ in pts], [s for _, s in pts], height=height, label=peer)
            ax.axvline(1.0, color="k", lw=0.8)
            ax.set_xscale("log")
            ax.set_yticks([i + 0.4 - height / 2 for i in range(len(cases))], cases, fontsize=6)
            ax.set_xlabel(
                "speedup of relconv (peer / relconv, the lower of the latency and throughput ratios; "
                "> 1: relconv faster)"
            )
            ax.set_title(f"{suite} / {device} / {kind}: relconv speedup over each peer")
            ax.legend(fontsize=7)
            fig.tight_layout()
            path = out_dir / f"speedup_{tag}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
        fl = [r for r in grows if r["impl"] == "relconv" and r["status"] == "ok" and r.get("x_floor")]
        if fl:
            fig, ax = plt.subplots(figsize=(11, max(3, 0.16 * len(fl) + 1)))
            ax.barh(range(len(fl)), [r["x_floor"] for r in fl])
            ax.set_yticks(range(len(fl)), [r["case"] for r in fl], fontsize=6)
            ax.set_xscale("log")
            ax.axvline(1.0, color="k", lw=0.8)
            ax.set_xlabel("relconv time / floor (1 = at the physical limit)")
            ax.set_title(f"{suite} / {device} / {kind}: relconv time as a multiple of the floor")
            fig.tight_layout()
            path = out_dir / f"floor_{tag}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def _word(status: str) -> str:
    """ "missing: <why>" -> "missing" (the JSON keeps the reason)."""
    return status.split(":")[0][:14]


def _fmt(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def table(rows: list[dict]) -> str:
    """Per suite, one line per case: relconv's time, its multiple of the floor, each peer's time
    (with relconv's speedup over it) or status; then the voxel suite's summary per scene family."""
    tables = [_suite_table([r for r in rows if r["suite"] == s]) for s in sorted({r["suite"] for r in rows})]
    if fam := family_table(rows):
        tables.append(fam)
    return "\n\n".join(tables)


# Thresholds the family summary counts cases below: the project's targets are 1.5x (and never below
# 1.2x) in wall time, 1.3x (and never below 1.0x) in GPU time.
BELOW = (1.5, 1.3, 1.2, 1.0)


def family_summary(rows: list[dict]) -> list[dict]:
    """Per (device, scene family) of the voxel suite: over the cases both relconv and a peer timed,
    relconv's speedup over the best peer of each case (`speedup`, the peer with the lowest one):
    how many cases, the median and the minimum, and how many fall below each of `BELOW`; the same
    from GPU time per call (`gpu_speedup`) over the cases that have it; and relconv's GPU time per
    call over the case's floor (`floor_rows`, `floor_median`, `floor_max`) over every relconv case
    with both, peer or not."""
    from benchmarks.workloads.families import family_of

    by_case: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r.get("suite") == "voxel" and r["status"] == "ok":
            by_case[r["case"]][r["impl"]] = r
    groups: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(
        lambda: {"sp": [], "gpu": [], "floor": []}
    )
    for impls in by_case.values():
        rc = impls.get("relconv")
        if rc is None:
            continue
        key = (rc.get("device", "?"), rc.get("family") or family_of(rc.get("workload", "")))
        if rc.get("gpu_ms") and rc.get("floor_ms"):
            groups[key]["floor"].append(rc["gpu_ms"] / rc["floor_ms"])
        peers = [row for impl, row in impls.items() if not is_relconv(impl)]
        sp = [s for row in peers if (s := speedup(row, rc)) is not None]
        gpu = [g for row in peers if (g := gpu_speedup(row, rc)) is not None]
        if sp:
            groups[key]["sp"].append(min(sp))
        if gpu:
            groups[key]["gpu"].append(min(gpu))
    out = []
    for (device, family), g in sorted(groups.items()):
        if not g["sp"] and not g["gpu"] and not g["floor"]:
            continue
        entry = {"device": device, "family": family}
        for tag, values in (("", g["sp"]), ("gpu_", g["gpu"])):
            entry.update(
                {
                    f"{tag}rows": len(values),
                    f"{tag}median": statistics.median(values) if values else None,
                    f"{tag}min": min(values) if values else None,
                    **{f"{tag}below_{t}": sum(v < t for v in values) for t in BELOW},
                }
            )
        floor = g["floor"]
        entry.update(
            floor_rows=len(floor),
            floor_median=statistics.median(floor) if floor else None,
            floor_max=max(floor) if floor else None,
        )
        out.append(entry)
    return out


def family_table(rows: list[dict]) -> str:
    """`family_summary` as text; empty when no voxel case has a peer or a floor to compare with."""
    summary = family_summary(rows)
    if not summary:
        return ""
    head = (
        f"{'device':<6} {'family':<10} {'rows':>5} {'median':>7} {'min':>6} {'<1.2x':>6} {'<1.0x':>6}   "
        f"{'gpu rows':>8} {'median':>7} {'min':>6} {'<1.2x':>6} {'<1.0x':>6}   "
        f"{'floor rows':>10} {'median':>7} {'max':>6}"
    )
    lines = [
        "per scene family: relconv's speedup over the best peer of each case (the lower of the latency "
        "and throughput ratios), then the same in GPU time per call, then relconv's GPU time over the "
        "case's floor",
        head,
        "-" * len(head),
    ]
    for e in summary:
        lines.append(
            f"{e['device']:<6} {e['family']:<10} {e['rows']:>5} {_fmt(e['median'], '.2f'):>7} "
            f"{_fmt(e['min'], '.2f'):>6} {e['below_1.2']:>6} {e['below_1.0']:>6}   {e['gpu_rows']:>8} "
            f"{_fmt(e['gpu_median'], '.2f'):>7} {_fmt(e['gpu_min'], '.2f'):>6} {e['gpu_below_1.2']:>6} "
            f"{e['gpu_below_1.0']:>6}   {e['floor_rows']:>10} {_fmt(e['floor_median'], '.2f'):>7} "
            f"{_fmt(e['floor_max'], '.2f'):>6}"
        )
    return "\n".join(lines)


def _suite_table(rows: list[dict]) -> str:
    peers = sorted({r["impl"] for r in rows if r["impl"] != "relconv"})
    by_case: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by_case[r["case"]][r["impl"]] = r
    width = max([len(c) for c in by_case] + [4])
    head = (
        f"{'case':<{width}}  {'relconv lat':>11} {'queued':>8} {'gpu':>8} {'xfloor':>7} {'syncs':>5} "
        f"{'launch':>6}" + "".join(f" {p[:22]:>22}" for p in peers)
    )
    lines = [
        "times in ms: per-call latency (sync after each call) and queued throughput; a peer's cell is "
        "its latency, relconv's speedup over it (the lower of the latency and throughput ratios) and, "
        "after g, its speedup in GPU time per call",
        head,
        "-" * len(head),
    ]
    for case, impls in by_case.items():
        rc = impls.get("relconv", {})
        ok = rc.get("status") == "ok"
        cell = _fmt(time_ms(rc, "latency"), ".3f") if ok else _word(rc.get("status", "-"))
        line = (
            f"{case:<{width}}  {cell:>11} {_fmt(time_ms(rc, 'throughput') if ok else None, '.3f'):>8} "
            f"{_fmt(rc.get('gpu_ms') if ok else None, '.3f'):>8} "
            f"{_fmt(rc.get('x_floor'), '.1f'):>7} {_fmt(rc.get('host_syncs'), 'd'):>5} "
            f"{_fmt(rc.get('kernel_launches'), 'd'):>6}"
        )
        for p in peers:
            r = impls.get(p)
            if r is None:
                s = ""
            elif r["status"] == "ok":
                s = _fmt(time_ms(r, "latency"), ".3f")
                if ok and not is_relconv(p) and (sp := speedup(r, rc)) is not None:
                    g = gpu_speedup(r, rc)
                    s += f" ({sp:.2f}x" + (f", g{g:.2f}x)" if g else ")")
            else:
                s = _word(r["status"])
            line += f" {s:>22}"
        lines.append(line)
    return "\n".join(lines)


def progress(items: Iterable, total: int, desc: str) -> Iterator:
    """tqdm when installed, else a counter on stderr."""
    try:
        from tqdm import tqdm

        yield from tqdm(items, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)
        return
    except ImportError:
        pass
    for i, item in enumerate(items, 1):
        print(f"\r{desc}: {i}/{total}", end="", file=sys.stderr, flush=True)
        yield item
    print(file=sys.stderr)
