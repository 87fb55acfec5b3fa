"""relconv.voxel.BatchNorm (and BatchNorm -> ReLU in Sequential) runs relconv's batch_norm_act op on
CUDA: same outputs, gradients and module state (running statistics, num_batches_tracked) as
torch's BatchNorm1d + ReLU applied to the features."""

import copy

import pytest
import torch

from relconv.voxel import BatchNorm, Conv3d, ReLU, Sequential, VoxelTensor

pytestmark = pytest.mark.cuda


def _input(n=3000, c=16, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    coords = torch.unique(torch.randint(0, 40, (n, 3), generator=gen), dim=0)
    coords = torch.cat([torch.zeros(len(coords), 1, dtype=coords.dtype), coords], 1).int()
    feats = torch.randn(len(coords), c, generator=gen) * 3 + 1
    return VoxelTensor(feats.to("cuda", dtype), coords.cuda())


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_batchnorm_matches_torch_modules(relu, dtype):
    torch.manual_seed(0)
    layers = [Conv3d(16, 24, 3), BatchNorm(24)] + ([ReLU(True)] if relu else [])
    seq = Sequential(*layers).cuda().train()
    ref = copy.deepcopy(seq)
    x = _input()
    grad = torch.randn(len(x), 24, device="cuda")
    for _ in range(2):  # the running statistics move twice
        with torch.autocast("cuda", dtype=torch.float16, enabled=dtype == torch.float16):
            out = seq(x).feats
            h = ref[0](x).feats
            want = ref[1].module(h)
            want = torch.relu(want) if relu else want
        assert out.dtype == want.dtype
        torch.testing.assert_close(out, want, rtol=2e-3, atol=2e-3 if dtype == torch.float16 else 1e-5)
        out.backward(grad.to(out.dtype))
        want.backward(grad.to(want.dtype))
    a, b = seq[1].module, ref[1].module
    torch.testing.assert_close(a.running_mean, b.running_mean)
    torch.testing.assert_close(a.running_var, b.running_var)
    assert a.num_batches_tracked.item() == b.num_batches_tracked.item() == 2
    for p, q in ((a.weight, b.weight), (a.bias, b.bias), (seq[0].weight, ref[0].weight)):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-2, atol=1e-2)


def test_eval_mode_with_grad_uses_running_statistics():
    torch.manual_seed(0)
    seq = Sequential(Conv3d(16, 24, 3), BatchNorm(24), ReLU()).cuda()
    with torch.no_grad():
        seq[1].module.running_mean.uniform_(-1, 1)
        seq[1].module.running_var.uniform_(0.5, 2)
    seq.eval()
    x = _input()
    out = seq(x).feats  # grad enabled: layer by layer, BatchNorm + ReLU as one op
    want = torch.relu(seq[1].module(seq[0](x).feats))
    torch.testing.assert_close(out, want)
    out.sum().backward()
    assert seq[1].module.weight.grad is not None
