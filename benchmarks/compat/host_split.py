"""Where a compat backbone's host time goes, through the shim and through relconv's native twin:
both built in one process and taking turns (shim, twin, twin, shim, as speed.py times them), each
call under cProfile, and the host milliseconds per call of each part of the code side by side:
the shim's own modules, relconv's voxel and op layers, torch's modules, the backbone's own code,
and the costliest built-in calls (relconv's and torch's ops, which include their CUDA API calls
and any wait for the device). A profiling aid (which code makes the shim's host time differ from
the twin's), not a benchmark: cProfile slows every Python frame, so read the differences between
the columns, not the totals.

    python -m benchmarks.compat.host_split BACKBONE PHASE DTYPE [--calls 20] [--top 12] [--tiny]
                                           [--functions]

PHASE is `inference` or `training`, DTYPE `fp32` or `fp16`; the call is `speed.py`'s. `--tiny`
takes the small scans of `speed.py --dry-run` (CPU runs, smoke tests). `--functions` splits by
function (`relconv/voxel/conv.py:run_layer`) instead of by part of the code.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections import Counter
from pathlib import Path

import torch

from benchmarks.compat import backbones as bb
from benchmarks.compat import child, scenes
from benchmarks.harness.timing import TimingConfig, warm_up

SIDES = ("shim", "native")


_ROOTS = ("relconv", "benchmarks", "torch")


def _package_path(path: str) -> list[str] | None:
    """A Python file's path from its last package root (`relconv`, `benchmarks`, `torch`) on."""
    parts = path.split("/")
    for root in _ROOTS:
        if root in parts:
            return parts[len(parts) - 1 - parts[::-1].index(root) :]
    return None


def part_of(filename: str, function: str) -> str:
    """The part of the code a profiled function belongs to: a package area for Python code, the
    function itself for a built-in (an op or a C call)."""
    path = Path(filename).as_posix()
    if filename == "~" or path.startswith("<"):
        return function if filename == "~" else "python internals"
    inner = _package_path(path)
    if inner is None:
        return "backbone and other code" if "downstream" in path.split("/") else "other Python"
    return "/".join(inner[:3] if inner[0] == "relconv" else inner[:2]).removesuffix(".py")


def function_of(filename: str, function: str) -> str:
    """A profiled function's name under its part of the code: `relconv/voxel/conv.py:run_layer`
    (Python code from its package root on), the function itself for a built-in."""
    path = Path(filename).as_posix()
    if filename == "~" or path.startswith("<"):
        return part_of(filename, function)
    inner = _package_path(path)
    return ("/".join(inner) if inner else path.split("/")[-1]) + ":" + function


def split(stats: pstats.Stats, calls: int, by=part_of) -> Counter:
    """Own (exclusive) host milliseconds per call of each part of the code (or each key `by` gives)."""
    per_part: Counter = Counter()
    for (filename, _, function), (_, _, own, _, _) in stats.stats.items():
        per_part[by(filename, function)] += own * 1e3 / calls
    return per_part


def _profiled_calls(profiler: cProfile.Profile, calls: int):
    def action(fn, inputs, device):
        warm_up(fn, inputs, device, TimingConfig())
        for i in range(calls):
            profiler.enable()
            fn(inputs[i % len(inputs)])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            profiler.disable()

    return action


def run(backbone: str, phase: str, dtype: str, calls: int, tiny: bool, by=part_of) -> dict[str, Counter]:
    """Per-call host milliseconds by part of the code (or `by`'s keys), for the shim and the twin."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = bb.BACKBONES[backbone]
    voxels = scenes.load(spec.scene, tiny=tiny)
    sides = {name: child.Side(spec, name, bb.DEFAULT_DOWNSTREAM, voxels, device) for name in SIDES}
    sides["native"].load(sides["shim"].model.state_dict())
    profilers = {name: cProfile.Profile() for name in SIDES}
    for name in SIDES + SIDES[::-1]:
        child.in_case(sides[name], dtype, phase, _profiled_calls(profilers[name], calls))
    return {name: split(pstats.Stats(profilers[name]), 2 * calls, by) for name in SIDES}


def table(parts: dict[str, Counter], top: int) -> list[str]:
    """The parts whose shim and twin times differ most, then each side's total."""
    shim, native = parts["shim"], parts["native"]
    names = sorted(set(shim) | set(native), key=lambda k: (-abs(shim[k] - native[k]), k))
    lines = [f"{'part of the code':<60} {'shim':>9} {'native':>9} {'diff':>9}  (host ms per call)"]
    for k in names[:top]:
        # the end of a long name: a function's name, a built-in's op
        lines.append(f"{k[-60:]:<60} {shim[k]:9.3f} {native[k]:9.3f} {shim[k] - native[k]:+9.3f}")
    total_s, total_n = sum(shim.values()), sum(native.values())
    lines.append(f"{'all':<60} {total_s:9.3f} {total_n:9.3f} {total_s - total_n:+9.3f}")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("backbone", choices=sorted(bb.BACKBONES))
    p.add_argument("phase", choices=("inference", "training"))
    p.add_argument("dtype", choices=("fp32", "fp16"))
    p.add_argument("--calls", type=int, default=20, help="profiled calls per turn (two turns a side)")
    p.add_argument("--top", type=int, default=12, help="parts listed")
    p.add_argument("--tiny", action="store_true", help="the small scans of speed.py --dry-run")
    p.add_argument("--functions", action="store_true", help="split by function, not by part of the code")
    args = p.parse_args(argv)
    by = function_of if args.functions else part_of
    parts = run(args.backbone, args.phase, args.dtype, args.calls, args.tiny, by)
    print(f"{args.backbone} {args.phase} {args.dtype}, {2 * args.calls} calls a side under cProfile")
    print("\n".join(table(parts, args.top)))


if __name__ == "__main__":
    main()
