"""Collective costs on this host's process group, for the scaling benchmark (benchmarks.ddp_scaling):
an all_reduce of a MinkUNet's gradient (bandwidth) and of 1 KiB (latency), each a median of timed
calls after warm-up. Run under torchrun, one process per GPU (`--device cpu`: gloo).

    torchrun --standalone --nproc_per_node=2 -m benchmarks.ddp_collectives --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist


def timed_all_reduce(numel: int, device: torch.device, reps: int) -> float:
    """Median seconds of an all_reduce of `numel` float32 values, synchronised after each call."""
    t = torch.ones(numel, dtype=torch.float32, device=device)
    times = []
    for i in range(reps + 5):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 5:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--width", type=float, default=1.0, help="MinkUNet width whose gradient is reduced")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    from relconv.voxel.models import MinkUNet

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world = dist.get_world_size()
    grad_numel = sum(p.numel() for p in MinkUNet(in_channels=4, num_classes=3, width=args.width).parameters())
    big = timed_all_reduce(grad_numel, device, args.reps)
    small = timed_all_reduce(256, device, args.reps * 10)
    # Bus bandwidth, NCCL's convention for all_reduce: bytes * 2 (world - 1) / world per second.
    result = {
        "world_size": world,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "gradient_numel": grad_numel,
        "gradient_all_reduce_ms": big * 1e3,
        "gradient_bus_gb_per_s": grad_numel * 4 * 2 * (world - 1) / world / big / 1e9,
        "all_reduce_1kib_us": small * 1e6,
    }
    if dist.get_rank() == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "collectives.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result))
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
