"""Float32 weights with half-precision features (autocast): the op casts the weight below autograd,
so a training step records no cast node per conv and the float32 weight gets its gradient directly,
equal to the gradient through an explicit cast."""

import pytest
import torch

from relconv import relational_conv
from tests.conftest import requires_cuda
from tests.ops.maps import random_map

CASES = [
    pytest.param("cpu", torch.bfloat16, id="cpu-bf16"),
    pytest.param("cuda", torch.float16, id="cuda-fp16", marks=[pytest.mark.cuda, requires_cuda]),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=[pytest.mark.cuda, requires_cuda]),
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
    # Same kernels on the same values; the CUDA weight gradient may sum its tiles with float atomics
    # in either order, so it is compared to within its rounding, the rest bitwise.
    assert torch.equal(out, ref) and torch.equal(xa.grad, xb.grad)
    assert wa.grad.dtype == torch.float32
    torch.testing.assert_close(wa.grad, wb.grad, rtol=1e-2 if dtype == torch.bfloat16 else 2e-3, atol=1e-3)


@pytest.mark.parametrize("device,dtype", CASES)
def test_autocast_passes_the_float32_weight_to_the_op(device, dtype):
    rmap, x, w, grad = _setup(device, dtype)
    xa, wa = x.float().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast(device, dtype=dtype):
        out = relational_conv(xa, wa, rmap)
    assert out.dtype == dtype and _weight_leaf_reached_directly(out, wa)
    out.backward(grad)
    assert wa.grad.dtype == torch.float32 and xa.grad.dtype == torch.float32


def test_other_dtype_mismatches_are_still_errors():
    rmap, x, w, _ = _setup("cpu", torch.float32)
    with pytest.raises((ValueError, RuntimeError), match="weight dtype"):
        relational_conv(x.float(), w.double(), rmap)
