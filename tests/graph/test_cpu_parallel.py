"""The CPU relational conv's parallel paths: bucketed by output rows, the hub-node fallback to
threaded GEMMs, and chunked weight gradients. Each must match the single-thread result (the pair
summation order does not depend on the thread count; only BLAS's rounding of a row may change with the
rows that share its tile) and the pure-PyTorch reference, and be bit-identical from run to run."""

import pytest
import torch

from relconv import RelationalMap
from relconv.ops.reference import relational_conv_reference
from relconv.ops.relational_conv import relational_conv, relational_conv_weight_grad

TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def _graph_map(num_nodes: int, num_pairs: int, num_relations: int, hub: bool, seed: int) -> RelationalMap:
    """Random typed graph with a per-pair scale; with `hub`, 90 % of the pairs target node 0, so the
    output rows cannot be split into balanced buckets (the kernel falls back to threaded GEMMs)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_pairs,), generator=gen)
    dst = torch.randint(0, num_nodes, (num_pairs,), generator=gen)
    if hub:
        dst[torch.rand(num_pairs, generator=gen) < 0.9] = 0
    rel = torch.randint(0, num_relations, (num_pairs,), generator=gen)
    scale = torch.rand(num_pairs, generator=gen) + 0.5
    return RelationalMap.from_triples(src, dst, rel, num_nodes, num_nodes, num_relations, scale=scale)


def _with_threads(n: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("hub", [False, True], ids=["balanced", "hub"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 4])
def test_parallel_paths_match_serial_and_reference(hub, dtype, groups):
    # Large enough (P * C_in * C_out/groups >= 2^21) to take the parallel paths with 2+ threads.
    rmap = _graph_map(3000, 40_000, 7, hub, seed=1)
    c = 32
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(rmap.num_in, c, generator=gen).to(dtype)
    w = (torch.randn(7, groups, c // groups, c // groups, generator=gen) / 4).to(dtype)
    g = torch.randn(rmap.num_out, c, generator=gen).to(dtype)
    w_arg = w[:, 0] if groups == 1 else w

    def both():
        return relational_conv(x, w_arg, rmap, groups), relational_conv_weight_grad(x, g, rmap, groups)

    serial = _with_threads(1, both)
    for threads in (2, 3):
        par = _with_threads(threads, both)
        for a, b in zip(par, serial, strict=True):
            scale = b.double().abs().max()
            assert (a.double() - b.double()).abs().max() <= TOL[dtype] * scale, f"{threads} threads"
        assert all(torch.equal(a, b) for a, b in zip(par, _with_threads(threads, both), strict=True))
    ref = relational_conv_reference(x.double(), w_arg.double(), rmap, groups)
    err = (serial[0].double() - ref).norm() / ref.norm()
    assert err <= TOL[dtype]
    xr = x.double().requires_grad_()
    wr = w_arg.double().requires_grad_()
    (gw,) = torch.autograd.grad(relational_conv_reference(xr, wr, rmap, groups), (wr,), g.double())
    gw = gw.view(serial[1].shape)
    assert (serial[1].double() - gw).norm() / gw.norm() <= TOL[dtype]


def test_parallel_is_deterministic():
    rmap = _graph_map(2000, 30_000, 5, hub=False, seed=3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(rmap.num_in, 48, generator=gen)
    w = torch.randn(5, 48, 48, generator=gen)
    first = _with_threads(2, lambda: relational_conv(x, w, rmap))
    for _ in range(3):
        assert torch.equal(_with_threads(2, lambda: relational_conv(x, w, rmap)), first)


def test_relation_spanning_many_weight_grad_chunks():
    """One relation with far more pairs than a weight-gradient chunk: partials are summed in order."""
    rmap = _graph_map(500, 300_000, 1, hub=False, seed=5)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(rmap.num_in, 8, generator=gen, dtype=torch.float64)
    g = torch.randn(rmap.num_out, 8, generator=gen, dtype=torch.float64)
    dw = _with_threads(2, lambda: relational_conv_weight_grad(x, g, rmap))
    sx = x[rmap.in_index.long()]
    sg = g[rmap.out_index.long()] * rmap.scale.double().unsqueeze(1)
    torch.testing.assert_close(dw.view(8, 8), sx.T @ sg, rtol=1e-12, atol=1e-10)
