"""relconv.torchsparse.nn's feature-wise modules, pooling, crop and ToDenseBEVConvolution against
torch on the features and plain loops; missing names raise NotImplementedError."""

from __future__ import annotations

import pytest
import torch

import relconv.torchsparse.nn as spnn
import relconv.torchsparse.nn.functional as tsF
from relconv.torchsparse import SparseTensor
from relconv.torchsparse.nn.utils import fapply, get_kernel_offsets
from tests.compat.torchsparse_refs import scene
from tests.conftest import DEVICES


# TorchSparse's InstanceNorm runs torch's InstanceNorm1d on the [N, C] features, which torch reads
# as one unbatched [C=N, L=C] instance: per-voxel statistics, with torch's warning about it.
@pytest.mark.filterwarnings("ignore:input's size at dim=0")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lambda: spnn.ReLU(), torch.nn.ReLU),
        (lambda: spnn.LeakyReLU(0.2), lambda: torch.nn.LeakyReLU(0.2)),
        (lambda: spnn.SiLU(), torch.nn.SiLU),
        (lambda: spnn.BatchNorm(3), lambda: torch.nn.BatchNorm1d(3)),
        (lambda: spnn.InstanceNorm(3), lambda: torch.nn.InstanceNorm1d(3)),
    ],
    ids=["relu", "leaky_relu", "silu", "batchnorm", "instancenorm"],
)
def test_featurewise_modules_equal_torch(device, ours, theirs):
    x = scene(device=device)
    x.feats = x.feats.float().requires_grad_(True)
    a, b = ours().to(device), theirs().to(device)
    b.load_state_dict(a.state_dict())
    assert list(a.state_dict()) == list(b.state_dict())  # TorchSparse's keys are torch's
    for mode in (True, False):
        a.train(mode), b.train(mode)
        out = a(x)
        ref = b(x.feats)
        torch.testing.assert_close(out.feats, ref)
        assert out.coords is x.coords and out._caches is x._caches
        g = torch.randn_like(ref)
        got = torch.autograd.grad((out.feats * g).sum(), x.feats)[0]
        want = torch.autograd.grad((ref * g).sum(), x.feats)[0]
        torch.testing.assert_close(got, want)
    if isinstance(b, torch.nn.BatchNorm1d):
        torch.testing.assert_close(a.running_mean, b.running_mean)
        torch.testing.assert_close(a.running_var, b.running_var)


def test_groupnorm_normalises_each_sample_on_its_own():
    x = scene()
    gn = spnn.GroupNorm(1, 3).double()
    out = gn(x)
    for b in (0, 1):
        rows = x.coords[:, 0] == b
        ref = torch.nn.functional.group_norm(x.feats[rows].t().unsqueeze(0), 1, gn.weight, gn.bias, gn.eps)
        torch.testing.assert_close(out.feats[rows], ref.squeeze(0).t())


@pytest.mark.parametrize("device", DEVICES)
def test_global_pools_per_sample(device):
    x = scene(device=device)
    avg, mx = spnn.GlobalAvgPool()(x), spnn.GlobalMaxPool()(x)
    for b in (0, 1):
        rows = x.coords[:, 0] == b
        torch.testing.assert_close(avg[b], x.feats[rows].mean(0))
        torch.testing.assert_close(mx[b], x.feats[rows].amax(0))
    torch.testing.assert_close(tsF.global_avg_pool(x), avg)
    torch.testing.assert_close(tsF.global_max_pool(x), mx)
    with pytest.raises(TypeError, match="SparseTensor"):
        tsF.global_avg_pool(x.feats)


def test_functional_activations():
    x = scene()
    torch.testing.assert_close(tsF.relu(x, inplace=False).feats, torch.relu(x.feats))
    torch.testing.assert_close(tsF.silu(x, inplace=False).feats, torch.nn.functional.silu(x.feats))
    torch.testing.assert_close(
        tsF.leaky_relu(x, inplace=False).feats, torch.nn.functional.leaky_relu(x.feats, 0.1)
    )
    doubled = fapply(x, torch.mul, 2)
    torch.testing.assert_close(doubled.feats, 2 * x.feats)
    with pytest.raises(TypeError, match="SparseTensor"):
        spnn.ReLU()(x.feats)


def test_crop_bounds_the_first_three_columns():
    x = scene()
    out = spnn.SparseCrop((0, 2, 2), (1, 7, 7))(x)
    mask = (x.coords[:, :3] >= torch.tensor([0, 2, 2])).all(1) & (
        x.coords[:, :3] < torch.tensor([1, 7, 7])
    ).all(1)
    assert torch.equal(out.coords, x.coords[mask]) and torch.equal(out.feats, x.feats[mask])
    with pytest.raises(ValueError, match="3 values"):
        tsF.spcrop(x, (0, 1))


def test_get_kernel_offsets_order():
    odd = get_kernel_offsets(3)
    assert odd.shape == (27, 3) and odd[0].tolist() == [-1, -1, -1] and odd[1].tolist() == [0, -1, -1]
    even = get_kernel_offsets(2, stride=2)
    assert even.tolist() == [[x, y, z] for x in (0, 2) for y in (0, 2) for z in (0, 2)]
    assert get_kernel_offsets(4)[:, 0].unique().tolist() == [-1, 0, 1, 2]


def test_to_dense_bev_convolution_equals_a_loop():
    torch.manual_seed(0)
    coords = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 0], [1, 3, 0, 1], [0, 2, 2, 3]], dtype=torch.int32)
    x = SparseTensor(torch.randn(4, 3), coords)
    bev = spnn.ToDenseBEVConvolution(3, 5, shape=(4, 4, 4), dim=1, bias=True)
    with torch.no_grad():
        bev.bias.normal_()
    out = bev(x)
    assert out.shape == (2, 5, 4, 4)
    assert set(bev.state_dict()) == {"kernel", "bias", "offset", "shape"}
    ref = torch.zeros(2, 4, 4, 5)
    for (b, cx, cy, _cz), f in zip(coords.tolist(), x.feats, strict=True):
        # TorchSparse 2.1 indexes the batch-first rows with dim=1 and bev_dims=[0, 2]: (b, b, y)
        ref[b, b, cy] += f @ bev.kernel[cx] + bev.bias[0]
    torch.testing.assert_close(out, ref.permute(0, 3, 1, 2))
    with pytest.raises(ValueError, match="dim"):
        spnn.ToDenseBEVConvolution(3, 5, shape=(4, 4, 4), dim=3)


def test_missing_names_say_what_is_missing():
    with pytest.raises(NotImplementedError, match="ToBEVConvolution"):
        spnn.ToBEVConvolution  # noqa: B018
    with pytest.raises(NotImplementedError, match="spdownsample"):
        from relconv.torchsparse.nn.functional import spdownsample  # noqa: F401
    with pytest.raises(AttributeError, match="NoSuchLayer"):
        spnn.NoSuchLayer  # noqa: B018
