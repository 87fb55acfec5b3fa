"""Point-wise classification of real airborne LiDAR with MinkUNet, through relconv and its peers.

    python examples/train_lidar_seg.py --backend relconv,torchsparse,spconv --out results/lidar_seg

Data: the two labelled tiles laspy's sdist ships (`relconv.datasets.lidar.laspy_tile`, fetched with
`pip download` into ~/.cache/relconv; reading LAZ needs `pip install laspy lazrs`):
append-bug.laz (37,805 points; ground, low/medium/high vegetation, bridge deck, ...) and
autzen_trim.laz (110,000 points; ground and unclassified). Classes: ASPRS 2 ground, 3/4/5 low/
medium/high vegetation, 17 bridge deck, everything else "other".

Split: each tile is cut into square blocks of `--block` metres; a fixed diagonal pattern of blocks
((ix + iy) % 3 == 0 on the block grid) is held out for validation, the rest trains. The bridge deck
lies in training blocks only, so it has no IoU; mIoU averages the classes validation contains. Points are
voxelised at `--voxel` metres per block (block-local, non-negative coordinates); features per voxel
are the mean of the points' (height above the block's lowest point / 10 m, intensity / the tile's
99th percentile, return number / number of returns, 1).

Backends: the same MinkUNet (relconv.voxel.models.MinkUNet: channels, kernel sizes, blocks) through
relconv, through TorchSparse++ 2.1 (its SparseResUNet42) and through spconv 2.3 (relconv's
skeleton on spconv layers), the peers built by benchmarks/peers and started from relconv's initial
weights converted to their layouts (benchmarks/peers/layouts.py). Same seed, batches, optimizer and
schedule for every backend; fp32 without TF32 everywhere. Before training, each peer's eval-mode
logits are compared with relconv's on one validation batch (`initial_max_abs_diff`).

Output in --out: `{backend}.json` (per-epoch loss, per-class IoU, mIoU, train seconds per epoch),
`summary.json` (every backend's JSON found in --out) and `lidar_seg.png` (mIoU and time per epoch,
when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
CLASSES = ("other", "ground", "low vegetation", "medium vegetation", "high vegetation", "bridge deck")
ASPRS = {2: 1, 3: 2, 4: 3, 5: 4, 17: 5}  # ASPRS code -> class; every other code is "other"
BACKENDS = ("relconv", "torchsparse", "spconv")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="relconv", help=f"comma-separated, from {', '.join(BACKENDS)}")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=4, help="blocks per step")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="AdamW or SGD with momentum")
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--width", type=float, default=0.5, help="MinkUNet channel multiplier")
    p.add_argument("--block", type=float, default=100.0, help="block edge in metres")
    p.add_argument("--voxel", type=float, default=2.0, help="voxel edge in metres")
    p.add_argument("--max-blocks", type=int, default=0, help="use the first N blocks per split (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    bad = [b for b in args.backends if b not in BACKENDS]
    if bad or not args.backends:
        p.error(f"--backend must name some of {BACKENDS}, got {args.backend!r}")
    if args.epochs < 1 or args.batch_size < 1 or args.block <= 0 or args.voxel <= 0:
        p.error("--epochs, --batch-size, --block and --voxel must be positive")
    return args


# ---------------------------------------------------------------------------- data


def load_blocks(block: float, voxel: float, device: torch.device) -> dict[str, list[dict]]:
    """{"train": [...], "val": [...]}: voxelised blocks of both tiles, in a fixed order."""
    from relconv.datasets.lidar import LASPY_TILES, laspy_tile
    from relconv.voxel import voxelize

    splits: dict[str, list[dict]] = {"train": [], "val": []}
    for name in LASPY_TILES:
        tile = laspy_tile(name)
        xyz = tile["xyz"]
        labels = np.zeros(len(xyz), dtype=np.int64)
        for code, cls in ASPRS.items():
            labels[tile["classification"] == code] = cls
        scale = max(float(np.percentile(tile["intensity"], 99)), 1.0)
        intensity = np.clip(tile["intensity"] / scale, 0.0, 1.0)
        returns = tile["return_number"] / np.maximum(tile["number_of_returns"], 1)
        cell = np.floor((xyz[:, :2] - xyz[:, :2].min(0)) / block).astype(np.int64)
        for ix, iy in sorted({tuple(c) for c in cell.tolist()}):
            rows = np.nonzero((cell[:, 0] == ix) & (cell[:, 1] == iy))[0]
            if rows.size < 16:
                continue
            local = xyz[rows] - xyz[rows].min(0)
            feats = np.stack(
                [local[:, 2] / 10.0, intensity[rows], returns[rows], np.ones(rows.size)], 1
            ).astype(np.float32)
            pts = torch.from_numpy(local.astype(np.float32)).to(device)
            v = voxelize(pts, voxel, feats=torch.from_numpy(feats).to(device))
            split = "val" if (ix + iy) % 3 == 0 else "train"
            splits[split].append(
                {
                    "feats": v.tensor.feats,
                    "coords": v.tensor.coords,
                    "point_to_voxel": v.point_to_voxel,
                    "labels": torch.from_numpy(labels[rows]).to(device),
                    "tile": name,
                    "cell": (ix, iy),
                }
            )
    return splits


def collate(blocks: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(voxel feats [N, 4], int32 coords [N, 4] with the batch column set, point -> voxel row,
    point labels) of several blocks."""
    feats, coords, rows, labels, offset = [], [], [], [], 0
    for b, blk in enumerate(blocks):
        c = blk["coords"].clone()
        c[:, 0] = b
        feats.append(blk["feats"])
        coords.append(c)
        rows.append(blk["point_to_voxel"] + offset)
        labels.append(blk["labels"])
        offset += len(c)
    return torch.cat(feats), torch.cat(coords), torch.cat(rows), torch.cat(labels)


# ---------------------------------------------------------------------------- backends


def build(backend: str, width: float, seed: int, device: torch.device):
    """(model, make_input(feats, coords, batch_size)) for `backend`, at relconv's initial weights
    for `seed`; also the relconv model itself (for the initial agreement check)."""
    from relconv.voxel import VoxelTensor
    from relconv.voxel.models import MinkUNet

    torch.manual_seed(seed)
    reference = MinkUNet(in_channels=4, num_classes=len(CLASSES), width=width).to(device)
    if backend == "relconv":
        return reference, (lambda f, c, bs: VoxelTensor(f, c)), reference
    sys.path.insert(0, str(REPO))  # the peers' MinkUNet definitions live with the benchmarks
    if backend == "torchsparse":
        if device.type != "cuda":
            raise RuntimeError("TorchSparse 2.1's convs run on CUDA only; use --device cuda")
        from benchmarks.peers import torchsparse as ts

        ok, why = ts.available()
        if not ok:
            raise RuntimeError(f"TorchSparse++ is {why}")
        import torchsparse.backends

        torchsparse.backends.allow_tf32 = False  # true fp32, as relconv and spconv run
        model = ts.TorchSparseMinkUNet(4, len(CLASSES), width).to(device)
        ts.copy_weights(reference, model)
        return model, (lambda f, c, bs: ts.sparse_tensor(f, c, bs)), reference
    from benchmarks.peers import spconv_peer as sp
    from benchmarks.peers.minkunet import PeerMinkUNet, copy_weights

    ok, why = sp.available()
    if not ok:
        raise RuntimeError(f"spconv is {why}")
    if device.type == "cpu" and not torch.cuda.is_available():
        sp.on_cpu_without_cuda()
    backend_impl = sp.SpconvBackend()
    model = PeerMinkUNet(backend_impl, 4, len(CLASSES), width).to(device)
    copy_weights(reference, model)
    return model, backend_impl.tensor, reference


def confusion(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    k = len(CLASSES)
    return torch.bincount(target * k + pred, minlength=k * k).reshape(k, k).cpu()


def iou(conf: torch.Tensor) -> list[float | None]:
    """Per-class IoU (rows: ground truth); None for a class without ground-truth points."""
    tp = conf.diag().double()
    union = conf.sum(0).double() + conf.sum(1).double() - tp
    return [float(t / u) if n > 0 else None for t, u, n in zip(tp, union, conf.sum(1), strict=True)]


def run_backend(backend: str, args, splits: dict, device: torch.device) -> dict:
    from relconv.voxel import VoxelTensor

    model, make_input, reference = build(backend, args.width, args.seed, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    train, val = splits["train"], splits["val"]
    initial_diff = None
    if backend != "relconv":
        feats, coords, _, _ = collate(val[: args.batch_size])
        with torch.no_grad():
            reference.eval()
            model.eval()
            ref = reference(VoxelTensor(feats, coords))
            initial_diff = float((model(make_input(feats, coords, args.batch_size)) - ref).abs().max())
    del reference
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs * steps_per_epoch)
    history = []
    for epoch in range(args.epochs):
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        model.train()
        sync()
        t0 = time.perf_counter()
        total, count = 0.0, 0
        for s in range(steps_per_epoch):
            blocks = [train[i] for i in order[s * args.batch_size : (s + 1) * args.batch_size].tolist()]
            feats, coords, rows, labels = collate(blocks)
            logits = model(make_input(feats, coords, len(blocks)))
            loss = F.cross_entropy(logits.index_select(0, rows), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total = total + loss.detach() * labels.numel()  # read once an epoch: no per-step sync
            count += labels.numel()
        sync()
        seconds = time.perf_counter() - t0
        model.eval()
        conf = torch.zeros(len(CLASSES), len(CLASSES), dtype=torch.int64)
        with torch.no_grad():
            for s in range(0, len(val), args.batch_size):
                feats, coords, rows, labels = collate(val[s : s + args.batch_size])
                logits = model(make_input(feats, coords, len(val[s : s + args.batch_size])))
                conf += confusion(logits.index_select(0, rows).argmax(1), labels)
        ious = iou(conf)
        present = [x for x in ious if x is not None]
        history.append(
            {
                "epoch": epoch + 1,
                "train_loss": float(total) / count,
                "train_seconds": seconds,
                "iou": dict(zip(CLASSES, ious, strict=True)),
                "miou": sum(present) / len(present),
                "accuracy": float(conf.diag().sum() / conf.sum()),
            }
        )
        h = history[-1]
        print(
            f"{backend} epoch {epoch + 1}: loss {h['train_loss']:.4f}, mIoU {h['miou']:.4f}, {seconds:.2f} s"
        )
    return {
        "backend": backend,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "backends", "backend")},
        "train_blocks": len(train),
        "val_blocks": len(val),
        "val_points_per_class": dict(zip(CLASSES, class_counts(val), strict=True)),
        "initial_max_abs_diff": initial_diff,
        "epochs": history,
        "final_miou": history[-1]["miou"],
        # Validation mIoU moves by several points between epochs on this small set: the mean of the
        # last five epochs and the best epoch are steadier grounds for comparing backends.
        "last5_mean_miou": float(np.mean([h["miou"] for h in history[-5:]])),
        "best_miou": max(h["miou"] for h in history),
        "median_train_seconds_per_epoch": float(np.median([h["train_seconds"] for h in history])),
    }


def class_counts(blocks: list[dict]) -> list[int]:
    labels = torch.cat([b["labels"] for b in blocks])
    return torch.bincount(labels, minlength=len(CLASSES)).tolist()


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        epochs = [h["epoch"] for h in r["epochs"]]
        ax1.plot(epochs, [h["miou"] for h in r["epochs"]], label=r["backend"])
        ax2.plot(epochs, [h["train_seconds"] for h in r["epochs"]], label=r["backend"])
    ax1.set(xlabel="epoch", ylabel="validation mIoU", title="MinkUNet on laspy's labelled tiles")
    ax2.set(xlabel="epoch", ylabel="train seconds per epoch", title=results[0]["device"])
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda") if use_cuda else torch.device("cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    splits = load_blocks(args.block, args.voxel, device)
    if args.max_blocks:
        splits = {k: v[: args.max_blocks] for k, v in splits.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for backend in args.backends:
        result = run_backend(backend, args, splits, device)
        (args.out / f"{backend}.json").write_text(json.dumps(result, indent=1))
        results.append(result)
    found = [
        json.loads((args.out / f"{b}.json").read_text())
        for b in BACKENDS
        if (args.out / f"{b}.json").exists()
    ]
    summary = {
        r["backend"]: {
            "final_miou": r["final_miou"],
            "last5_mean_miou": r["last5_mean_miou"],
            "best_miou": r["best_miou"],
            "final_iou": r["epochs"][-1]["iou"],
            "median_train_seconds_per_epoch": r["median_train_seconds_per_epoch"],
            "initial_max_abs_diff": r["initial_max_abs_diff"],
            "device": r["device"],
        }
        for r in found
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(found, args.out / "lidar_seg.png")
    return results


if __name__ == "__main__":
    main()
