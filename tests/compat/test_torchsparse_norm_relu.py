"""relconv.torchsparse's BatchNorm output waits for its first use, and an in-place ReLU as that use
runs inside the norm: the same outputs, gradients and running statistics as the norm and the ReLU
one after the other, the norm run exactly once, in the autograd and training mode of its call."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import relconv.torchsparse as ts
import relconv.torchsparse.nn as spnn
from relconv.torchsparse.backbones import SparseResNet21D
from relconv.torchsparse.nn.functional.pending import PendingNorm

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _scene(device, n=1200, grid=20, channels=4, seed=0, dtype=torch.float64) -> ts.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    coords = torch.cat(
        [torch.randint(0, 2, (n, 1), generator=g), torch.randint(0, grid, (n, 3), generator=g)], 1
    )
    coords = torch.unique(coords, dim=0).int()
    feats = torch.randn(len(coords), channels, generator=g, dtype=dtype)
    return ts.SparseTensor(feats.to(device), coords.to(device))


def _unjoined(monkeypatch):
    """The reference: every ReLU after a BatchNorm runs on its own."""
    monkeypatch.setattr(PendingNorm, "with_relu", lambda self: None)


def _step(model, x):
    model.zero_grad(set_to_none=True)
    feats = x.F.clone().requires_grad_()
    outs = model(ts.SparseTensor(feats, x.C))  # one tensor per stage
    out = torch.cat([o.F.flatten() for o in outs])
    (out * torch.linspace(-1, 1, out.numel(), device=out.device, dtype=out.dtype)).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    stats = {name: b.clone() for name, b in model.named_buffers()}
    return out.detach(), feats.grad, grads, stats


@pytest.fixture
def deterministic(monkeypatch):
    """CUDA weight gradients sum by atomics in an order that changes from run to run; after the
    norms' cancellations that order alone moves some float64 weight-gradient elements by ~1e-9.
    Deterministic algorithms make both runs sum in one fixed order."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("device", DEVICES)
def test_training_step_equals_norm_then_relu(device, monkeypatch, deterministic):
    # float64 on both devices: in float32 a norm output within rounding of zero may take either
    # side of the ReLU in the two runs, and that one element moves its gradients by O(1).
    dtype = torch.float64
    model = SparseResNet21D(in_channels=4).to(device, dtype).train()
    ref = copy.deepcopy(model)
    x = _scene(device, dtype=dtype)
    joined = []
    with_relu = PendingNorm.with_relu
    monkeypatch.setattr(PendingNorm, "with_relu", lambda self: joined.append(1) or with_relu(self))
    got = _step(model, x)
    # Five conv blocks and the first norm of eight residual blocks; their other ReLUs follow a sum.
    assert len(joined) == 13
    _unjoined(monkeypatch)
    want = _step(ref, x)
    tol = {"rtol": 1e-10, "atol": 1e-10}
    torch.testing.assert_close(got[0], want[0], **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    assert got[2].keys() == want[2].keys() and got[3].keys() == want[3].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], **tol, msg=name)
    for name in want[3]:  # running statistics updated once, num_batches_tracked counted once
        torch.testing.assert_close(got[3][name], want[3][name], **tol, msg=name)


def _norm(device="cpu"):
    bn = spnn.BatchNorm(4).double().to(device)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


def test_inplace_relu_leaves_the_norm_output_relu_d_and_runs_the_norm_once():
    bn, x = _norm(), _scene("cpu")
    want = torch.relu(nn.functional.batch_norm(x.F, None, None, bn.weight, bn.bias, True))
    y = bn(x)
    assert type(y) is PendingNorm and bn.num_batches_tracked.item() == 0
    z = spnn.ReLU(True)(y)
    assert type(y) is ts.SparseTensor and type(z) is ts.SparseTensor
    torch.testing.assert_close(z.F, want)
    assert torch.equal(y.F, z.F) and torch.equal(y.C, x.C) and y.s == x.s
    assert bn.num_batches_tracked.item() == 1


def test_other_uses_run_the_norm_alone():
    bn, x = _norm(), _scene("cpu")
    plain = nn.functional.batch_norm(x.F, None, None, bn.weight, bn.bias, True)
    y = bn(x)
    z = spnn.ReLU(False)(y)  # not in place: the norm's output keeps its negative values
    torch.testing.assert_close(y.F, plain)
    torch.testing.assert_close(z.F, torch.relu(plain))
    y2 = bn(x)
    assert torch.equal(y2.C, x.C)  # any attribute runs it
    torch.testing.assert_close(spnn.ReLU(True)(y2).F, torch.relu(plain))  # already run: relu_ on it
    assert bn.num_batches_tracked.item() == 2


def test_norm_runs_in_the_mode_of_its_call():
    bn, x = _norm(), _scene("cpu")
    x.F.requires_grad_()
    y = bn(x)
    batch = nn.functional.batch_norm(x.F.detach(), None, None, bn.weight.detach(), bn.bias.detach(), True)
    bn.eval()
    with torch.no_grad():
        feats = y.F  # runs now: with autograd and the batch statistics of its training-mode call
    assert feats.requires_grad and not bn.training
    torch.testing.assert_close(feats.detach(), batch)


def test_copies_and_pickles_hold_the_norm_result():
    bn, x = _norm(), _scene("cpu")
    for clone in (copy.copy, copy.deepcopy, lambda t: pickle.loads(pickle.dumps(t))):
        with torch.no_grad():  # deepcopy takes graph leaves only
            y = bn(x)
        c = clone(y)
        assert type(c) is ts.SparseTensor
        torch.testing.assert_close(c.F, y.F)


def test_input_changed_in_place_before_the_norm_runs_is_refused():
    bn, x = _norm(), _scene("cpu")
    y = bn(x)
    x.F.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place"):
        _ = y.F


def test_unused_norm_output_leaves_the_running_statistics():
    bn, x = _norm(), _scene("cpu")
    mean = bn.running_mean.clone()
    bn(x)
    assert torch.equal(bn.running_mean, mean) and bn.num_batches_tracked.item() == 0
