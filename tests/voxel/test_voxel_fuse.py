"""BatchNorm folding for inference: the fused model equals the eval-mode model, and bad input is named."""

import pytest
import torch
from batchnorm_scenes import randomise_batchnorm, scan

from relconv.voxel import (
    BatchNorm,
    Conv3d,
    ReLU,
    Sequential,
    fold_batchnorm,
    fuse_conv_bn,
    inference_folding,
)
from relconv.voxel.models import MinkUNet, ResNet


@pytest.mark.parametrize("make", [lambda: MinkUNet(4, 5, width=0.25), lambda: ResNet(4, (8, 16), (1, 1), 3)])
def test_fused_model_equals_eval_model(make):
    torch.manual_seed(0)
    model = make().double()
    randomise_batchnorm(model)
    model.eval()
    x = scan()
    with torch.no_grad(), inference_folding(False):
        ref = model(x)
        fused = fuse_conv_bn(model)
        out = fused(x)
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in fused.modules())
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    assert model.training is False and any(isinstance(m, BatchNorm) for m in model.modules())


@pytest.mark.parametrize(
    "device,dtype,tol",
    [
        pytest.param("cpu", torch.float32, 1e-5, id="cpu-fp32"),
        pytest.param("cuda", torch.float16, 5e-3, id="cuda-fp16", marks=pytest.mark.cuda),
    ],
)
def test_fused_minkunet_matches_eval_model_in_low_precision(device, dtype, tol):
    """Bias and ReLU run in the conv's epilogue (one kernel per folded layer on CUDA's table path);
    the fused model must stay within the precision's rounding of the unfused one, measured against
    the float64 model so that neither side's rounding is taken as the truth."""
    torch.manual_seed(0)
    model = MinkUNet(4, 5, width=0.25).double()
    randomise_batchnorm(model)
    model.eval()
    x64 = scan()
    with torch.no_grad(), inference_folding(False):
        truth = model(x64)
        x = x64.to(device, dtype)
        low = model.to(device, dtype)
        ref = low(x)
        out = fuse_conv_bn(low)(x)
    assert out.dtype == dtype and out.shape == ref.shape

    def err(t):
        return ((t.double().cpu() - truth).norm() / truth.norm()).item()

    assert err(ref) < tol and err(out) < tol, (err(ref), err(out))


def test_fold_relu_and_grouped_weights():
    torch.manual_seed(0)
    x = scan(dtype=torch.float64)
    seq = Sequential(Conv3d(4, 8, 3, groups=2, bias=True), BatchNorm(8), ReLU()).double()
    randomise_batchnorm(seq, seed=1)
    seq.eval()
    fused = fuse_conv_bn(seq)
    assert len(fused) == 1 and fused[0].activation == "relu" and fused[0].bias is not None
    with torch.no_grad(), inference_folding(False):
        torch.testing.assert_close(fused(x).feats, seq(x).feats, rtol=1e-10, atol=1e-10)


def test_fold_batchnorm_bad_input():
    conv = Conv3d(4, 8, 3)
    with pytest.raises(ValueError, match="bn has 4 features"):
        fold_batchnorm(conv, torch.nn.BatchNorm1d(4))
    with pytest.raises(TypeError, match="conv must be"):
        fold_batchnorm(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(8))
    with pytest.raises(ValueError, match="activation must be one of"):
        Conv3d(4, 8, 3, activation="gelu")
