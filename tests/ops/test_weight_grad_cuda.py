"""The CUDA weight gradient (pipelined kernel: tensor cores, or fmas for exact fp32; SIMT fallback)
against the float64 reference, in both reduction modes: atomics, and the deterministic per-tile
partial sums taken under torch.use_deterministic_algorithms(True). Outside graph capture the
pipelined kernel runs as one cooperative launch (deterministic in either mode); a captured graph
records the split kernels."""

import pytest
import torch

from relconv import relational_conv_weight_grad
from tests.conftest import allow_tf32
from tests.ops.maps import TF32_TOLERANCE, TOLERANCE, random_map, rel_error

pytestmark = pytest.mark.cuda


@pytest.fixture(params=[False, True], ids=["atomic", "deterministic"])
def deterministic(request):
    torch.use_deterministic_algorithms(request.param)
    yield request.param
    torch.use_deterministic_algorithms(False)


def _reference(x, grad, rmap, groups):
    """dW[r, g] = sum over pairs p of relation r of x[in]^T (scale * grad[out]): [R, G, C_in_g, C_out_g]."""
    x, grad = x.double().cpu(), grad.double().cpu()
    ii, oi, rp = rmap.in_index.long().cpu(), rmap.out_index.long().cpu(), rmap.rel_ptr.cpu()
    s = rmap.scale.double().cpu() if rmap.scale is not None else torch.ones(ii.numel(), dtype=torch.float64)
    cin_g, cout_g = x.shape[1] // groups, grad.shape[1] // groups
    dw = torch.zeros(rmap.num_relations, groups, cin_g, cout_g, dtype=torch.float64)
    for r in range(rmap.num_relations):
        p = slice(int(rp[r]), int(rp[r + 1]))
        xs = x[ii[p]].view(-1, groups, cin_g)
        gs = (grad[oi[p]] * s[p, None]).view(-1, groups, cout_g)
        dw[r] = torch.einsum("pgi,pgo->gio", xs, gs)
    return dw


def _inputs(num_in, num_out, cin, cout, dtype, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_in, cin, generator=g, dtype=torch.float64).to("cuda", dtype)
    grad = torch.randn(num_out, cout, generator=g, dtype=torch.float64).to("cuda", dtype)
    return x, grad


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("with_scale", [False, True], ids=["unscaled", "scaled"])
# (C_in, C_out, groups): the 16 (K split over four warps) / 32 / 64 / 128 pipelined tiles, 8 -> 16
# and 16 -> 8 on the 16 tile, partial column tiles (24 -> 40, 128 ->
# 96, 96 -> 96, 160 -> 96, 200), rectangular (32 -> 64), grouped, 12 -> 20 (16-bit rows that are not
# 16-byte vectors: the SIMT fallback), and stems: x rows of 4 or 8 bytes, one cp.async each in the
# pipelined kernel (4 -> 32; 4 -> 64 on two column tiles; 2 -> 16; 8 -> 32 in two groups of 4; 1 ->
# 16, pipelined for fp32 only). fp32 is exact (TF32 off): the pipelined kernel's fma warp tiles.
@pytest.mark.parametrize(
    "cin,cout,groups",
    [
        (16, 16, 1),
        (8, 16, 1),
        (16, 8, 1),
        (32, 32, 1),
        (24, 40, 1),
        (64, 64, 1),
        (32, 64, 1),
        (128, 128, 1),
        (128, 96, 1),
        (96, 96, 1),
        (160, 96, 1),
        (200, 200, 1),
        (64, 64, 2),
        (12, 20, 1),
        (4, 32, 1),
        (4, 64, 1),
        (2, 16, 1),
        (8, 32, 2),
        (1, 16, 1),
    ],
)
def test_weight_grad_matches_reference(deterministic, dtype, index_dtype, with_scale, cin, cout, groups):
    # Several thousand pairs over 7 relations (one empty): many tiles per relation, ragged ends.
    rmap = random_map(500, 450, 7, 6000, "cuda", index_dtype, with_scale)
    x, grad = _inputs(500, 450, cin, cout, dtype)
    dw = relational_conv_weight_grad(x, grad, rmap, groups=groups)
    ref = _reference(x, grad, rmap, groups)
    assert dw.dtype == dtype and dw.shape == ref.shape
    assert rel_error(dw, ref) < TOLERANCE[dtype]
    assert not dw[0].any()  # the empty relation


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_deterministic_mode_is_bitwise_reproducible(dtype):
    rmap = random_map(3000, 2800, 27, 60000, "cuda", torch.int32, with_scale=False)
    x, grad = _inputs(3000, 2800, 64, 64, dtype)
    atomic = relational_conv_weight_grad(x, grad, rmap)
    torch.use_deterministic_algorithms(True)
    try:
        first = relational_conv_weight_grad(x, grad, rmap)
        for _ in range(3):
            assert torch.equal(relational_conv_weight_grad(x, grad, rmap), first)
    finally:
        torch.use_deterministic_algorithms(False)
    assert rel_error(first, atomic) < TOLERANCE[dtype]
    assert rel_error(first, _reference(x, grad, rmap, 1)) < TOLERANCE[dtype]


def _unaligned(t):
    """A contiguous copy of t that starts 2 bytes into its storage (no 16-byte loads)."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cin", [64, 4])
def test_unaligned_rows_take_the_fallback(dtype, cin):
    """16-byte rows, and 8-byte stem rows, that do not start on their size."""
    rmap = random_map(300, 200, 5, 2000, "cuda", torch.int32, with_scale=True)
    x, grad = (_unaligned(t) for t in _inputs(300, 200, cin, 64, dtype))
    assert x.data_ptr() % 16 and x.data_ptr() % (cin * x.element_size()) and grad.data_ptr() % 16
    dw = relational_conv_weight_grad(x, grad, rmap)
    assert rel_error(dw, _reference(x, grad, rmap, 1)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("channels", [64, 16])
def test_the_one_launch_tensor_core_path_is_bitwise_reproducible(dtype, channels):
    """No atomics in the cooperative kernel: the same bits call after call, deterministic switch off."""
    rmap = random_map(3000, 2800, 27, 60000, "cuda", torch.int32, with_scale=False)
    x, grad = _inputs(3000, 2800, channels, channels, dtype)
    with allow_tf32(dtype == torch.float32):  # fp32 takes the tensor cores in TF32 mode
        first = relational_conv_weight_grad(x, grad, rmap)
        for _ in range(3):
            assert torch.equal(relational_conv_weight_grad(x, grad, rmap), first)
    tolerance = TF32_TOLERANCE if dtype == torch.float32 else TOLERANCE[dtype]
    assert rel_error(first, _reference(x, grad, rmap, 1)) < tolerance


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cin,cout", [(16, 16), (32, 32), (64, 64), (128, 128)])
def test_a_captured_graph_records_the_split_kernels(deterministic, dtype, cin, cout):
    """Under capture the weight gradient takes the split kernels (schedule, tiles, reduction or
    rounding); replayed, they agree with the eager one-launch result and the reference."""
    rmap = random_map(500, 450, 7, 6000, "cuda", torch.int32, with_scale=False)
    x, grad = _inputs(500, 450, cin, cout, dtype)
    eager = relational_conv_weight_grad(x, grad, rmap)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        relational_conv_weight_grad(x, grad, rmap)  # warm-up outside capture, as torch asks
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = relational_conv_weight_grad(x, grad, rmap)
    graph.replay()
    torch.cuda.synchronize()
    ref = _reference(x, grad, rmap, 1)
    assert rel_error(captured, ref) < TOLERANCE[dtype]
    assert rel_error(eager, ref) < TOLERANCE[dtype]
    assert not captured[0].any()  # the empty relation
