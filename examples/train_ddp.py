"""Data-parallel training of a relconv MinkUNet or R-GCN with torch.distributed, one process per GPU.

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --model minkunet
    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --model rgcn --graph AM --sampler neighbor
    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --model minkunet --device cpu   # gloo

Several nodes run the same script (docs/distributed.md):
    torchrun --nnodes N --nproc_per_node G --rdzv_backend c10d --rdzv_endpoint HOST:PORT \
        examples/train_ddp.py ...

DistributedDataParallel averages the gradients, `relconv.voxel.convert_sync_batchnorm` makes the
voxel BatchNorms use statistics over all ranks (on any backend; torch's converter works on CUDA too)
and `DistributedSampler` shards the samples. The loss of every rank is its summed loss divided by
the global row count (points or labelled nodes) times the world size, so that DDP's gradient average
is the gradient of the mean over the global batch: the same global batch gives the same training at
any world size, up to floating-point summation order.

`--deterministic` turns on torch's deterministic algorithms (relconv then runs its fixed-order
kernels); data augmentation draws from a generator seeded by (seed, epoch, sample), so it does not
depend on the world size or on what ran before. `--checkpoint PATH` saves the model, optimizer, step
and every rank's RNG states (torch, CUDA, numpy, Python) every `--checkpoint-every` steps and at the
end; `--resume` continues from it, bitwise identically to an uninterrupted run in deterministic mode
with the same world size.

`--model minkunet`: point-wise segmentation of synthetic rotating-LiDAR street scans
(`relconv.voxel.synthetic.raycast_scan`) into ground / objects below 2 m / structures above 2 m.
`--model rgcn`: node classification on a synthetic knowledge graph with the statistics of the R-GCN
benchmark sets (benchmarks/workloads/graphs.py: tiny, AIFB, MUTAG, BGS, AM), full-graph or with PyG's
`NeighborLoader` (needs pyg-lib or torch-sparse for the sampling).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from relconv.voxel import convert_sync_batchnorm

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("minkunet", "rgcn"), default="minkunet")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in total (resume included)")
    p.add_argument("--batch-size", type=int, default=8, help="GLOBAL batch: scans or seed nodes per step")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--lr", type=float, default=None, help="default: 0.05 (sgd), 0.01 (adam)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument(
        "--sync-bn",
        choices=("relconv", "torch", "off"),
        default="relconv",
        help="BatchNorm statistics over all ranks through relconv's or torch's converter (both then "
        "run relconv's collectives), or per rank (off)",
    )
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--checkpoint-every", type=int, default=0, help="0: only at the end")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint when it exists")
    p.add_argument("--metrics", type=Path, default=None, help="JSON with the per-step losses (rank 0)")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="folder for a torch.profiler summary of the last --profile-steps steps, one file per rank",
    )
    p.add_argument("--profile-steps", type=int, default=5)
    g = p.add_argument_group("minkunet")
    g.add_argument("--scans", type=int, default=64, help="synthetic scans in the training set")
    g.add_argument("--beams", type=int, default=32)
    g.add_argument("--azimuth-steps", type=int, default=1024)
    g.add_argument("--voxel-size", type=float, default=0.1)
    g.add_argument("--width", type=float, default=1.0, help="MinkUNet channel multiplier")
    g = p.add_argument_group("rgcn")
    g.add_argument("--graph", choices=("tiny", "AIFB", "MUTAG", "BGS", "AM"), default="AIFB")
    g.add_argument("--sampler", choices=("full", "neighbor"), default="full")
    g.add_argument("--num-neighbors", type=int, default=10, help="per layer, with --sampler neighbor")
    g.add_argument("--hidden", type=int, default=16)
    g.add_argument("--num-bases", type=int, default=30)
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        p.error("--steps and --batch-size must be positive")
    if args.profile is not None and not 0 < args.profile_steps <= args.steps:
        p.error("--profile-steps must lie in [1, --steps]")
    if args.resume and args.checkpoint is None:
        p.error("--resume needs --checkpoint")
    if args.lr is None:
        args.lr = 0.05 if args.optimizer == "sgd" else 0.01
    return args


# ---------------------------------------------------------------------------- process group, RNG


def setup_distributed(device_arg: str) -> tuple[int, int, torch.device]:
    """(rank, world size, device). Joins the process group torchrun describes in the environment
    (NCCL on GPUs, gloo on CPU) unless one exists; a plain `python` launch is world size 1."""
    use_cuda = device_arg == "cuda" or (device_arg == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized() and "RANK" in os.environ:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    if not dist.is_initialized():
        return 0, 1, torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def set_determinism(seed: int, rank: int, deterministic: bool) -> None:
    """Seeds every generator (per rank, so rank-local sampling differs) and, in deterministic mode,
    makes torch and relconv pick fixed-order kernels."""
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed + rank)
    if deterministic:
        # cuBLAS reads this when it creates its first handle: before any matmul.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def rng_states(device: torch.device) -> dict:
    states = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_states(states: dict, device: torch.device) -> None:
    """Restores `rng_states`; the generator states are CPU byte tensors whatever device the
    checkpoint was loaded onto."""
    torch.set_rng_state(states["torch"].cpu())
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"].cpu(), device)


def all_ranks(obj, world: int) -> list:
    """Every rank's `obj`, in rank order."""
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def global_total(value: torch.Tensor, world: int) -> torch.Tensor:
    """The sum over ranks of a float64 scalar tensor, left on the device (no host read)."""
    if world > 1:
        dist.all_reduce(value)
    return value


def rule_choices() -> list:
    """relconv's kernel choice for every layer width and dtype of these models: `resolve_dataflow`
    is a rule over dtypes, map properties, width and torch's global switches (no autotuning, no
    timing), so the ranks agree whenever those switches agree; the agreement is checked at start."""
    from relconv.ops import Dataflow, resolve_dataflow

    return [
        resolve_dataflow(Dataflow.AUTO, dtype, unique, scale, width).value
        for dtype in (torch.float16, torch.bfloat16, torch.float32)
        for unique, scale in ((True, False), (False, True))
        for width in (1, 8, 16, 24, 32, 48, 64, 96, 128, 256)
    ]


def start_profiler(device: torch.device):
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    profiler.start()
    return profiler


def write_profile(profiler, folder: Path, rank: int, steps: int, device: torch.device) -> None:
    """The profiled steps' operators by self device time and by self host time (host syncs show
    as cudaStreamSynchronize / cudaMemcpyAsync rows, collectives as nccl kernels)."""
    profiler.stop()
    folder.mkdir(parents=True, exist_ok=True)
    events = profiler.key_averages()
    keys = (["self_device_time_total"] if device.type == "cuda" else []) + ["self_cpu_time_total"]
    with open(folder / f"rank{rank}.txt", "w") as f:
        f.write(f"rank {rank}: the last {steps} steps\n")
        for key in keys:
            f.write(f"\nby {key}\n" + events.table(sort_by=key, row_limit=30) + "\n")


def summed_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over rows. Written as log_softmax + gather because torch's NLLLoss on
    CUDA refuses `torch.use_deterministic_algorithms(True)`; gather's backward has a deterministic
    CUDA path."""
    return -F.log_softmax(logits.float(), 1).gather(1, target[:, None]).sum()


# ---------------------------------------------------------------------------- MinkUNet task

GROUND, LOW, HIGH = 0, 1, 2


class SyntheticScans(torch.utils.data.Dataset):
    """Synthetic street scans with point labels by height above the ground plane: ground, objects
    below 2 m (cars, pole bases), structures above 2 m (facades, pole tops)."""

    def __init__(self, count: int, beams: int, azimuth_steps: int, seed: int) -> None:
        from relconv.voxel.synthetic import SENSOR_HEIGHT, raycast_scan

        self.scans = []
        for i in range(count):
            points, intensity = raycast_scan(beams, seed * 100_003 + i, azimuth_steps)
            height = points[:, 2] + SENSOR_HEIGHT
            labels = np.where(height < 0.15, GROUND, np.where(height < 2.0, LOW, HIGH))
            self.scans.append((points, intensity, labels.astype(np.int64)))

    def __len__(self) -> int:
        return len(self.scans)

    def __getitem__(self, i: int):
        return i, self.scans[i]


def augment(points: np.ndarray, seed: int, epoch: int, index: int) -> np.ndarray:
    """A rotation about z and a flip, drawn from (seed, epoch, sample): independent of rank and history."""
    rng = np.random.default_rng([seed, epoch, index])
    angle = rng.uniform(0.0, 2.0 * np.pi)
    c, s = np.cos(angle), np.sin(angle)
    flip = 1.0 if rng.random() < 0.5 else -1.0
    rot = np.array([[c, -s * flip, 0.0], [s, c * flip, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32)
    return points @ rot.T


class VoxelTask:
    num_classes = 3

    def __init__(self, args, rank: int, world: int, device: torch.device) -> None:
        from relconv.voxel.models import MinkUNet

        if args.batch_size % world:
            raise ValueError(f"--batch-size ({args.batch_size}) must be a multiple of the world size {world}")
        if args.scans % args.batch_size:
            raise ValueError(f"--scans ({args.scans}) must be a multiple of --batch-size ({args.batch_size})")
        self.args, self.world, self.device = args, world, device
        self.data = SyntheticScans(args.scans, args.beams, args.azimuth_steps, args.seed)
        self.sampler = DistributedSampler(self.data, world, rank, seed=args.seed, drop_last=True)
        self.per_rank = args.batch_size // world
        self.steps_per_epoch = args.scans // args.batch_size
        self.model = MinkUNet(in_channels=4, num_classes=self.num_classes, width=args.width)

    def batches(self, epoch: int, skip: int):
        """This rank's batches of `epoch`, the first `skip` left out (a resumed epoch)."""
        self.sampler.set_epoch(epoch)
        order = list(self.sampler)
        for b in range(skip, self.steps_per_epoch):
            yield [self.data[i] for i in order[b * self.per_rank : (b + 1) * self.per_rank]], epoch

    def loss(self, model: nn.Module, batch) -> tuple[torch.Tensor, int]:
        """(this rank's summed loss, this rank's point count)."""
        from relconv.voxel import collate, devoxelize, voxelize

        samples, epoch = batch
        voxels, point_rows, labels, offset = [], [], [], 0
        for index, (points, intensity, label) in samples:
            pts = torch.from_numpy(augment(points, self.args.seed, epoch, index)).to(self.device)
            feats = torch.cat([pts, torch.from_numpy(intensity).to(self.device)[:, None]], 1)
            v = voxelize(pts, self.args.voxel_size, feats=feats)
            voxels.append(v.tensor)
            point_rows.append(v.point_to_voxel + offset)
            labels.append(torch.from_numpy(label).to(self.device))
            offset += len(v.tensor)
        logits = devoxelize(model(collate(voxels)), torch.cat(point_rows))
        target = torch.cat(labels)
        return summed_cross_entropy(logits, target), target.numel()


# ---------------------------------------------------------------------------- R-GCN task


class RGCN(nn.Module):
    """Node embedding -> R-GCN -> ReLU -> R-GCN (basis-decomposed relation weights)."""

    def __init__(self, num_nodes: int, num_relations: int, hidden: int, num_classes: int, num_bases: int):
        from relconv.graph import RGCNConv

        super().__init__()
        self.embedding = nn.Embedding(num_nodes, hidden)
        bases = min(num_bases, num_relations)
        self.conv1 = RGCNConv(hidden, hidden, num_relations, num_bases=bases)
        self.conv2 = RGCNConv(hidden, num_classes, num_relations, num_bases=bases)

    def forward(self, node_ids: torch.Tensor, edge_index: torch.Tensor, edge_type: torch.Tensor):
        h = F.relu(self.conv1(self.embedding(node_ids), edge_index, edge_type))
        return self.conv2(h, edge_index, edge_type)


class GraphTask:
    def __init__(self, args, rank: int, world: int, device: torch.device) -> None:
        sys.path.insert(0, str(REPO))  # the KG generator lives with the benchmarks
        from benchmarks.workloads.graphs import STATS, make_kg

        edge_index, edge_type, num_nodes, num_relations, labels = make_kg(args.graph, seed=args.seed)
        self.args, self.rank, self.world, self.device = args, rank, world, device
        self.num_nodes = num_nodes
        labelled = torch.nonzero(labels >= 0).flatten()
        order = torch.randperm(labelled.numel(), generator=torch.Generator().manual_seed(args.seed))
        self.train_nodes = labelled[order[: int(0.8 * labelled.numel())]]
        self.labels = labels.to(device)
        self.edge_index, self.edge_type = edge_index.to(device), edge_type.to(device)
        classes = STATS[args.graph].num_classes
        self.model = RGCN(num_nodes, num_relations, args.hidden, classes, args.num_bases)
        if args.sampler == "full":
            # Full graph: every rank runs the whole graph and takes the loss over its shard of the
            # training nodes; one step per epoch.
            self.steps_per_epoch = 1
            self.shard = self.train_nodes[rank::world].to(device)
        else:
            per_rank = self.train_nodes.numel() // world  # equal shards: equal step counts per rank
            if per_rank < 1 or args.batch_size % world:
                raise ValueError("--batch-size must be a multiple of the world size, and ranks need nodes")
            self.shard = self.train_nodes[rank * per_rank : (rank + 1) * per_rank]
            self.per_rank_batch = args.batch_size // world
            self.steps_per_epoch = -(-per_rank // self.per_rank_batch)

    def batches(self, epoch: int, skip: int):
        if self.args.sampler == "full":
            if skip == 0:
                yield None
            return
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader

        data = Data(edge_index=self.edge_index.cpu(), edge_type=self.edge_type.cpu())
        data.num_nodes = self.num_nodes
        # The loader's shuffle and neighbour draws come from torch's generator, seeded per
        # (seed, rank, epoch): a resumed epoch replays its first `skip` batches and so continues
        # with the draws of the uninterrupted run.
        torch.manual_seed(self.args.seed * 1_000_003 + self.rank * 10_007 + epoch)
        loader = NeighborLoader(
            data,
            num_neighbors=[self.args.num_neighbors] * 2,
            input_nodes=self.shard,
            batch_size=self.per_rank_batch,
            shuffle=True,
        )
        for b, sub in enumerate(loader):
            if b >= skip:
                yield sub

    def loss(self, model: nn.Module, batch) -> tuple[torch.Tensor, int]:
        if batch is None:
            logits = model(torch.arange(self.num_nodes, device=self.device), self.edge_index, self.edge_type)
            nodes = self.shard
            logits = logits.index_select(0, nodes)
        else:
            sub = batch.to(self.device)
            logits = model(sub.n_id, sub.edge_index, sub.edge_type)[: sub.batch_size]
            nodes = sub.n_id[: sub.batch_size]
        return summed_cross_entropy(logits, self.labels[nodes]), nodes.numel()


# ---------------------------------------------------------------------------- training loop


def parameter_digest(model: nn.Module) -> str:
    """SHA-256 of every parameter and buffer's bytes: equal digests mean bitwise-equal models."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(path: Path, model: nn.Module, optimizer, step: int, world: int, device) -> None:
    states = all_ranks(rng_states(device), world)  # every rank's generators, saved by rank 0
    if not dist.is_initialized() or dist.get_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "world_size": world,
                "rng": states,
            },
            tmp,
        )
        tmp.replace(path)  # a crash mid-write leaves the previous checkpoint intact
    if world > 1:
        dist.barrier()


def train(argv: list[str] | None = None) -> dict:
    """Trains as the command line says; returns the run's metrics (rank 0 also writes them to --metrics)."""
    args = parse_args(argv)
    rank, world, device = setup_distributed(args.device)
    set_determinism(args.seed, rank, args.deterministic)
    choices = all_ranks(rule_choices(), world)
    if any(c != choices[0] for c in choices):
        raise RuntimeError("ranks disagree on relconv's kernel rule; check torch's global switches per rank")

    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    task = (VoxelTask if args.model == "minkunet" else GraphTask)(args, rank, world, device)
    torch.manual_seed(args.seed + rank)
    model = task.model.to(device)
    if world > 1 and args.sync_bn == "relconv":
        model = convert_sync_batchnorm(model)
    elif world > 1 and args.sync_bn == "torch":
        if device.type != "cuda":
            raise ValueError(
                "--sync-bn torch needs CUDA: DDP takes torch's SyncBatchNorm in GPU modules only"
            )
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    step = 0
    if args.resume and args.checkpoint.exists():
        ckpt = torch.load(args.checkpoint, map_location=device, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
        if ckpt["world_size"] == world:
            set_rng_states(ckpt["rng"][rank], device)
        elif rank == 0:
            print(f"checkpoint from world size {ckpt['world_size']}: generators reseeded, not restored")

    wrapped = model
    if world > 1:
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    wrapped.train()
    losses, times = [], []
    start = step
    # The profiler is started last: once attached, it slows every later CUDA call of the process.
    profiler = None
    while step < args.steps:
        epoch, skip = divmod(step, task.steps_per_epoch)
        for batch in task.batches(epoch, skip):
            if args.profile is not None and profiler is None and step >= args.steps - args.profile_steps:
                profiler = start_profiler(device)
            t0 = time.perf_counter()
            summed, local_count = task.loss(wrapped, batch)
            # The global count and the loss stay on the device until the step's end: a host read
            # before the backward would stall the queue and hold every rank to the slowest.
            count = global_total(torch.full((), local_count, dtype=torch.float64, device=device), world)
            optimizer.zero_grad(set_to_none=True)
            (summed * (world / count)).backward()  # DDP divides by world: the global mean's gradient
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
            losses.append(float(global_total(summed.detach().double(), world) / count))
            step += 1
            if rank == 0:
                print(f"step {step:5d}  loss {losses[-1]:.6f}  {times[-1] * 1e3:.1f} ms", flush=True)
            if args.checkpoint is not None and args.checkpoint_every and step % args.checkpoint_every == 0:
                save_checkpoint(args.checkpoint, model, optimizer, step, world, device)
            if step >= args.steps:
                break
    if args.checkpoint is not None:
        save_checkpoint(args.checkpoint, model, optimizer, step, world, device)
    if profiler is not None:
        write_profile(profiler, args.profile, rank, args.profile_steps, device)

    digests = all_ranks(parameter_digest(model), world)
    log = {
        "model": args.model,
        "world_size": world,
        "device": str(device),
        "first_step": start,
        "losses": losses,
        "step_seconds": times,
        "profiled_steps": args.profile_steps if args.profile is not None else 0,
        "parameter_digests": digests,
        "rule_choices": choices,
    }
    if rank == 0 and args.metrics is not None:
        args.metrics.parent.mkdir(parents=True, exist_ok=True)
        args.metrics.write_text(json.dumps(log, indent=1))
    return log


def main() -> None:
    train()
    # DDP's reducer sits in reference cycles; freed only at exit, after the process group, its
    # pending gloo work can abort the process ("terminate called without an active exception").
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
