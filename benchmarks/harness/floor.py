"""The physical floor of every case, from ceilings measured in the same run.

Ceilings: device-to-device copy bandwidth (bytes read + written per second) and the dense GEMM rate
of each dtype (fp32 with TF32 off, tf32, fp16, bf16). Each case supplies its minimal bytes moved and
FLOPs; the floor is max(bytes / bandwidth, FLOPs / GEMM rate) and each row reports its time as a
multiple of that floor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float
    gemm_flops_per_s: dict[str, float]

    def floor_ms(self, nbytes: float, flops: float, dtype: str) -> float:
        rate = self.gemm_flops_per_s.get(dtype, self.gemm_flops_per_s["fp32"])
        return 1e3 * max(nbytes / self.copy_bytes_per_s, flops / rate if flops else 0.0)


def _best_ms(fn, device: torch.device, reps: int) -> float:
    """Best of `reps` timed calls after two warm-ups (a ceiling wants the best, not the median)."""
    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize(device)
            best = min(best, a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def measure_ceilings(device: torch.device, tiny: bool = False) -> Ceilings:
    """Copy bandwidth and per-dtype GEMM rates on `device` (a few seconds on a GPU)."""
    cuda = device.type == "cuda"
    copy_elems = (2**28 if cuda else 2**24) // (16 if tiny else 1)  # 1 GiB / 64 MiB of fp32
    src = torch.empty(copy_elems, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = _best_ms(lambda s=src, d=dst: d.copy_(s), device, reps=5 if tiny else 10)
    copy_rate = 2 * src.numel() * src.element_size() / (ms * 1e-3)
    del src, dst

    n = (8192 if cuda else 1024) // (4 if tiny else 1)  # tiny still needs enough work to beat overheads
    rates: dict[str, float] = {}
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, dtype in DTYPES.items():
            if not cuda and name in ("tf32", "fp16"):
                continue  # no tensor cores to count; CPU half GEMMs are emulated and not a ceiling
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            ms = _best_ms(lambda a=a, b=b: a @ b, device, reps=3 if tiny else 10)
            rates[name] = 2 * n**3 / (ms * 1e-3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return Ceilings(copy_bytes_per_s=copy_rate, gemm_flops_per_s=rates)


def conv_layer_work(
    num_in: int,
    num_out: int,
    num_pairs: int,
    num_relations: int,
    c_in: int,
    c_out: int,
    elem: int,
    backward: bool,
    build_map: bool,
) -> tuple[float, float]:
    """Minimal (bytes, FLOPs) of one relational conv layer.

    Forward reads x, W and the map once and writes out once; the map costs the smaller of a pair
    list (two int32 per pair) and an output-stationary neighbour table (one int32 per out x R).
    Backward reads grad_out, re-reads x, writes grad_x and grad_W (2x the forward FLOPs).
    Building the map reads int32 (b, x, y, z) coordinates and writes the map once.
    """
    map_bytes = min(8 * num_pairs, 4 * num_out * num_relations)
    w_bytes = num_relations * c_in * c_out * elem
    fwd = (num_in * c_in + num_out * c_out) * elem + w_bytes + map_bytes
    flops = 2.0 * num_pairs * c_in * c_out
    nbytes = fwd
    if backward:
        nbytes += (num_out * c_out + 2 * num_in * c_in) * elem + 2 * w_bytes + map_bytes
        flops *= 3
    if build_map:
        nbytes += 16 * (num_in + num_out) + map_bytes
    return float(nbytes), flops


def rgcn_layer_work(
    num_nodes: int,
    num_edges: int,
    num_slots: int,
    num_relations: int,
    c_in: int,
    c_out: int,
    elem: int,
    backward: bool,
) -> tuple[float, float]:
    """Minimal (bytes, FLOPs) of one R-GCN layer with a root weight.

    Aggregate-then-transform: edges are summed into (target, relation) slots (`num_slots` of them)
    and each slot is multiplied by W[r] once, plus the root transform of every node. The edge list
    arrives as int64 edge_index [2, E] and edge_type [E] (24 bytes per edge).
    """
    w_bytes = (num_relations + 1) * c_in * c_out * elem
    nbytes = 24 * num_edges + (num_nodes * c_in + num_nodes * c_out) * elem + w_bytes
    flops = 2.0 * (num_slots + num_nodes) * c_in * c_out + num_edges * c_in
    if backward:
        nbytes += 24 * num_edges + (num_nodes * c_out + 2 * num_nodes * c_in) * elem + 2 * w_bytes
        flops *= 3
    return float(nbytes), flops
