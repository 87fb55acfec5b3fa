"""relconv.spconv.SparseSequential folds an eval-mode BatchNorm1d (and a following ReLU) into the
preceding sparse conv when no gradient is recorded: the same outputs as the modules run one by
one, the BatchNorm module not called, and every other mode unfolded."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from torch import nn

import relconv.spconv as spconv
from relconv.voxel import inference_folding
from tests.compat.spconv_refs import random_tensor
from tests.conftest import DEVICES

NORM = partial(nn.BatchNorm1d, eps=1e-3, momentum=0.01)  # OpenPCDet's norm_fn


def _bn(channels: int, seed: int) -> nn.BatchNorm1d:
    bn = NORM(channels).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5, generator=g)
        bn.bias.uniform_(-0.5, 0.5, generator=g)
        bn.running_mean.uniform_(-1.0, 1.0, generator=g)
        bn.running_var.uniform_(0.5, 2.0, generator=g)
    return bn


def _block(kind: str, relu: bool) -> tuple[spconv.SparseSequential, spconv.SparseConvTensor]:
    x = random_tensor([9, 8, 7], 2, 150, 4, seed=3)
    x = x.replace_feature(x.features.double())
    if kind == "subm":
        conv = spconv.SubMConv3d(4, 6, 3, bias=False, indice_key="s")
    elif kind == "strided":
        conv = spconv.SparseConv3d(4, 6, 3, stride=2, padding=1, bias=True)
    else:  # inverse: the input comes from a strided layer's output
        down = spconv.SparseConv3d(4, 4, 3, stride=2, padding=1, indice_key="d").double()
        with torch.no_grad():
            x = down(x)
        conv = spconv.SparseInverseConv3d(4, 6, 3, indice_key="d", bias=True)
    modules = [conv.double(), _bn(6, 1)] + ([nn.ReLU()] if relu else [])
    return spconv.SparseSequential(*modules).eval(), x


def _bn_calls(block: spconv.SparseSequential) -> list:
    calls: list = []
    block[1].register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("relu", [True, False], ids=["relu", "no-relu"])
@pytest.mark.parametrize("kind", ["subm", "strided", "inverse"])
def test_eval_forward_folds_and_matches_the_modules_one_by_one(kind, relu):
    block, x = _block(kind, relu)
    calls = _bn_calls(block)
    with torch.no_grad():
        with inference_folding(False):
            want = block(x)
        assert len(calls) == 1
        got = block(x)
        again = block(x)
    assert len(calls) == 1, "the folded forward does not call the BatchNorm"
    torch.testing.assert_close(got.indices, want.indices)
    torch.testing.assert_close(got.features, want.features, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(again.features, got.features, rtol=0, atol=0)
    if relu:
        assert (got.features >= 0).all() and (want.features < 0).sum() == 0


def test_folded_parameters_follow_the_batchnorm_statistics():
    block, x = _block("subm", True)
    with torch.no_grad():
        block(x)
        block[1].running_mean.add_(0.25)  # an in-place update, as load_state_dict makes
        got = block(x)
        with inference_folding(False):
            want = block(x)
    torch.testing.assert_close(got.features, want.features, rtol=1e-12, atol=1e-12)


def test_training_or_autograd_runs_the_modules():
    block, x = _block("subm", True)
    calls = _bn_calls(block)
    block(x)  # eval, but autograd records: unfolded
    with torch.no_grad():
        block.train()(x)
        block.eval()
        block[1].train()  # a BatchNorm left in training mode normalises by the batch
        block(x)
    assert len(calls) == 3


def test_empty_tensor_and_unfoldable_neighbours_pass_through():
    block, x = _block("subm", True)
    empty = spconv.SparseConvTensor(x.features[:0], x.indices[:0], x.spatial_shape, x.batch_size)
    with torch.no_grad():
        assert block(empty).features.shape == (0, 6)
        # A BatchNorm of another width, or a conv without a BatchNorm after it, stays as it is.
        conv = spconv.SubMConv3d(4, 6, 3).double()
        odd = spconv.SparseSequential(conv, nn.ReLU(), _bn(6, 2)).eval()
        with inference_folding(False):
            want = odd(x)
        torch.testing.assert_close(odd(x).features, want.features, rtol=0, atol=0)


def _train_block(device: str, dtype: torch.dtype) -> tuple[spconv.SparseSequential, spconv.SparseConvTensor]:
    x = random_tensor([9, 8, 7], 2, 150, 4, seed=5, device=device, dtype=dtype)
    torch.manual_seed(0)
    block = spconv.SparseSequential(spconv.SubMConv3d(4, 6, 3, bias=False), NORM(6), nn.ReLU(), NORM(6))
    return block.to(device), x


def _one_by_one(block: spconv.SparseSequential, x: spconv.SparseConvTensor) -> spconv.SparseConvTensor:
    y = block[0](x)
    for module in list(block)[1:]:
        y = y.replace_feature(module(y.features))
    return y


@pytest.mark.parametrize(
    ("device", "mixed"),
    [
        pytest.param("cpu", False, id="cpu-fp32"),
        pytest.param("cuda", False, id="cuda-fp32", marks=pytest.mark.cuda),
        pytest.param("cuda", True, id="cuda-autocast-fp16", marks=pytest.mark.cuda),
    ],
)
def test_training_batchnorm_relu_runs_match_torch_modules(device, mixed):
    """BatchNorm1d -> ReLU and a lone BatchNorm1d in training: the same features, gradients, running
    statistics and batch counts as torch's modules called one by one."""
    block, x = _train_block(device, torch.float32)
    twin = copy.deepcopy(block)
    feats = x.features.clone().requires_grad_(True)
    twin_feats = x.features.clone().requires_grad_(True)
    with torch.autocast(device, dtype=torch.float16, enabled=mixed):
        got = block(x.replace_feature(feats))
        want = _one_by_one(twin, x.replace_feature(twin_feats))
    tol = {"rtol": 2e-2, "atol": 2e-2} if mixed else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(got.features.float(), want.features.float(), **tol)
    weights = torch.randn_like(want.features.float())
    (got.features.float() * weights).sum().backward()
    (want.features.float() * weights).sum().backward()
    torch.testing.assert_close(feats.grad, twin_feats.grad, **tol)
    for (name, a), b in zip(block.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, **tol, msg=name)
    for (name, a), b in zip(block.named_buffers(), twin.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5, msg=name)
    assert int(block[1].num_batches_tracked) == 1 and int(block[3].num_batches_tracked) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_training_batchnorm_of_one_row_raises_as_torch_does(device):
    block, x = _train_block(device, torch.float32)
    one = spconv.SparseConvTensor(x.features[:1], x.indices[:1], x.spatial_shape, x.batch_size)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        block(one)


def test_hooked_batchnorm_is_called_as_a_module_in_training():
    block, x = _train_block("cpu", torch.float32)
    calls: list = []
    block[1].register_forward_hook(lambda *_: calls.append(1))
    block(x)
    assert len(calls) == 1
