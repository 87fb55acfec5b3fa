"""The test launcher turns a rank stuck in a collective into a failure, not a hung test run."""

import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.distributed.launch import run_ranks


def _rank_one_never_joins(rank: int, world: int) -> int:
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(60)
    return rank


def test_stuck_rank_fails_within_the_deadline():
    start = time.monotonic()
    with pytest.raises((TimeoutError, mp.ProcessRaisedException)):
        run_ranks(_rank_one_never_joins, 2, deadline_s=3)
    assert time.monotonic() - start < 40
