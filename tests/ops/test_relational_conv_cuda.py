"""GPU-only properties: CPU parity, no host synchronisation, CUDA-graph capture."""

import pytest
import torch

from relconv import relational_conv
from tests.conftest import requires_cuda
from tests.ops.maps import TOLERANCE, random_map, rel_error

pytestmark = [pytest.mark.cuda, requires_cuda]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cin,cout,groups", [(16, 16, 1), (64, 64, 1), (32, 48, 4), (7, 5, 1), (128, 96, 1)])
def test_cpu_cuda_parity(dtype, cin, cout, groups):
    cpu_map = random_map(500, 400, 27, 6000, "cpu")
    gpu_map = cpu_map.to("cuda")
    x = torch.randn(500, cin, dtype=torch.float64).to(dtype)
    shape = (27, cin, cout) if groups == 1 else (27, groups, cin // groups, cout // groups)
    w = (torch.randn(shape, dtype=torch.float64) / cin**0.5).to(dtype)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    xg, wg = x.cuda().requires_grad_(), w.cuda().requires_grad_()
    out_c = relational_conv(xc, wc, cpu_map, groups=groups)
    out_g = relational_conv(xg, wg, gpu_map, groups=groups)
    assert rel_error(out_g, out_c) < TOLERANCE[dtype]
    grad = torch.randn_like(out_c)
    gxc, gwc = torch.autograd.grad(out_c, (xc, wc), grad)
    gxg, gwg = torch.autograd.grad(out_g, (xg, wg), grad.cuda())
    assert rel_error(gxg, gxc) < TOLERANCE[dtype]
    assert rel_error(gwg, gwc) < TOLERANCE[dtype]


def test_forward_and_backward_do_not_synchronise():
    rmap = random_map(1000, 900, 27, 20000, "cuda")
    x = torch.randn(1000, 32, device="cuda", requires_grad=True)
    w = torch.randn(27, 32, 32, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = relational_conv(x, w, rmap)
        out.backward(torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_forward_is_cuda_graph_capturable():
    rmap = random_map(800, 700, 27, 15000, "cuda")
    x = torch.randn(800, 64, device="cuda", dtype=torch.float16)
    w = torch.randn(27, 64, 64, device="cuda", dtype=torch.float16) / 8
    expected = relational_conv(x, w, rmap)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        relational_conv(x, w, rmap)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = relational_conv(x, w, rmap)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_error(captured, relational_conv(x, w, rmap)) < TOLERANCE[torch.float16]
    assert rel_error(captured, expected) > 0.1  # the replay really recomputed on the new input


def test_atomic_collisions_many_pairs_per_slot():
    # Graph-like: 50 inputs feed every (out, relation) slot, stressing the accumulation.
    n_out, fan_in = 64, 50
    oi = torch.arange(n_out).repeat_interleave(fan_in * 2)
    rel = torch.arange(2).repeat_interleave(fan_in).repeat(n_out)
    ii = torch.randint(0, 300, (oi.numel(),))
    from relconv import RelationalMap

    cpu_map = RelationalMap.from_triples(ii, oi, rel, 300, n_out, 2)
    x = torch.randn(300, 40, dtype=torch.float32)
    w = torch.randn(2, 40, 24, dtype=torch.float32)
    ref = relational_conv(x, w, cpu_map)
    assert rel_error(relational_conv(x.cuda(), w.cuda(), cpu_map.to("cuda")), ref) < 1e-5
