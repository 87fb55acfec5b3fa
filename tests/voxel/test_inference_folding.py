"""Eval-mode forwards without autograd fold BatchNorm into the convs on the fly: same outputs as the
layer-by-layer network, parameters and statistics followed, never in training or under autograd."""

import pytest
import torch
from batchnorm_scenes import randomise_batchnorm, scan

from relconv.voxel import BatchNorm, Conv3d, ReLU, Sequential, inference_folding
from relconv.voxel.models import MinkUNet


def _count_batchnorm_calls(monkeypatch):
    """Counts every BatchNorm normalisation, alone or fused with its ReLU."""
    calls = []
    normalise = BatchNorm.normalise

    def counting(self, feats, relu):
        calls.append(1)
        return normalise(self, feats, relu)

    monkeypatch.setattr(BatchNorm, "normalise", counting)
    return calls


def _model():
    torch.manual_seed(0)
    model = MinkUNet(4, 5, width=0.25).double()
    randomise_batchnorm(model)
    return model.eval()


def test_eval_no_grad_folds_every_batchnorm_and_matches_unfolded(monkeypatch):
    model, x = _model(), scan()
    calls = _count_batchnorm_calls(monkeypatch)
    with torch.no_grad(), inference_folding(False):
        ref = model(x)
    unfolded_calls = len(calls)
    with torch.no_grad():
        out = model(x)
    assert unfolded_calls == sum(isinstance(m, BatchNorm) for m in model.modules()) > 0
    assert len(calls) == unfolded_calls  # the folded forward ran no BatchNorm module
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), ref, rtol=1e-10, atol=1e-10)


def test_folding_follows_parameter_and_statistic_changes():
    seq = Sequential(Conv3d(4, 8, 3, bias=True), BatchNorm(8), ReLU()).double()
    randomise_batchnorm(seq, seed=1)
    seq.eval()
    x = scan()

    def check():
        with torch.no_grad():
            out = seq(x).feats
            with inference_folding(False):
                ref = seq(x).feats
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        return out

    first = check()
    with torch.no_grad():
        seq[1].module.running_mean.add_(0.5)  # in place: the version counter moves
    second = check()
    assert not torch.equal(first, second)
    with torch.no_grad():
        seq[0].weight.mul_(-1.0)
    check()
    seq[1].module.weight = torch.nn.Parameter(torch.rand(8, dtype=torch.float64))  # a new tensor
    check()
    moved = {k: v + 0.1 for k, v in seq.state_dict().items() if v.is_floating_point()}
    seq.load_state_dict(moved, strict=False)
    check()


def test_no_folding_in_training_or_under_autograd(monkeypatch):
    model, x = _model(), scan()
    calls = _count_batchnorm_calls(monkeypatch)
    model(x).sum().backward()  # eval mode, grad enabled: layer by layer, BatchNorm differentiable
    bn = next(m.module for m in model.modules() if isinstance(m, BatchNorm))
    assert len(calls) > 0 and bn.weight.grad is not None
    calls.clear()
    model.train()
    with torch.no_grad():
        model(x)
    assert len(calls) > 0  # training mode normalises by the batch


def test_batchnorm_left_in_training_mode_is_not_folded():
    seq = Sequential(Conv3d(4, 8, 3), BatchNorm(8), ReLU()).double().eval()
    seq[1].train()
    x = scan()
    with torch.no_grad():
        out = seq(x).feats
        with inference_folding(False):
            ref = seq(x).feats
    torch.testing.assert_close(out, ref)
    assert seq[1].module.num_batches_tracked.item() == 2


@pytest.mark.parametrize(
    "device,dtype", [("cpu", torch.bfloat16), pytest.param("cuda", torch.float16, marks=pytest.mark.cuda)]
)
def test_folding_under_autocast_caches_the_autocast_dtype(device, dtype):
    torch.manual_seed(0)
    model = MinkUNet(4, 5, width=0.25)
    randomise_batchnorm(model)
    model = model.to(device).eval()
    x = scan(torch.float32).to(device)
    with torch.no_grad():
        truth = model.double()(scan().to(device))
        model.float()
        with torch.autocast(device, dtype=dtype):
            out = model(x)
            with inference_folding(False):
                ref = model(x)
    plans = [m._fold_plan[1][0] for m in model.modules() if isinstance(m, Sequential) and m._fold_plan]
    caches = [step[3] for plan in plans for step in plan if type(step) is tuple]
    assert caches and all(c.weight.dtype == dtype for c in caches)

    def err(t):
        return ((t.double() - truth).norm() / truth.norm()).item()

    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    assert err(out) < tol and err(ref) < tol, (err(out), err(ref))
