"""Where a compat backbone's host time goes, through the shim and through relconv's native twin:
both built in one process and taking turns (shim, twin, twin, shim, as speed.py times them), each
call under cProfile, and the host milliseconds per call of each part of the code side by side:
the shim's own modules, relconv's voxel and op layers, torch's modules, the backbone's own code,
and the costliest built-in calls (relconv's and torch's ops, which include their CUDA API calls
and any wait for the device). A profiling aid (which code makes the shim's host time differ from
the twin's), not a benchmark: cProfile slows every Python frame, so read the differences between
the columns, not the totals.

    python -m benchmarks.compat.host_split BACKBONE PHASE DTYPE [--calls 20] [--top 12] [--tiny]
                                           [--functions] [--sample US]

PHASE is `inference` or `training`, DTYPE `fp32` or `fp16`; the call is `speed.py`'s. `--tiny`
takes the small scans of `speed.py --dry-run` (CPU runs, smoke tests). `--functions` splits by
function (`relconv/voxel/conv.py:run_layer`) instead of by part of the code.

`--sample US` samples instead of profiling: every US microseconds of wall time a signal records the
Python functions on the main thread's stack, and each part (or function) gets the wall time of the
samples it is on, inclusive of what it calls. cProfile's cost per Python frame inflates a deep call
tree more than a shallow one; sampling costs the same per sample on either side. A sample reaches
the handler only between bytecodes, so a long C call counts to the frame that made it.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import signal
import time
from collections import Counter
from pathlib import Path

import torch

from benchmarks.compat import backbones as bb
from benchmarks.compat import child, scenes
from benchmarks.harness.timing import TimingConfig, warm_up

SIDES = ("shim", "native")


_ROOTS = ("relconv", "benchmarks", "torch")


def package_path(path: str) -> list[str] | None:
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
    inner = package_path(path)
    if inner is None:
        return "backbone and other code" if "downstream" in path.split("/") else "other Python"
    return "/".join(inner[:3] if inner[0] == "relconv" else inner[:2]).removesuffix(".py")


def function_of(filename: str, function: str) -> str:
    """A profiled function's name under its part of the code: `relconv/voxel/conv.py:run_layer`
    (Python code from its package root on), the function itself for a built-in."""
    path = Path(filename).as_posix()
    if filename == "~" or path.startswith("<"):
        return part_of(filename, function)
    inner = package_path(path)
    return ("/".join(inner) if inner else path.split("/")[-1]) + ":" + function


def split(stats: pstats.Stats, calls: int, by=part_of) -> Counter:
    """Own (exclusive) host milliseconds per call of each part of the code (or each key `by` gives)."""
    per_part: Counter = Counter()
    for (filename, _, function), (_, _, own, _, _) in stats.stats.items():
        per_part[by(filename, function)] += own * 1e3 / calls
    return per_part


class Sampler:
    """Wall-clock samples of the main thread's Python stack while enabled (SIGALRM every
    `interval_us`): per sample, each key `by` gives a frame on the stack counts once. The handler
    only records the stack's code objects; they are named when the samples are split."""

    def __init__(self, interval_us: float, by=part_of) -> None:
        self.interval, self.by = interval_us * 1e-6, by
        self.stacks: Counter = Counter()
        self.samples, self.seconds, self._start = 0, 0.0, 0.0

    def _sample(self, signum, frame) -> None:
        codes = set()
        while frame is not None:
            codes.add(frame.f_code)
            frame = frame.f_back
        self.stacks[frozenset(codes)] += 1
        self.samples += 1

    def enable(self) -> None:
        signal.signal(signal.SIGALRM, self._sample)
        self._start = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, self.interval, self.interval)

    def disable(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        self.seconds += time.perf_counter() - self._start

    def split(self, calls: int) -> Counter:
        """Inclusive wall milliseconds per call of each key."""
        per_sample = self.seconds * 1e3 / calls / max(self.samples, 1)
        names: dict = {}
        out: Counter = Counter()
        for codes, n in self.stacks.items():
            keys = set()
            for code in codes:
                if code not in names:
                    names[code] = self.by(code.co_filename, code.co_name)
                keys.add(names[code])
            for key in keys:
                out[key] += n * per_sample
        return out


def _profiled_calls(profiler: cProfile.Profile | Sampler, calls: int):
    def action(fn, inputs, device):
        warm_up(fn, inputs, device, TimingConfig())
        for i in range(calls):
            profiler.enable()
            fn(inputs[i % len(inputs)])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            profiler.disable()

    return action


def run(
    backbone: str, phase: str, dtype: str, calls: int, tiny: bool, by=part_of, sample_us: float = 0.0
) -> dict[str, Counter]:
    """Per-call host milliseconds by part of the code (or `by`'s keys), for the shim and the twin:
    own time under cProfile, or with `sample_us` inclusive wall time from samples (`Sampler`)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = bb.BACKBONES[backbone]
    voxels = scenes.load(spec.scene, tiny=tiny)
    sides = {name: child.Side(spec, name, bb.DEFAULT_DOWNSTREAM, voxels, device) for name in SIDES}
    sides["native"].load(sides["shim"].model.state_dict())
    profilers = {name: Sampler(sample_us, by) if sample_us else cProfile.Profile() for name in SIDES}
    for name in SIDES + SIDES[::-1]:
        child.in_case(sides[name], dtype, phase, _profiled_calls(profilers[name], calls))
    if sample_us:
        return {name: profilers[name].split(2 * calls) for name in SIDES}
    return {name: split(pstats.Stats(profilers[name]), 2 * calls, by) for name in SIDES}


def table(parts: dict[str, Counter], top: int, inclusive: bool = False) -> list[str]:
    """The parts whose shim and twin times differ most, then each side's total (own times; with
    `inclusive`, the call itself: the largest inclusive time)."""
    shim, native = parts["shim"], parts["native"]
    names = sorted(set(shim) | set(native), key=lambda k: (-abs(shim[k] - native[k]), k))
    what = "inclusive wall ms per call" if inclusive else "host ms per call"
    lines = [f"{'part of the code':<60} {'shim':>9} {'native':>9} {'diff':>9}  ({what})"]
    for k in names[:top]:
        # the end of a long name: a function's name, a built-in's op
        lines.append(f"{k[-60:]:<60} {shim[k]:9.3f} {native[k]:9.3f} {shim[k] - native[k]:+9.3f}")
    total = (lambda c: max(c.values(), default=0.0)) if inclusive else (lambda c: sum(c.values()))
    total_s, total_n = total(shim), total(native)
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
    p.add_argument("--sample", type=float, default=0.0, metavar="US", help="sample every US microseconds")
    args = p.parse_args(argv)
    if args.sample < 0:
        raise SystemExit(f"--sample must be a positive number of microseconds, got {args.sample}")
    by = function_of if args.functions else part_of
    parts = run(args.backbone, args.phase, args.dtype, args.calls, args.tiny, by, args.sample)
    how = f"sampled every {args.sample:g} us" if args.sample else "under cProfile"
    print(f"{args.backbone} {args.phase} {args.dtype}, {2 * args.calls} calls a side {how}")
    print("\n".join(table(parts, args.top, inclusive=bool(args.sample))))


if __name__ == "__main__":
    main()
