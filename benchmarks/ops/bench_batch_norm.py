"""Benchmark of `relconv.ops.batch_norm_act` (BatchNorm + ReLU, a training forward and backward)
against torch's `batch_norm` followed by `relu`, in GPU kernel time.

Shapes `[rows, channels]` default to the BatchNorm inputs of TorchSparse's `SparseResNet21D` on four
64-beam scans (weighted by how often each occurs, they give a training step's total) and others: a
million-voxel aggregate at C16 and C64, a dense room at C128, few rows at C256, and tiny batches
whose cost is the launch. Each row first checks the output and the input, weight and bias
gradients of both against a float64 torch reference that applies the ReLU mask of the output
under test (an output within rounding of zero may fall on either side, and one such element
moves its input gradient by a whole `weight * grad / std`), then profiles `--steps` steps and reports
the kernel microseconds of a step (the profiler's kernel time over the steps, divided by them),
per kernel and in total.

    python -m benchmarks.ops.bench_batch_norm                        # GPU, default shapes
    python -m benchmarks.ops.bench_batch_norm --dtypes fp16 --shapes 172174x64,73419x128
    python -m benchmarks.ops.bench_batch_norm --device cpu --tiny    # CI smoke: rows and agreement

On CPU relconv's op is torch's own BatchNorm; the rows there check agreement only.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from relconv.ops import batch_norm_act

# SparseResNet21D's BatchNorm inputs on four 64-beam scans (273k voxels), with their counts.
R21D_SHAPES = {(273364, 16): 5, (265421, 32): 5, (172174, 64): 5, (73419, 128): 5, (56846, 128): 1}
OTHER_SHAPES = {
    (1180000, 16): 1,
    (1180000, 64): 1,
    (262000, 128): 1,
    (30000, 256): 1,
    (5000, 32): 1,
    (700, 64): 1,
}
TINY_SHAPES = {(300, 16): 1, (64, 32): 1}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def _inputs(rows: int, channels: int, dtype: torch.dtype, device: torch.device):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, channels, generator=g) * 3 + 50).to(device, dtype)
    weight = (torch.rand(channels, generator=g) + 0.5).to(device)
    bias = torch.randn(channels, generator=g).to(device)
    grad = torch.randn(rows, channels, generator=g).to(device, dtype)
    return x, weight, bias, grad


def _step(library: str, x, weight, bias, grad, mask=None):
    """One training forward and backward; returns (output, x.grad, weight.grad, bias.grad).
    `mask` (the reference) replaces the ReLU by that fixed mask."""
    x, weight, bias = (t.detach().requires_grad_() for t in (x, weight, bias))
    mean = torch.zeros(x.shape[1], device=x.device, dtype=weight.dtype)
    var = torch.ones_like(mean)
    if library == "relconv":
        out = batch_norm_act(x, weight, bias, mean, var, True, 0.1, 1e-5, True)
    elif mask is not None:
        out = F.batch_norm(x, mean, var, weight, bias, True, 0.1, 1e-5) * mask
    else:
        out = torch.relu(F.batch_norm(x, mean, var, weight, bias, True, 0.1, 1e-5))
    out.backward(grad)
    return out, x.grad, weight.grad, bias.grad


def _error(got, want) -> float:
    """Largest error of any of the four results relative to that result's largest magnitude."""
    return max(
        ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
        for a, b in zip(got, want, strict=True)
    )


def _kernel_us(library: str, inputs, steps: int) -> dict[str, float]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            _step(library, *inputs)
        torch.cuda.synchronize()
    per: dict[str, float] = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name.split("(")[0].split("<")[0].split("::")[-1]] += e.device_time_total / steps
    return dict(per)


def run_row(rows: int, channels: int, dtype: torch.dtype, device: torch.device, steps: int) -> dict:
    x, weight, bias, grad = _inputs(rows, channels, dtype, device)
    row = {"rows": rows, "channels": channels, "dtype": str(dtype).removeprefix("torch.")}
    doubles = tuple(t.double() for t in (x, weight, bias, grad))
    for library in ("relconv", "torch"):
        got = _step(library, x, weight, bias, grad)
        want = _step("reference", *doubles, mask=got[0].detach() > 0)
        row[f"{library}_rel_error"] = _error(got, want)
        if device.type == "cuda":
            for _ in range(3):
                _step(library, x, weight, bias, grad)
            torch.cuda.synchronize()
            kernels = _kernel_us(library, (x, weight, bias, grad), steps)
            row[f"{library}_kernels_us"] = {k: round(v, 1) for k, v in kernels.items()}
            row[f"{library}_us"] = round(sum(kernels.values()), 1)
    return row


def _shapes(arg: str | None, tiny: bool) -> dict[tuple[int, int], int]:
    if arg:
        return {tuple(int(v) for v in s.split("x")): 1 for s in arg.split(",")}
    return TINY_SHAPES if tiny else {**R21D_SHAPES, **OTHER_SHAPES}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.ops.bench_batch_norm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtypes", default="fp32,fp16", help="comma list of " + ", ".join(DTYPES))
    p.add_argument("--shapes", default=None, help="comma list of ROWSxCHANNELS (default: see above)")
    p.add_argument("--steps", type=int, default=10, help="profiled steps per row")
    p.add_argument("--tiny", action="store_true", help="two small shapes (CPU smoke)")
    p.add_argument("--out", type=Path, default=None, help="directory for bench_batch_norm.json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a CUDA GPU (use --device cpu for the agreement rows)")
    shapes = _shapes(args.shapes, args.tiny)
    rows = []
    for name in args.dtypes.split(","):
        dtype = DTYPES[name]
        weighted = collections.defaultdict(float)
        for (n, c), count in shapes.items():
            row = run_row(n, c, dtype, device, args.steps)
            if row["relconv_rel_error"] > TOLERANCE[dtype]:
                raise SystemExit(f"relconv disagrees with the float64 reference: {row}")
            rows.append(row)
            line = f"{name} {n:>8} x {c:<4} error {row['relconv_rel_error']:.1e}"
            if device.type == "cuda":
                line += f"  relconv {row['relconv_us']:8.1f} us  torch {row['torch_us']:8.1f} us"
                if (n, c) in R21D_SHAPES:
                    weighted["relconv"] += count * row["relconv_us"]
                    weighted["torch"] += count * row["torch_us"]
            print(line, flush=True)
        if weighted:
            print(
                f"{name} SparseResNet21D step: relconv {weighted['relconv']:.0f} us,"
                f" torch {weighted['torch']:.0f} us"
            )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_batch_norm.json").write_text(
            json.dumps({"device": str(device), "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
