"""Demo part 1: one relational convolution on random data, checked against the PyTorch loop."""

from __future__ import annotations

import time

import torch

from relconv import RelationalMap, relational_conv
from relconv.ops.reference import relational_conv_reference


def _time(fn, device: torch.device, repeats: int = 10) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def run(device: torch.device) -> None:
    gen = torch.Generator().manual_seed(0)
    num_nodes, num_relations, num_pairs, channels = 20_000, 27, 130_000, 32
    rmap = RelationalMap.from_triples(
        torch.randint(0, num_nodes, (num_pairs,), generator=gen),
        torch.randint(0, num_nodes, (num_pairs,), generator=gen),
        torch.randint(0, num_relations, (num_pairs,), generator=gen),
        num_nodes,
        num_nodes,
        num_relations,
    ).to(device)
    x = torch.randn(num_nodes, channels, generator=gen).to(device)
    w = (torch.randn(num_relations, channels, channels, generator=gen) / channels**0.5).to(device)
    out = relational_conv(x, w, rmap)
    ref = relational_conv_reference(x.double(), w.double(), rmap)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    t_op = _time(lambda: relational_conv(x, w, rmap), device)
    t_loop = _time(lambda: relational_conv_reference(x, w, rmap), device)
    print(f"[ops] {rmap}")
    print(
        f"[ops] relational_conv on {device}: {t_op:.2f} ms; per-relation PyTorch loop: {t_loop:.2f} ms; "
        f"relative error vs float64 reference {err:.1e}"
    )
