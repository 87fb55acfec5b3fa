"""Host instructions per cached layer call: relconv's native `Conv3d` against the same conv through
`relconv.spconv` (`SubMConv3d`) and `relconv.torchsparse` (`nn.Conv3d`); a stride-2 conv through
relconv's native layer and spconv's (`SparseConv3d`, padding 1); and an eval-mode conv -> BatchNorm
-> ReLU block through relconv's `Sequential` and TorchSparse's (a torch `nn.Sequential`), folded and
not.

    python -m benchmarks.compat.host_instructions [--reps 400]

Each layer runs on 20 voxels with 16 channels on the CPU (so the kernel's own work is small and the
count is the Python and dispatch path a GPU host also pays), without autograd, after 20 warm-up
calls. `valgrind --tool=callgrind` counts the instructions of a process that makes `--reps` more calls
than another; the difference over `--reps` is the cost of one call. Instruction counts do not depend
on the machine's load, unlike times on a shared host. Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch

LAYERS = ("native", "spconv", "torchsparse", "native-strided", "spconv-strided")
# conv -> BatchNorm -> ReLU in eval mode: relconv's Sequential and TorchSparse's nn.Sequential, both
# folding the norm and ReLU into the conv, and TorchSparse's run layer by layer
BLOCKS = ("native-block", "torchsparse-block", "torchsparse-block-unfolded")


def run_layer(which: str, reps: int) -> torch.Tensor:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n, c = 20, 16
    xyz = torch.randint(0, 12, (n, 3), generator=g)
    coords = torch.unique(torch.cat([torch.zeros(n, 1, dtype=torch.long), xyz], 1), dim=0).int()
    feats = torch.randn(coords.shape[0], c, generator=g)
    stride = 2 if which.endswith("-strided") else 1
    if which == "native-block":
        from relconv.voxel import BatchNorm, Conv3d, ReLU, Sequential, VoxelTensor

        layer, x = Sequential(Conv3d(c, c, 3), BatchNorm(c), ReLU()).eval(), VoxelTensor(feats, coords)
    elif which.startswith("torchsparse-block"):
        import relconv.torchsparse as torchsparse
        import relconv.torchsparse.nn as spnn

        layer = torch.nn.Sequential(spnn.Conv3d(c, c, 3), spnn.BatchNorm(c), spnn.ReLU(True)).eval()
        x = torchsparse.SparseTensor(feats, coords)
    elif which.startswith("native"):
        from relconv.voxel import Conv3d, VoxelTensor

        layer, x = Conv3d(c, c, 3, stride=stride), VoxelTensor(feats, coords)
    elif which.startswith("spconv"):
        import relconv.spconv as spconv

        conv = spconv.SubMConv3d(c, c, 3, bias=False) if stride == 1 else None
        conv = conv or spconv.SparseConv3d(c, c, 3, stride=stride, padding=1, bias=False)
        layer, x = conv, spconv.SparseConvTensor(feats, coords, [12] * 3, 1)
    else:
        import relconv.torchsparse as torchsparse
        import relconv.torchsparse.nn as spnn

        layer, x = spnn.Conv3d(c, c, 3), torchsparse.SparseTensor(feats, coords)
    # The output's features are read: a TorchSparse conv without autograd runs when first used.
    features = {"spconv": "features", "torchsparse": "F"}.get(which.split("-")[0], "feats")
    from relconv.voxel import inference_folding

    with torch.no_grad(), inference_folding(not which.endswith("-unfolded")):
        for _ in range(20 + reps):
            out = getattr(layer(x), features)
    return out


def count(which: str, reps: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out"]
        cmd += [sys.executable, "-m", "benchmarks.compat.host_instructions", "--child", which, str(reps)]
        env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count for {which}: {done.stderr[-500:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compat.host_instructions", description=__doc__)
    p.add_argument("--reps", type=int, default=400)
    p.add_argument("--child", nargs=2, metavar=("LAYER", "REPS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        run_layer(args.child[0], int(args.child[1]))
        return 0
    per_call = {}
    for which in LAYERS + BLOCKS:
        per_call[which] = (count(which, args.reps) - count(which, 0)) / args.reps
    for which in LAYERS + BLOCKS:
        native = (
            "native-block" if "-block" in which else "native-strided" if "-strided" in which else "native"
        )
        ratio = per_call[which] / per_call[native]
        print(f"{which:<27} {per_call[which] / 1e3:8.1f}k instructions per call  ({ratio:.2f}x {native})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
