"""Weak and strong scaling of examples/train_ddp.py (MinkUNet), one process per GPU, and where the
multi-GPU step's extra time goes.

    python -m benchmarks.ddp_scaling --out DIR [--gpus 2] [--batch-per-gpu 2] [--steps 40]

Runs, each as its own torchrun job on the same synthetic 64-beam scans:
  1gpu            1 GPU, global batch B (= --batch-per-gpu)
  1gpu_omp1       the same with OMP_NUM_THREADS=1, as torchrun sets it for more than one process
  1gpu_batchGB    1 GPU, global batch G*B (strong scaling's baseline)
  Ggpu_relconv    G GPUs, global batch G*B, relconv's SyncBatchNorm
  Ggpu_off        the same with per-rank BatchNorm statistics
The last --profile-steps steps of 1gpu and Ggpu_relconv run under torch.profiler (a summary per
rank in DIR/profile_*); step medians leave them out, and the first 10 steps (warm-up). Then
benchmarks.ddp_collectives times an all_reduce of the model's gradient and of 1 KiB on G processes.
Writes DIR/ddp_scaling.json and prints a table: ms per step, scans per second, weak-scaling
efficiency (scans/s at G GPUs over G times scans/s at 1 GPU) and strong-scaling speed-up.
`--device cpu` runs the same jobs on CPU processes joined by gloo (a smoke run; small scans).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"
WARMUP = 10
GPU_SCENE = "--scans 16 --beams 64 --azimuth-steps 1800 --voxel-size 0.05".split()
CPU_SCENE = "--scans 8 --beams 8 --azimuth-steps 256 --voxel-size 0.4 --width 0.25".split()


def jobs(gpus: int, per_gpu: int) -> list[tuple[str, int, int, list[str], dict, bool]]:
    """(name, processes, global batch, extra arguments, extra environment, profiled)."""
    big = gpus * per_gpu
    return [
        ("1gpu", 1, per_gpu, [], {}, True),
        ("1gpu_omp1", 1, per_gpu, [], {"OMP_NUM_THREADS": "1"}, False),
        (f"1gpu_batch{big}", 1, big, [], {}, False),
        (f"{gpus}gpu_relconv", gpus, big, ["--sync-bn", "relconv"], {}, True),
        (f"{gpus}gpu_off", gpus, big, ["--sync-bn", "off"], {}, False),
    ]


def torchrun(procs: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]


def child_env(extra: dict) -> dict:
    """This environment plus `extra`, with the checkout first on PYTHONPATH (torchrun's children
    import relconv and benchmarks from it)."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def median_step(log: dict) -> float:
    times = log["step_seconds"]
    end = len(times) - log.get("profiled_steps", 0)
    return statistics.median(times[min(WARMUP, end - 1) : end])


def run_job(args, name: str, procs: int, batch: int, extra: list[str], env: dict, profiled: bool) -> dict:
    metrics = args.out / f"{name}.json"
    cmd = torchrun(procs) + [str(EXAMPLE), "--model", "minkunet", "--device", args.device]
    cmd += ["--steps", str(args.steps), "--batch-size", str(batch)]
    cmd += (GPU_SCENE if args.device == "cuda" else CPU_SCENE) + extra + ["--metrics", str(metrics)]
    if profiled:
        cmd += ["--profile", str(args.out / f"profile_{name}"), "--profile-steps", str(args.profile_steps)]
    subprocess.run(cmd, check=True, env=child_env(env), timeout=args.timeout, stdout=subprocess.DEVNULL)
    log = json.loads(metrics.read_text())
    step = median_step(log)
    return {
        "processes": procs,
        "global_batch": batch,
        "args": extra,
        "env": env,
        "median_step_ms": step * 1e3,
        "scans_per_s": batch / step,
        "first_losses": log["losses"][:3],
        "device": log["device"],
    }


def run_collectives(args) -> dict:
    cmd = torchrun(args.gpus) + ["-m", "benchmarks.ddp_collectives", "--device", args.device]
    cmd += ["--out", str(args.out)]
    if args.device == "cpu":
        cmd += ["--width", "0.25", "--reps", "5"]
    subprocess.run(
        cmd, check=True, env=child_env({}), timeout=args.timeout, stdout=subprocess.DEVNULL, cwd=ROOT
    )
    return json.loads((args.out / "collectives.json").read_text())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--gpus", type=int, default=2, help="processes of the multi-process jobs")
    p.add_argument("--batch-per-gpu", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    args = p.parse_args(argv)
    if args.gpus < 2 or args.batch_per_gpu < 1 or args.steps <= args.profile_steps:
        p.error("--gpus must be at least 2, --batch-per-gpu positive, --steps above --profile-steps")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, procs, batch, extra, env, profiled in jobs(args.gpus, args.batch_per_gpu):
        results[name] = run_job(args, name, procs, batch, extra, env, profiled)
        r = results[name]
        print(f"{name:>14}: {r['median_step_ms']:8.1f} ms/step  {r['scans_per_s']:7.1f} scans/s", flush=True)
    one, big = results["1gpu"], results[f"1gpu_batch{args.gpus * args.batch_per_gpu}"]
    for sync in ("relconv", "off", "torch"):
        multi = results.get(f"{args.gpus}gpu_{sync}")
        if multi is None:
            continue
        multi["weak_efficiency"] = multi["scans_per_s"] / (args.gpus * one["scans_per_s"])
        multi["strong_speedup"] = big["median_step_ms"] / multi["median_step_ms"]
        print(
            f"{args.gpus} GPUs, {sync} SyncBatchNorm: weak efficiency {multi['weak_efficiency']:.0%}, "
            f"strong speed-up {multi['strong_speedup']:.2f}x"
        )
    c = run_collectives(args)
    print(
        f"all_reduce over {args.gpus} processes: gradient ({c['gradient_numel'] / 1e6:.1f}M fp32) "
        f"{c['gradient_all_reduce_ms']:.2f} ms ({c['gradient_bus_gb_per_s']:.0f} GB/s bus), "
        f"1 KiB {c['all_reduce_1kib_us']:.0f} us"
    )
    summary = {
        "command": " ".join(["python -m benchmarks.ddp_scaling"] + (argv or sys.argv[1:])),
        "jobs": results,
        "collectives": c,
    }
    (args.out / "ddp_scaling.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
