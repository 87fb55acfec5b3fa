"""Runs a function on every rank of a local process group (torch.multiprocessing spawn), with a
deadline: a rank stuck in a collective fails the test with each rank's Python stack instead of
hanging it. The ranks meet through a TCP store on a free local port, as torchrun's do (NCCL's
first collective fetches its unique id from that store)."""

from __future__ import annotations

import datetime
import faulthandler
import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEADLINE_S = 180.0


def run_ranks(fn, world_size: int, *args, backend: str = "gloo", deadline_s: float = DEADLINE_S) -> list:
    """`fn(rank, world_size, *args)` on `world_size` spawned processes joined by a `backend` group
    (nccl: rank r on GPU r); returns each rank's result (anything `torch.save` takes).
    `fn` must be a module-level function. Ranks still running after `deadline_s` print their
    stacks (faulthandler) and are killed, and the call raises TimeoutError."""
    with tempfile.TemporaryDirectory() as tmp:
        entry_args = (fn, world_size, tmp, _free_port(), args, backend, deadline_s)
        context = mp.start_processes(_rank_entry, args=entry_args, nprocs=world_size, join=False)
        end = time.monotonic() + deadline_s + 10.0  # the ranks' own stack dumps come first
        while not context.join(timeout=max(0.0, end - time.monotonic())):
            if time.monotonic() >= end:
                stuck = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
                for p in context.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(
                    f"ranks {stuck} of {world_size} ({backend}) still ran after {deadline_s:.0f} s"
                )
        return [torch.load(os.path.join(tmp, f"{r}.pt"), weights_only=False) for r in range(world_size)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(
    rank: int, fn, world_size: int, tmp: str, port: int, args: tuple, backend: str, deadline_s: float
) -> None:
    faulthandler.dump_traceback_later(deadline_s, exit=False)
    torch.set_num_threads(1)  # the ranks share the test machine's cores
    init = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        init["device_id"] = torch.device("cuda", rank)  # eager NCCL init: a failing link fails here
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=deadline_s),
        **init,
    )
    try:
        result = fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    torch.save(result, os.path.join(tmp, f"{rank}.pt"))
