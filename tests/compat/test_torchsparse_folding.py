"""relconv.torchsparse folds an eval-mode BatchNorm and a ReLU into the preceding conv when no
gradient is recorded (the conv's output is pending until first used): the same outputs as the
unfolded network, BatchNorm's own forward not called, every other mode unfolded, and an input
changed in place before the conv runs refused."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import relconv.torchsparse as ts
import relconv.torchsparse.nn as spnn
from relconv.torchsparse.backbones import SparseResNet21D, SparseResUNet42
from relconv.torchsparse.nn.functional.pending import PendingConv
from relconv.voxel import inference_folding


def _scene(n=1500, grid=24, channels=4, seed=0) -> ts.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    coords = torch.cat(
        [torch.randint(0, 2, (n, 1), generator=g), torch.randint(0, grid, (n, 3), generator=g)], 1
    )
    coords = torch.unique(coords, dim=0).int()
    return ts.SparseTensor(torch.randn(len(coords), channels, generator=g, dtype=torch.float64), coords)


def _statistics(model: nn.Module, seed=1) -> nn.Module:
    """Non-trivial BatchNorm parameters and running statistics, so that folding changes the conv."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.uniform_(-0.5, 0.5, generator=g)
                m.running_mean.uniform_(-0.5, 0.5, generator=g)
                m.running_var.uniform_(0.5, 2.0, generator=g)
    return model.double().eval()


def _outputs(model, x) -> list:
    out = model(x)
    return [(o.C, o.F) for o in (out if isinstance(out, list) else [out])]


@pytest.mark.parametrize("backbone", [SparseResUNet42, SparseResNet21D])
def test_backbone_folded_equals_unfolded_without_calling_batchnorm(backbone, monkeypatch):
    model = _statistics(backbone(in_channels=4))
    x = _scene()
    with torch.no_grad(), inference_folding(False):
        want = _outputs(model, x)

    def refuse(self, input):
        raise AssertionError("BatchNorm ran on its own")

    monkeypatch.setattr(nn.BatchNorm1d, "forward", refuse)
    with torch.no_grad():
        got = _outputs(model, x)
    assert len(got) == len(want)
    for (gc, gf), (wc, wf) in zip(got, want, strict=True):
        assert torch.equal(gc, wc)
        torch.testing.assert_close(gf, wf, rtol=1e-12, atol=1e-12)


def _block() -> nn.Sequential:
    return _statistics(nn.Sequential(spnn.Conv3d(4, 6, 3, bias=True), spnn.BatchNorm(6), spnn.ReLU(True)))


def test_pending_output_behaves_as_a_sparse_tensor():
    block, x = _block(), _scene()
    with torch.no_grad():
        with inference_folding(False):
            want = block(x)
        out = block(x)
        assert isinstance(out, PendingConv) and isinstance(out, ts.SparseTensor)
        assert out.s == want.s and torch.equal(out.C, want.C)
        assert type(out) is ts.SparseTensor  # run on first use, then a plain tensor
        torch.testing.assert_close(out.F, want.F, rtol=1e-12, atol=1e-12)
        assert (out + want).F.shape == want.F.shape

        late = block(x)
        late.F = torch.zeros_like(want.F)  # assignment runs the conv first, then replaces
        assert torch.equal(late.F, torch.zeros_like(want.F)) and torch.equal(late.C, want.C)
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = out.missing
    # a conv output that has run: BatchNorm applies on its own
    torch.testing.assert_close(block[1](out).F, block[1](want).F, rtol=1e-12, atol=1e-12)


def test_deferred_conv_runs_without_autograd_when_used_with_it_on():
    block, x = _block(), _scene()
    with torch.no_grad():
        out = block(x)
    assert not out.F.requires_grad  # used outside no_grad, computed as it was called


def test_deferred_conv_runs_in_the_autocast_state_of_its_call():
    block, x = _block().float(), _scene()
    x = ts.SparseTensor(x.F.float(), x.C)
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with inference_folding(False):
                want_cast = block(x).F
            cast = block(x)  # called under autocast, read after it
        with inference_folding(False):
            want_plain = block(x).F
        plain = block(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            plain_feats = plain.F  # called without autocast, read under it
        cast_feats = cast.F
    assert want_cast.dtype == cast_feats.dtype == torch.bfloat16
    assert want_plain.dtype == plain_feats.dtype == torch.float32
    torch.testing.assert_close(cast_feats, want_cast, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(plain_feats, want_plain, rtol=1e-6, atol=1e-6)


def test_copies_and_pickles_of_a_pending_output_hold_the_conv_result():
    block, x = _block(), _scene()
    with torch.no_grad():
        want = block(x).F
        for clone in (copy.deepcopy, copy.copy, lambda t: pickle.loads(pickle.dumps(t))):
            got = clone(block(x))
            assert isinstance(got, ts.SparseTensor) and "_pending" not in vars(got)
            torch.testing.assert_close(got.F, want, rtol=0, atol=0)


def test_input_changed_in_place_before_the_conv_runs_is_refused():
    block, x = _block(), _scene()
    with torch.no_grad():
        out = block(x)
        x.F.add_(1.0)
        with pytest.raises(RuntimeError, match="modified in place.*inference_folding"):
            _ = out.F


def test_training_and_autograd_do_not_fold():
    block, x = _block(), _scene()
    with torch.no_grad(), inference_folding(False):
        want = block(x).F
    out = block(x)  # autograd on: the conv runs at once
    assert type(out) is ts.SparseTensor
    torch.testing.assert_close(out.F.detach(), want, rtol=1e-12, atol=1e-12)

    block.train()
    before = block[1].running_mean.clone()
    with torch.no_grad():
        assert type(block[0](x)) is PendingConv
        out = block(x)  # the conv ran for BatchNorm, which normalised by the batch on its own
    assert type(out) is ts.SparseTensor
    assert not torch.equal(block[1].running_mean, before)  # batch statistics were taken


def test_output_used_folded_and_on_its_own_gives_both_results():
    block, x = _block(), _scene()
    conv, norm = block[0], block[1]
    with torch.no_grad():
        with inference_folding(False):
            plain_want = conv(x).F
            normed_want = norm(conv(x)).F
        y = conv(x)
        normed = norm(y)
        torch.testing.assert_close(normed.F, normed_want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(y.F, plain_want, rtol=0, atol=0)
