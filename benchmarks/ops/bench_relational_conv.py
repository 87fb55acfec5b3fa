"""Benchmark of `relconv.relational_conv` (forward, forward+backward) against the pure-PyTorch loop.

Two maps: (a) a voxel-like 3x3x3 submanifold map (27 relations, ~70k voxels on a synthetic surface
scene, ~460k pairs; unique slots, so the CUDA forward runs output-stationary over the neighbour
table); (b) an AIFB-like relational graph (8,285 nodes, 58,086 edges, 90 relations, power-law
degrees, scale = 1/deg per (node, relation); pair lists with atomics). Each (map, C, dtype, pass)
row checks agreement with `relational_conv_reference` before timing, then reports median times of
the op and of the reference, and the physical floor: max(minimal bytes / measured copy bandwidth,
FLOPs / measured dense-matmul rate), both ceilings measured in the same run by the shared harness
(`benchmarks.harness.floor`), whose timing (`benchmarks.harness.timing`) this script uses too.

    python -m benchmarks.ops.bench_relational_conv                      # GPU, full sizes
    python -m benchmarks.ops.bench_relational_conv --device cpu --tiny  # CI smoke (< 30 s)
    python -m benchmarks.ops.bench_relational_conv --device cpu --threads 1,2,16 --dtypes fp32

`--threads` repeats every row at each intra-op thread count (`torch.set_num_threads`), for relconv
and the loop alike; the CPU goal is relconv >= 2x the loop at every count.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

import relconv
from benchmarks.harness.floor import Ceilings, measure_ceilings
from benchmarks.harness.report import environment
from benchmarks.harness.timing import TimingConfig, measure
from relconv import RelationalMap
from relconv.core.relational_map import index_dtype_for
from relconv.ops import Dataflow, resolve_dataflow
from relconv.ops.reference import relational_conv_reference

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
# Agreement thresholds (relative Frobenius error against the reference), by dtype.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4, torch.float64: 1e-10}
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- maps
def _forward_path(rmap: RelationalMap, x: torch.Tensor, out_channels: int) -> str:
    flow = resolve_dataflow(Dataflow.AUTO, x.dtype, rmap.unique_slots, rmap.scale is not None, out_channels)
    return "table" if x.is_cuda and flow is Dataflow.OUTPUT_STATIONARY else "pairs"


def surface_scene(num_voxels: int, generator: torch.Generator) -> torch.Tensor:
    """[N, 3] unique int64 voxel coordinates on 2-D manifolds: a gently rolling ground, four walls
    and a few box obstacles, thinned at random like a LiDAR scan (so 3x3x3 neighbourhoods hold
    ~6-7 voxels instead of a full plane's 9). The scene side is sized to give about `num_voxels`."""
    keep = 0.68
    # Ground cells side^2, walls 4*side*height with height = side/5, boxes ~ 5% extra.
    side = max(8, int(math.sqrt(num_voxels / keep / 1.9)))
    height = max(2, side // 5)
    ar = torch.arange(side)
    gx, gy = torch.meshgrid(ar, ar, indexing="ij")
    gz = (2.0 * torch.sin(gx / 17.0) + 2.0 * torch.cos(gy / 23.0) + 4.0).round().long()
    parts = [torch.stack([gx, gy, gz], -1).reshape(-1, 3)]
    h = torch.arange(height) + 4
    for fixed_axis, at in ((0, 0), (0, side - 1), (1, 0), (1, side - 1)):
        a, z = torch.meshgrid(ar, h, indexing="ij")
        w = torch.full_like(a, at)
        xyz = (w, a, z) if fixed_axis == 0 else (a, w, z)
        parts.append(torch.stack(xyz, -1).reshape(-1, 3))
    b = max(2, side // 10)
    e, hz = torch.arange(b), torch.arange(height // 2) + 4
    for _ in range(4):  # box obstacles: their four vertical faces
        x0, y0 = torch.randint(side // 8, side - side // 4, (2,), generator=generator).tolist()
        a, z = torch.meshgrid(e, hz, indexing="ij")
        for xs, ys in ((x0, y0 + a), (x0 + b - 1, y0 + a), (x0 + a, y0), (x0 + a, y0 + b - 1)):
            xs, ys = torch.as_tensor(xs).expand_as(a), torch.as_tensor(ys).expand_as(a)
            parts.append(torch.stack([xs, ys, z], -1).reshape(-1, 3))
    coords = torch.unique(torch.cat(parts), dim=0)
    mask = torch.rand(coords.shape[0], generator=generator) < keep
    return coords[mask]


def submanifold_map(coords: torch.Tensor, device: torch.device) -> RelationalMap:
    """3x3x3 submanifold map over `coords` [N, 3]: pair (i, o, r) when coords[i] = coords[o] + offset r.

    Coordinates are shifted by +1 and packed into int64 keys with one guard cell on each side, so an
    offset of -1/+1 never wraps into another row; one sorted-key searchsorted covers all 27 offsets.
    Built like relconv.voxel's kernel maps: the hits come out grouped by relation (and sorted by
    output within a relation), and every (output, offset) slot holds at most one input, so the map is
    marked `unique_slots` and the CUDA forward takes the output-stationary neighbour-table path.
    """
    c = coords.to(device) + 1
    extent = int(c.max()) + 2
    key = (c[:, 0] * extent + c[:, 1]) * extent + c[:, 2]
    sorted_key, order = torch.sort(key)
    d = torch.tensor([-1, 0, 1], device=device)
    offsets = torch.cartesian_prod(d, d, d)  # [27, 3], relation r = offsets[r]
    delta = (offsets[:, 0] * extent + offsets[:, 1]) * extent + offsets[:, 2]
    query = key.unsqueeze(0) + delta.unsqueeze(1)  # [27, N]
    pos = torch.searchsorted(sorted_key, query).clamp_(max=key.numel() - 1)
    hit = sorted_key[pos] == query
    relation, out_row = hit.nonzero(as_tuple=True)
    in_row = order[pos[relation, out_row]]
    n = coords.shape[0]
    rel_ptr = torch.zeros(28, dtype=torch.int64, device=device)
    torch.cumsum(hit.sum(1), 0, out=rel_ptr[1:])
    idt = index_dtype_for(n, in_row.numel())
    return RelationalMap(in_row.to(idt), out_row.to(idt), rel_ptr, n, n, unique_slots=True)


def power_law_graph(
    num_nodes: int, num_edges: int, num_relations: int, device: torch.device, generator: torch.Generator
) -> RelationalMap:
    """Random typed graph with Zipf-like node degrees and relation frequencies; scale = 1/deg_r(o)."""

    def zipf(n: int, k: int, alpha: float) -> torch.Tensor:
        w = torch.arange(1, n + 1, dtype=torch.float64).pow(-alpha)
        perm = torch.randperm(n, generator=generator)
        return perm[torch.multinomial(w, k, replacement=True, generator=generator)]

    src = zipf(num_nodes, num_edges, 0.8)
    dst = zipf(num_nodes, num_edges, 0.8)
    rel = zipf(num_relations, num_edges, 1.1)
    slot = dst * num_relations + rel
    _, inverse, counts = torch.unique(slot, return_inverse=True, return_counts=True)
    scale = 1.0 / counts[inverse].double()
    return RelationalMap.from_triples(
        src.to(device),
        dst.to(device),
        rel.to(device),
        num_nodes,
        num_nodes,
        num_relations,
        scale=scale.to(device, torch.float32),
    )


# ---------------------------------------------------------------------------- rows
def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def minimal_bytes(rmap: RelationalMap, cin: int, cout: int, dtype: torch.dtype, backward: bool) -> int:
    """Bytes every implementation must move: each dense operand read or written once, the map once."""
    es = torch.tensor([], dtype=dtype).element_size()
    r, p = rmap.num_relations, rmap.num_pairs
    idx = 2 * p * rmap.in_index.element_size() + (r + 1) * 8 + (0 if rmap.scale is None else 4 * p)
    x, w, out = rmap.num_in * cin * es, r * cin * cout * es, rmap.num_out * cout * es
    fwd = x + w + idx + out
    if not backward:
        return fwd
    # dX: read grad_out and W, write dX; dW: read x and grad_out, write dW.
    return fwd + (out + w + idx + x) + (x + out + idx + w)


def bench_row(
    name: str,
    rmap: RelationalMap,
    c: int,
    dname: str,
    backward: bool,
    device: torch.device,
    ceilings: Ceilings,
    timing: TimingConfig,
    generator: torch.Generator,
) -> dict:
    dtype = DTYPES[dname]
    r = rmap.num_relations
    x0 = torch.randn(rmap.num_in, c, generator=generator).to(device, dtype)
    w0 = (torch.randn(r, c, c, generator=generator) / math.sqrt(c)).to(device, dtype)
    g0 = torch.randn(rmap.num_out, c, generator=generator).to(device, dtype)
    x, w = x0.clone().requires_grad_(backward), w0.clone().requires_grad_(backward)

    def run(f: Callable) -> Callable[[], tuple]:
        if not backward:
            return lambda: (f(x, w),)

        def step() -> tuple:
            out = f(x, w)
            return (out, *torch.autograd.grad(out, (x, w), g0))

        return step

    ours = run(lambda a, b: relconv.relational_conv(a, b, rmap))
    ref = run(lambda a, b: relational_conv_reference(a, b, rmap))
    errors = [rel_error(o, e) for o, e in zip(ours(), ref(), strict=True)]
    err = max(errors)
    tol = TOLERANCE[dtype]
    if not err <= tol:
        raise AssertionError(
            f"{name} C={c} {dtype} {'fwd+bwd' if backward else 'fwd'}: relative error {err:.3e} > {tol:.0e} "
            f"(per output: {', '.join(f'{e:.2e}' for e in errors)})"
        )
    # The closures hold their inputs, so the harness gets a single dummy input to "rotate".
    t_ours = measure(lambda _: ours(), [None], device, timing).median_ms / 1e3
    t_ref = measure(lambda _: ref(), [None], device, timing).median_ms / 1e3
    passes = 3 if backward else 1
    flops = passes * 2 * rmap.num_pairs * c * c
    nbytes = minimal_bytes(rmap, c, c, dtype, backward)
    # Dtypes without a measured GEMM rate (fp64; fp16 on CPU) fall back to the fp32 rate.
    floor = ceilings.floor_ms(nbytes, flops, dname) / 1e3
    return {
        "map": name,
        "threads": torch.get_num_threads(),
        "num_pairs": rmap.num_pairs,
        "num_relations": r,
        "num_in": rmap.num_in,
        "num_out": rmap.num_out,
        "channels": c,
        "dtype": str(dtype).removeprefix("torch."),
        "index_dtype": str(rmap.in_index.dtype).removeprefix("torch."),
        # Which forward kernel ran: the neighbour table (output-stationary) or the pair lists (atomics);
        # the CPU kernel has one dataflow, the pair lists.
        "forward_path": _forward_path(rmap, x, c),
        "pass": "fwd+bwd" if backward else "fwd",
        "rel_error": err,
        "time_relconv_s": t_ours,
        "time_reference_s": t_ref,
        "speedup": t_ref / t_ours,
        "min_bytes": nbytes,
        "flops": flops,
        "floor_s": floor,
        "time_over_floor": t_ours / floor,
    }


# ---------------------------------------------------------------------------- main
def _thread_counts(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        msg = f"--threads must be comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--threads needs positive thread counts, got {text!r}")
    return counts


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'map':7} {'thr':>3} {'path':5} {'P':>8} {'R':>3} {'C':>4} {'dtype':8} {'pass':7} "
        f"{'relconv ms':>10} {'ref ms':>9} "
        f"{'speedup':>7} {'floor ms':>9} {'x floor':>7} {'rel err':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['map']:7} {r['threads']:>3} {r['forward_path']:5} {r['num_pairs']:>8} "
            f"{r['num_relations']:>3} "
            f"{r['channels']:>4} {r['dtype']:8} {r['pass']:7} "
            f"{r['time_relconv_s'] * 1e3:>10.3f} {r['time_reference_s'] * 1e3:>9.3f} "
            f"{r['speedup']:>7.1f} {r['floor_s'] * 1e3:>9.4f} {r['time_over_floor']:>7.1f} "
            f"{r['rel_error']:>8.1e}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="small maps and few runs (CI smoke)")
    parser.add_argument(
        "--channels", type=int, nargs="+", default=None, help="default 32 64 128 (tiny: 8 16)"
    )
    parser.add_argument("--dtypes", nargs="+", default=["fp16", "fp32"], choices=sorted(DTYPES))
    parser.add_argument("--maps", nargs="+", default=["voxel", "graph"], choices=["voxel", "graph"])
    parser.add_argument("--iters", type=int, default=None, help="timed runs per row (default 30, tiny 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 5, tiny 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=_thread_counts,
        default=None,
        help="comma-separated intra-op thread counts to run every row at, e.g. 1,2,16 (default: torch's)",
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ops"))
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    channels = args.channels or ([8, 16] if args.tiny else [32, 64, 128])
    timing = TimingConfig(
        warmup_runs=args.warmup if args.warmup is not None else (1 if args.tiny else 5),
        # The harness also warms up by time (for autotuners); --tiny's 32 timings can't afford it.
        warmup_seconds=0.0 if args.tiny else TimingConfig.warmup_seconds,
        runs=args.iters or (3 if args.tiny else 30),
    )
    gen = torch.Generator().manual_seed(args.seed)

    maps = {}
    if "voxel" in args.maps:
        maps["voxel"] = submanifold_map(surface_scene(2_000 if args.tiny else 70_000, gen), device)
    if "graph" in args.maps:
        sizes = (300, 2_000, 20) if args.tiny else (8_285, 58_086, 90)
        maps["graph"] = power_law_graph(*sizes, device, gen)
    for name, m in maps.items():
        print(f"{name}: {m}")

    ceilings = measure_ceilings(device, args.tiny)
    rows = []
    default_threads = torch.get_num_threads()
    for threads in args.threads or [default_threads]:
        torch.set_num_threads(threads)
        for name, rmap in maps.items():
            for c in channels:
                for dname in args.dtypes:
                    for backward in (False, True):
                        rows.append(bench_row(name, rmap, c, dname, backward, device, ceilings, timing, gen))
    torch.set_num_threads(default_threads)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = "tiny" if args.tiny else "full"
    path = out_dir / f"bench_relational_conv_{device.type}_{tag}.json"
    # Whether the CUDA kernels were built decides which forward path a GPU row measured.
    env = {**environment(device, {}, {device.type: ceilings}), "relconv_cuda_build": relconv._ext.cuda_built}
    path.write_text(json.dumps({"environment": env, "args": vars(args), "rows": rows}, indent=2))
    print(f"\nwrote {path}")
    print(f"{env['device']} | torch {env['torch']} | CUDA {env['cuda']} | commit {env['relconv_commit']}")
    print(
        f"copy {ceilings.copy_bytes_per_s / 1e9:.0f} GB/s | matmul "
        + ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in ceilings.gemm_flops_per_s.items())
    )
    print_table(rows)


if __name__ == "__main__":
    main()
