"""Agreement sweep of the relational-conv ops against the PyTorch reference on odd shapes.

Run once on a fresh GPU build before timing anything: every dtype x index dtype, channel counts that
are not multiples of any tile (3, 5, 17, 33), groups > 1, empty relations, colliding (out, relation)
slots, a map without pairs, forward and both gradients, plus a CUDA-graph capture of the forward.

    python benchmarks/ops/check_relational_conv.py            # cuda if available
    python benchmarks/ops/check_relational_conv.py --device cpu
"""

from __future__ import annotations

import argparse

import torch

import relconv
from relconv import RelationalMap
from relconv.ops.reference import relational_conv_reference

TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4, torch.float64: 1e-10}
# (C_in, C_out, groups)
SHAPES = [
    (3, 5, 1),
    (17, 33, 1),
    (16, 16, 1),
    (32, 128, 1),
    (130, 70, 1),
    (64, 64, 2),
    (24, 40, 8),
    (8, 8, 8),
]


def random_map(num_in: int, num_out: int, num_relations: int, num_pairs: int, index_dtype, device, gen):
    """Random pairs (with collisions) over every other relation, so half the relations are empty."""
    rel = torch.randint(0, (num_relations + 1) // 2, (num_pairs,), generator=gen) * 2
    src = torch.randint(0, num_in, (num_pairs,), generator=gen)
    dst = torch.randint(0, max(num_out, 1), (num_pairs,), generator=gen)
    scale = torch.rand(num_pairs, generator=gen) + 0.5
    return RelationalMap.from_triples(
        src.to(device),
        dst.to(device),
        rel.to(device),
        num_in,
        num_out,
        num_relations,
        scale=scale.to(device),
        index_dtype=index_dtype,
    )


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30)) if b.numel() else 0.0


def check(rmap: RelationalMap, cin: int, cout: int, groups: int, dtype, device, gen) -> float:
    r = rmap.num_relations
    x = torch.randn(rmap.num_in, cin, generator=gen).to(device, dtype).requires_grad_()
    w = (torch.randn(r, groups, cin // groups, cout // groups, generator=gen) / cin**0.5).to(device, dtype)
    w.requires_grad_()
    g = torch.randn(rmap.num_out, cout, generator=gen).to(device, dtype)
    results = []
    for f in (relconv.relational_conv, relational_conv_reference):
        out = f(x, w, rmap, groups=groups)
        if out.requires_grad:
            grads = torch.autograd.grad(out, (x, w), g, allow_unused=True)
        else:  # the reference builds no graph for a map without pairs
            grads = (None, None)
        grads = tuple(torch.zeros_like(t) if d is None else d for t, d in zip((x, w), grads, strict=True))
        results.append((out, *grads))
    return max(rel_error(a, b) for a, b in zip(*results, strict=True))


def check_graph_capture(device) -> None:
    """The forward must be capturable: no host synchronisation inside."""
    gen = torch.Generator().manual_seed(1)
    rmap = random_map(500, 400, 7, 3000, torch.int32, device, gen)
    x = torch.randn(500, 48, generator=gen).to(device, torch.float16)
    w = torch.randn(7, 48, 40, generator=gen).to(device, torch.float16)
    expected = relconv.relational_conv(x, w, rmap)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        relconv.relational_conv(x, w, rmap)  # warm-up on the side stream, as capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = relconv.relational_conv(x, w, rmap)
    graph.replay()
    torch.cuda.synchronize()
    err = rel_error(out, expected)
    assert err < 1e-3, f"CUDA-graph replay differs from eager: {err:.2e}"
    print(f"cuda graph capture + replay ok (rel err {err:.1e})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    failures = 0
    maps = {
        idt: [random_map(300, 250, 9, 4000, idt, device, gen), random_map(50, 40, 3, 0, idt, device, gen)]
        for idt in (torch.int32, torch.int64)
    }
    for dtype, tol in TOLERANCE.items():
        worst = 0.0
        for idt, ms in maps.items():
            for rmap in ms:
                for cin, cout, groups in SHAPES:
                    err = check(rmap, cin, cout, groups, dtype, device, gen)
                    worst = max(worst, err)
                    if not err <= tol:
                        failures += 1
                        print(
                            f"FAIL {dtype} {idt} P={rmap.num_pairs} cin={cin} cout={cout} "
                            f"groups={groups}: {err:.2e}"
                        )
        print(f"{str(dtype):15} worst rel err {worst:.1e} (tol {tol:.0e})")
    if device.type == "cuda":
        check_graph_capture(device)
    if failures:
        raise SystemExit(f"{failures} failing cases")
    print("all cases agree with the reference")


if __name__ == "__main__":
    main()
