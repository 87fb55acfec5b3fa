"""Float32 weights with half-precision features (autocast): the op casts the weight below autograd,
so a training step records no cast node per conv and the float32 weight gets its gradient directly,
equal to the gradient through an explicit cast."""

import pytest
import torch

from relconv import relational_conv
from tests.ops.maps import random_map

CASES = [
    pytest.param("cpu", torch.bfloat16, id="cpu-bf16"),
    pytest.param("cuda", torch.float16, id="cuda-fp16", marks=pytest.mark.cuda),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=pytest.mark.cuda),
]


def _setup(device, dtype):
    rmap = random_map(300, 250, 27, 4000, device, with_scale=False)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300, 32, generator=gen).to(device, dtype)
    w = (torch.randn(27, 32, 16, generator=gen) / 32**0.5).to(device)
    grad = torch.randn(250, 16, generator=gen).to(device, dtype)
    return rmap, x, w, grad


def _weight_leaf_reached_directly(out, weight):
    """Whether the weight's AccumulateGrad is reached from the op's node through views only (no cast
    node: ToCopyBackward)."""
    stack, seen, reached = [out.grad_fn], set(), False
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if "ToCopy" in type(fn).__name__:
            continue  # a cast (x's, under autocast) is not a path the weight may take
        reached |= getattr(fn, "variable", None) is weight
        stack.extend(f for f, _ in fn.next_functions)
    return reached


@pytest.mark.parametrize("device,dtype", CASES)
def test_float32_weight_with_half_features_matches_explicit_cast(device, dtype):
    rmap, x, w, grad = _setup(device, dtype)
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = relational_conv(xa, wa, rmap)
    assert out.dtype == dtype and _weight_leaf_reached_directly(out, wa)
    out.backward(grad)
    xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = relational_conv(xb, wb.to(dtype), rmap)
    ref.backward(grad)
    # Same kernels on the same values: bitwise equal on the CPU; the CUDA pair kernels sum with float
    # atomics in any order, so there the results agree to within their rounding. The weight gradient
    # of the float32 weight is the float32 accumulation itself (not rounded to half and back).
    assert wa.grad.dtype == torch.float32
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=2e-3, atol=2e-3)
    for got, want in ((out, ref), (xa.grad, xb.grad)):
        if device == "cpu":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(wa.grad, wb.grad, **tol)
    accumulated = torch.ops.relconv.relational_conv_weight_grad(
        x, grad, rmap.in_index, rmap.out_index, rmap.rel_ptr, None, 1, torch.float32
    ).squeeze(1)
    assert accumulated.dtype == torch.float32
    if device == "cpu":
        assert torch.equal(wa.grad, accumulated)
    else:
        torch.testing.assert_close(wa.grad, accumulated, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device,dtype", CASES)
def test_autocast_passes_the_float32_weight_to_the_op(device, dtype):
    rmap, x, w, grad = _setup(device, dtype)
    xa, wa = x.float().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast(device, dtype=dtype):
        out = relational_conv(xa, wa, rmap)
    assert out.dtype == dtype and _weight_leaf_reached_directly(out, wa)
    out.backward(grad)
    assert wa.grad.dtype == torch.float32 and xa.grad.dtype == torch.float32


def test_weight_grad_out_dtype_is_checked():
    rmap, x, _, grad = _setup("cpu", torch.bfloat16)
    with pytest.raises(ValueError, match="out_dtype must be"):
        torch.ops.relconv.relational_conv_weight_grad(
            x, grad, rmap.in_index, rmap.out_index, rmap.rel_ptr, None, 1, torch.float64
        )


def test_other_dtype_mismatches_are_still_errors():
    rmap, x, w, _ = _setup("cpu", torch.float32)
    with pytest.raises((ValueError, RuntimeError), match="weight dtype"):
        relational_conv(x.float(), w.double(), rmap)
