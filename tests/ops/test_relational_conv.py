"""relational_conv and its weight gradient against the pure-PyTorch reference."""

import pytest
import torch

from relconv import RelationalMap, relational_conv, relational_conv_weight_grad
from relconv.ops.reference import relational_conv_reference
from tests.conftest import DEVICES
from tests.ops.maps import TOLERANCE, random_map, rel_error

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]
# The CUDA kernels accumulate with atomics, so repeated backward passes may differ by rounding in the
# summation order; the CPU kernels are deterministic.
NONDET_TOL = {"cpu": 0.0, "cuda": 1e-12}


def _weight(r, g, cin, cout, dtype, device, seed=1):
    gen = torch.Generator().manual_seed(seed)
    shape = (r, cin, cout) if g == 1 else (r, g, cin // g, cout // g)
    return (torch.randn(shape, generator=gen, dtype=torch.float64) / cin**0.5).to(device, dtype)


def _features(n, c, dtype, device, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=gen, dtype=torch.float64).to(device, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("with_scale", [True, False])
def test_forward_and_grads_match_reference(device, dtype, index_dtype, groups, with_scale):
    rmap = random_map(37, 29, 6, 400, device, index_dtype, with_scale)
    x = _features(37, 12, dtype, device).requires_grad_()
    w = _weight(6, groups, 12, 10, dtype, device).requires_grad_()
    out = relational_conv(x, w, rmap, groups=groups)
    assert out.shape == (29, 10) and out.dtype == dtype and out.device.type == device

    # Ground truth in float64 on the same (rounded) operands.
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    ref = relational_conv_reference(x64, w64, rmap, groups=groups)
    grad = _features(29, 10, torch.float64, device, seed=3)
    ref_gx, ref_gw = torch.autograd.grad(ref, (x64, w64), grad)
    gx, gw = torch.autograd.grad(out, (x, w), grad.to(dtype))

    tol = TOLERANCE[dtype]
    assert rel_error(out, ref) < tol
    assert rel_error(gx, ref_gx) < tol
    assert rel_error(gw, ref_gw) < tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("groups", [1, 3])
def test_gradcheck_float64(device, groups):
    rmap = random_map(9, 7, 4, 40, device, torch.int64)
    x = _features(9, 6, torch.float64, device).requires_grad_()
    w = _weight(4, groups, 6, 3 * groups, torch.float64, device).requires_grad_()
    fn = lambda a, b: relational_conv(a, b, rmap, groups=groups)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w), nondet_tol=NONDET_TOL[device])
    assert torch.autograd.gradgradcheck(fn, (x, w), nondet_tol=NONDET_TOL[device])


@pytest.mark.parametrize("device", DEVICES)
def test_weight_grad_op_gradcheck(device):
    rmap = random_map(8, 6, 3, 30, device)
    x = _features(8, 4, torch.float64, device).requires_grad_()
    g = _features(6, 5, torch.float64, device).requires_grad_()
    fn = lambda a, b: relational_conv_weight_grad(a, b, rmap)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, g), nondet_tol=NONDET_TOL[device])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_opcheck(device, dtype):
    rmap = random_map(11, 9, 3, 50, device)
    x = _features(11, 8, dtype, device).requires_grad_()
    w = _weight(3, 2, 8, 4, dtype, device).requires_grad_()
    scale = rmap.scale.to(torch.float32)
    args = (x, w, rmap.in_index, rmap.out_index, rmap.rel_ptr, scale, rmap.num_out)
    torch.library.opcheck(torch.ops.relconv.relational_conv.default, args)
    g = _features(9, 4, dtype, device)
    wg_args = (x.detach(), g, rmap.in_index, rmap.out_index, rmap.rel_ptr, scale, 2)
    torch.library.opcheck(torch.ops.relconv.relational_conv_weight_grad.default, wg_args)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_map_relations_and_outputs_give_zeros(device):
    rmap = random_map(5, 4, 3, 0, device)
    x = _features(5, 3, torch.float32, device).requires_grad_()
    w = _weight(3, 1, 3, 2, torch.float32, device).requires_grad_()
    out = relational_conv(x, w, rmap)
    assert out.shape == (4, 2) and torch.equal(out, torch.zeros_like(out))
    gx, gw = torch.autograd.grad(out.sum(), (x, w))
    assert torch.equal(gx, torch.zeros_like(gx)) and torch.equal(gw, torch.zeros_like(gw))

    # Outputs 0 and 3 receive nothing, relation 0 has no pairs.
    sparse = RelationalMap.from_triples(
        torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([2, 1]), 5, 4, 3
    ).to(device)
    out = relational_conv(x.detach(), w.detach(), sparse)
    assert torch.equal(out[0], torch.zeros(2, device=device))
    assert torch.equal(out[3], torch.zeros(2, device=device))
    torch.testing.assert_close(out[1], x[0].detach() @ w[2].detach())


@pytest.mark.parametrize("device", DEVICES)
def test_zero_rows_and_zero_outputs(device):
    rmap = random_map(0, 0, 2, 0, device)
    x = torch.empty(0, 4, device=device)
    out = relational_conv(x, _weight(2, 1, 4, 3, torch.float32, device), rmap)
    assert out.shape == (0, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    rmap = random_map(10, 8, 3, 60, device)
    x = _features(10, 16, torch.float32, device)[:, ::2]
    w = _weight(3, 1, 5, 8, torch.float32, device).transpose(1, 2)
    assert not x.is_contiguous() and not w.is_contiguous()
    ref = relational_conv_reference(x.double(), w.double(), rmap)
    assert rel_error(relational_conv(x, w, rmap), ref) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
def test_large_channels_and_odd_sizes(device):
    rmap = random_map(300, 257, 27, 5000, device, with_scale=False)
    for cin, cout in [(3, 17), (64, 64), (129, 33)]:
        x = _features(300, cin, torch.float32, device)
        w = _weight(27, 1, cin, cout, torch.float32, device)
        ref = relational_conv_reference(x.double(), w.double(), rmap)
        assert rel_error(relational_conv(x, w, rmap), ref) < TOLERANCE[torch.float32]
