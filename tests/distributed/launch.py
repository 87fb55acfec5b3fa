"""Runs a function on every rank of a local gloo process group (torch.multiprocessing spawn)."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run_ranks(fn, world_size: int, *args, backend: str = "gloo") -> list:
    """`fn(rank, world_size, *args)` on `world_size` spawned processes joined by a `backend` group
    (nccl: rank r on GPU r); returns each rank's result (anything `torch.save` takes).
    `fn` must be a module-level function."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_entry, args=(fn, world_size, tmp, args, backend), nprocs=world_size, join=True)
        return [torch.load(os.path.join(tmp, f"{r}.pt"), weights_only=False) for r in range(world_size)]


def _rank_entry(rank: int, fn, world_size: int, tmp: str, args: tuple, backend: str) -> None:
    torch.set_num_threads(1)  # the ranks share the test machine's cores
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend, init_method=f"file://{os.path.join(tmp, 'rendezvous')}", rank=rank, world_size=world_size
    )
    try:
        result = fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    torch.save(result, os.path.join(tmp, f"{rank}.pt"))
