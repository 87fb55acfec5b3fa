"""Output sites of the real spconv's strided conv (k 2, stride 2) against a direct computation,
on grids below and above 2^31 cells: on the CPU build, spconv 2.3 merges distinct sites above.

    python -m benchmarks.compat.spconv_cpu_sites [--device cpu]

Needs the real spconv (not relconv's shim). For each grid: 4,000 random voxels, spconv's output sites
and features against `floor(p / 2)` and the sum over each output's 2^3 children.
"""

from __future__ import annotations

import argparse
import math

import torch

GRIDS = (([400, 300, 200], 4), ([3892, 2916, 213], 1), ([3892, 2916, 213], 4))


def check(shape: list[int], batch: int, device: str) -> str:
    import spconv.pytorch as spconv

    g = torch.Generator().manual_seed(0)
    n = 4000
    sites = torch.stack([torch.randint(0, s, (n,), generator=g) for s in shape], 1)
    idx = torch.unique(torch.cat([torch.randint(0, batch, (n, 1), generator=g), sites], 1), dim=0).int()
    feats = torch.randn(len(idx), 4, generator=g)
    conv = spconv.SparseConv3d(4, 5, 2, 2, bias=False).to(device)
    y = conv(spconv.SparseConvTensor(feats.to(device), idx.to(device), shape, batch))
    w = conv.weight.detach().double().cpu()  # [C_out, 2, 2, 2, C_in]
    want: dict[tuple, torch.Tensor] = {}
    for (b, x, yy, z), f in zip(idx.tolist(), feats.double(), strict=True):
        o = (b, x // 2, yy // 2, z // 2)
        want[o] = want.get(o, torch.zeros(5, dtype=torch.float64)) + w[:, x % 2, yy % 2, z % 2, :] @ f
    got = {tuple(r): f for r, f in zip(y.indices.cpu().tolist(), y.features.double().cpu(), strict=True)}
    err = max((float((got[k] - want[k]).abs().max()) for k in want if k in got), default=float("nan"))
    cells = math.prod(shape) * batch
    return (
        f"grid {shape} x batch {batch} ({cells:.2e} cells, {'above' if cells > 2**31 else 'below'} 2^31): "
        f"{len(got)} sites, expected {len(want)}, {'same' if set(got) == set(want) else 'DIFFERENT'} set; "
        f"max |feature error| on shared sites {err:.1e}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compat.spconv_cpu_sites", description=__doc__)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.device == "cpu" and not torch.cuda.is_available():
        from benchmarks.peers.spconv_peer import on_cpu_without_cuda

        on_cpu_without_cuda()
    for shape, batch in GRIDS:
        print(check(shape, batch, args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
