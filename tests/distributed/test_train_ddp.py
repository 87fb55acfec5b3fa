"""examples/train_ddp.py on CPU ranks joined by gloo: world size 1 and 2 train alike on the same
global batch, deterministic runs give bitwise-equal parameters on every rank and across reruns, and
a checkpointed run resumed from the middle ends bitwise where an uninterrupted run ends."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import run_ranks

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
STEPS = 4
VOXEL = ["--model", "minkunet", "--device", "cpu", "--scans", "4", "--batch-size", "2", "--beams", "8"]
VOXEL += ["--azimuth-steps", "256", "--voxel-size", "0.4", "--width", "0.25", "--deterministic"]
GRAPH = ["--model", "rgcn", "--graph", "tiny", "--device", "cpu", "--hidden", "8", "--deterministic"]
NEIGHBOR = GRAPH + ["--sampler", "neighbor", "--batch-size", "8", "--num-neighbors", "4"]


def _pythonpath() -> str:
    """The checkout first (a torchrun child imports relconv from it), then the caller's path."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def _steps(n: int) -> list[str]:
    return ["--steps", str(n)]


def train_runs(rank: int, world: int, runs: list) -> list:
    spec = importlib.util.spec_from_file_location("train_ddp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [module.train(argv) for argv in runs]


def _resume_runs(base: list[str], ckpt: Path) -> list:
    """Uninterrupted, rerun, first half with a checkpoint, second half resumed from it."""
    saved = ["--checkpoint", str(ckpt)]
    return [
        base + _steps(STEPS),
        base + _steps(STEPS),
        base + _steps(STEPS // 2) + saved,
        base + _steps(STEPS) + saved + ["--resume"],
    ]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    runs = _resume_runs(VOXEL, tmp / "voxel.pt") + _resume_runs(GRAPH, tmp / "graph.pt")
    return run_ranks(train_runs, 2, runs)


@pytest.fixture(scope="module")
def one_rank():
    return run_ranks(train_runs, 1, [VOXEL + _steps(STEPS), GRAPH + _steps(STEPS)])[0]


def _check_resume(logs: list) -> None:
    full, rerun, first, resumed = logs
    assert len(set(full["parameter_digests"])) == 1, "ranks hold different parameters"
    assert rerun["parameter_digests"] == full["parameter_digests"]
    assert rerun["losses"] == full["losses"]
    assert first["parameter_digests"] != full["parameter_digests"]
    assert resumed["first_step"] == STEPS // 2
    assert resumed["parameter_digests"] == full["parameter_digests"]
    assert resumed["losses"] == full["losses"][STEPS // 2 :]


@pytest.mark.parametrize("task", [0, 1], ids=["minkunet", "rgcn-full"])
def test_deterministic_ranks_reruns_and_resume_are_bitwise(two_ranks, task):
    rank0, rank1 = two_ranks
    logs = rank0[4 * task : 4 * task + 4]
    _check_resume(logs)
    assert rank1[4 * task]["parameter_digests"] == logs[0]["parameter_digests"]
    assert len(logs[0]["losses"]) == STEPS and logs[0]["losses"][-1] < logs[0]["losses"][0]


@pytest.mark.parametrize("task", [0, 1], ids=["minkunet", "rgcn-full"])
def test_world_sizes_agree_on_the_same_global_batch(two_ranks, one_rank, task):
    single, double = one_rank[task], two_ranks[0][4 * task]
    assert single["world_size"] == 1 and double["world_size"] == 2
    # The first step runs the same parameters on the same global batch; later steps differ by the
    # gradients' summation order (per-rank sums, then DDP's average), which training amplifies.
    assert double["losses"][0] == pytest.approx(single["losses"][0], rel=1e-6)
    torch.testing.assert_close(
        torch.tensor(double["losses"]), torch.tensor(single["losses"]), rtol=1e-4, atol=1e-6
    )


def test_ranks_agree_on_relconv_kernel_rule(two_ranks):
    choices = two_ranks[0][0]["rule_choices"]
    assert len(choices) == 2 and choices[0] == choices[1] and len(choices[0]) > 0


def _neighbor_sampling() -> bool:
    import torch_geometric.typing as typing

    return typing.WITH_PYG_LIB or typing.WITH_TORCH_SPARSE


@pytest.mark.skipif(not _neighbor_sampling(), reason="NeighborLoader needs pyg-lib or torch-sparse")
def test_neighbor_loader_resume_is_bitwise(tmp_path):
    logs = run_ranks(train_runs, 2, _resume_runs(NEIGHBOR, tmp_path / "neighbor.pt"))[0]
    _check_resume(logs)


def test_torchrun_launch_matches_spawned_ranks(two_ranks, tmp_path):
    log = tmp_path / "log.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=_pythonpath())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(EXAMPLE)]
    subprocess.run(cmd + VOXEL + _steps(STEPS) + ["--metrics", str(log)], check=True, env=env, timeout=300)
    result = json.loads(log.read_text())
    assert result["world_size"] == 2
    assert result["parameter_digests"] == two_ranks[0][0]["parameter_digests"]


GPU_VOXEL = ["--model", "minkunet", "--device", "cuda", "--scans", "8", "--batch-size", "4", "--beams", "32"]
GPU_VOXEL += ["--azimuth-steps", "1024", "--voxel-size", "0.1", "--width", "0.5", "--deterministic"]
GPU_GRAPH = ["--model", "rgcn", "--device", "cuda", "--graph", "AIFB", "--deterministic"]


def _torchrun(args: list[str], nproc: int, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=_pythonpath())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    subprocess.run(cmd + [str(EXAMPLE)] + args + ["--metrics", str(out)], check=True, env=env, timeout=300)
    return json.loads(out.read_text())


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("model", ["minkunet", "rgcn"])
def test_two_gpus_nccl(tmp_path, model):
    """One and two GPUs train alike on the same global batch; both ranks hold the same parameters;
    MinkUNet reruns and resumes bitwise. R-GCN's graph maps accumulate with atomics on CUDA (README,
    Determinism), so its reruns agree to rounding only."""
    base = (GPU_VOXEL if model == "minkunet" else GPU_GRAPH) + _steps(6)
    one = _torchrun(base, 1, tmp_path / "one.json")
    two = _torchrun(base, 2, tmp_path / "two.json")
    again = _torchrun(base, 2, tmp_path / "again.json")
    assert two["world_size"] == 2 and len(set(two["parameter_digests"])) == 1
    assert two["rule_choices"][0] == two["rule_choices"][1]
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4, abs=1e-5)
    if model == "rgcn":
        assert again["losses"] == pytest.approx(two["losses"], rel=1e-4)
        return
    assert again["parameter_digests"] == two["parameter_digests"]
    ckpt = ["--checkpoint", str(tmp_path / "ckpt.pt")]
    _torchrun((GPU_VOXEL + _steps(3) + ckpt), 2, tmp_path / "first.json")
    resumed = _torchrun(base + ckpt + ["--resume"], 2, tmp_path / "resumed.json")
    assert resumed["parameter_digests"] == two["parameter_digests"]
    assert resumed["losses"] == two["losses"][3:]
