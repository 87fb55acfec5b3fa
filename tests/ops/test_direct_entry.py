"""The direct Python entries of the per-layer ops (`relconv._C.relational_conv`, `batch_norm_act`):
the same kernels as torch.ops at every dispatch key, taken in eager mode, and left for the boxed
torch.ops call where a `__torch_function__` override or mode must see the op."""

import importlib

import pytest
import torch
from torch.overrides import TorchFunctionMode

from relconv import _ext, relational_conv
from tests.conftest import DEVICES
from tests.ops.maps import random_map

rc = importlib.import_module("relconv.ops.relational_conv")
CONV = torch.ops.relconv.relational_conv.default
BATCH_NORM = torch.ops.relconv.batch_norm_act.default


def _conv_args(device, requires_grad=False):
    rmap = random_map(30, 20, 4, 200, device, with_scale=False)
    x = torch.randn(30, 6, device=device, requires_grad=requires_grad)
    w = torch.randn(4, 6, 5, device=device, requires_grad=requires_grad)
    b = torch.randn(5, device=device, requires_grad=requires_grad)
    pairs = rmap.kernel_pairs()
    return (x, w, *pairs, None, rmap.num_out, None, None, b, True, None, None, False)


@pytest.mark.parametrize("device", DEVICES)
def test_direct_conv_entry_matches_torch_ops_forward_and_backward(device):
    args = _conv_args(device, requires_grad=True)
    x, w, b = args[0], args[1], args[9]
    direct, boxed = _ext._C.relational_conv(*args), CONV(*args)
    # A pair list scatters with atomics on CUDA, so two runs of one kernel agree only to rounding:
    # a few fp32 ulps of the sums (3.3e-6 on a value of 1.1 in one GPU run).
    torch.testing.assert_close(direct, boxed, rtol=1e-5, atol=1e-5)
    up = torch.randn_like(direct)
    grads_direct = torch.autograd.grad(direct, (x, w, b), up)
    grads_boxed = torch.autograd.grad(boxed, (x, w, b), up)
    for got, want in zip(grads_direct, grads_boxed, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_direct_batch_norm_entry_matches_torch_ops(device):
    x = torch.randn(50, 8, device=device) * 3 + 1
    w, b = torch.rand(8, device=device) + 0.5, torch.randn(8, device=device)
    stats = [torch.zeros(8, device=device), torch.ones(8, device=device)]
    copies = [t.clone() for t in stats]
    direct = _ext._C.batch_norm_act(x, w, b, *stats, True, 0.1, 1e-5, True, None)
    boxed = BATCH_NORM(x, w, b, *copies, True, 0.1, 1e-5, True, None)
    for got, want in zip((*direct, *stats), (*boxed, *copies), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_eager_calls_take_the_direct_entry(monkeypatch):
    """relational_conv reaches the op through `_C` in eager mode (no boxed argument parsing)."""
    calls = []

    class Counting:
        @staticmethod
        def relational_conv(*args):
            calls.append(len(args))
            return _ext._C.relational_conv(*args)

    monkeypatch.setattr(rc, "_C", Counting)
    rmap = random_map(30, 20, 4, 200, with_scale=False)
    relational_conv(torch.randn(30, 6), torch.randn(4, 6, 5), rmap)
    assert calls == [14]


def test_torch_function_modes_see_the_op():
    """Under a TorchFunctionMode the call goes through torch.ops, so the mode sees it as it sees any op."""
    seen = []

    class Recording(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    rmap = random_map(30, 20, 4, 200, with_scale=False)
    x, w = torch.randn(30, 6), torch.randn(4, 6, 5)
    with Recording():
        out = relational_conv(x, w, rmap)
    assert CONV in seen
    torch.testing.assert_close(out, relational_conv(x, w, rmap))
