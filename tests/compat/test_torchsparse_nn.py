"""relconv.torchsparse.nn's feature-wise modules, pooling, crop and BEV modules against torch on
the features and plain loops; missing names raise NotImplementedError."""

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


def test_bev_modules_refuse_voxels_outside_their_grid():
    coords = torch.tensor([[0, 1, 2, 3], [0, 1, 5, 0]], dtype=torch.int32)  # column 2 = 5 >= 4
    x = SparseTensor(torch.randn(2, 3), coords)
    with pytest.raises(ValueError, match="outside the grid"):
        spnn.ToDenseBEVConvolution(3, 5, shape=(4, 4, 4))(x)
    with pytest.raises(ValueError, match="outside the grid"):
        spnn.ToDenseBEVConvolution(3, 5, shape=(8, 1, 8))(x)  # height (column 1) 1 >= shape[1] = 1
    with pytest.raises(ValueError, match="outside the grid"):
        spnn.ToBEVHeightCompression(3, shape=(4, 4, 4))(x)
    with pytest.raises(ValueError, match="no voxels"):
        spnn.ToBEVHeightCompression(3, shape=(4, 4, 4))(SparseTensor(torch.randn(0, 3), coords[:0]))
    with pytest.raises(ValueError, match="channels"):
        spnn.ToBEVHeightCompression(5, shape=(4, 4, 4))(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("dim", "stride", "offset"), [(1, 1, (0, 0, 0)), (2, 2, (0, 1, 0)), (0, 1, (0, 0, 1))]
)
def test_bev_height_compression_equals_a_loop(device, dim, stride, offset):
    g = torch.Generator().manual_seed(dim)
    shape = (4, 5, 6)
    coords = torch.cat(
        [torch.randint(0, 2, (40, 1), generator=g), torch.randint(1, 4, (40, 3), generator=g)], 1
    )
    coords = torch.unique(coords, dim=0).int()
    feats = torch.randn(coords.shape[0], 3, generator=g)
    module = spnn.ToBEVHeightCompression(3, shape=shape, offset=offset, dim=dim).to(device)
    assert set(module.state_dict()) == {"offset", "shape"}
    out = module(SparseTensor(feats.to(device), coords.to(device), stride=stride)).cpu()
    # TorchSparse 2.1 indexes batch-first rows with axes meant for (x, y, z): `dim` and the BEV axes
    # pick columns of (b, x, y, z) (offset included) but entries of `shape` and of the stride.
    bev = [a for a in range(3) if a != dim]
    height = shape[dim]
    ref = torch.zeros(2, shape[bev[0]], shape[bev[1]], height, 3)
    for row, f in zip(coords.tolist(), feats, strict=True):
        d = [v - o for v, o in zip(row, (*offset, 0), strict=True)]
        i, j, z = (int(d[a] / stride) for a in (*bev, dim))  # int() truncates, as TorchSparse does
        ref[d[0], i, j, min(max(z, 0), height - 1)] += f
    assert out.shape == (2, height * 3, shape[bev[0]], shape[bev[1]])
    torch.testing.assert_close(out, ref.reshape(2, shape[bev[0]], shape[bev[1]], -1).permute(0, 3, 1, 2))


def test_modules_exports_every_layer_as_torchsparse_does():
    import relconv.torchsparse.nn.modules as modules

    assert modules.Conv3d is spnn.Conv3d
    assert modules.ToDenseBEVConvolution is spnn.ToDenseBEVConvolution
    assert modules.ToBEVHeightCompression is spnn.ToBEVHeightCompression
    with pytest.raises(NotImplementedError, match="ToBEVReduction"):
        modules.ToBEVReduction  # noqa: B018


def test_missing_names_say_what_is_missing():
    with pytest.raises(NotImplementedError, match="own forward fails"):
        spnn.ToBEVConvolution  # noqa: B018
    with pytest.raises(NotImplementedError, match="spdownsample"):
        from relconv.torchsparse.nn.functional import spdownsample  # noqa: F401
    with pytest.raises(AttributeError, match="NoSuchLayer"):
        spnn.NoSuchLayer  # noqa: B018
