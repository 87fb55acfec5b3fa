"""relconv.spconv's tensor, containers, indice_key sharing, pools, tables, sparse_add and a small
OpenPCDet-like backbone."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import relconv.spconv as spconv
from tests.compat.spconv_refs import at_sites, densify, occupancy, random_tensor, site_set


# ---------------------------------------------------------------------------- SparseConvTensor
def test_dense_places_features_and_respects_channels_first():
    x = random_tensor([5, 4, 3], 2, 20, 3)
    d = x.dense()
    assert d.shape == (2, 3, 5, 4, 3)
    torch.testing.assert_close(d, densify(x.features, x.indices, x.spatial_shape, 2))
    torch.testing.assert_close(x.dense(channels_first=False), d.movedim(1, -1))


def test_from_dense_round_trips():
    x = random_tensor([5, 4, 3], 2, 20, 3)
    back = spconv.SparseConvTensor.from_dense(x.dense(channels_first=False))
    assert site_set(back.indices) == site_set(x.indices)
    torch.testing.assert_close(back.dense(), x.dense())


def test_features_are_checked_on_sites_whose_maps_exist():
    x = random_tensor([5, 4, 3], 2, 20, 3)
    conv = spconv.SubMConv3d(3, 4, 3)
    conv(x)  # the sites' relconv cache exists from here on
    with pytest.raises(TypeError, match="floating-point"):
        conv(x.replace_feature(x.features.round().int()))
    doubled = conv(x.replace_feature(x.features * 2)).features
    torch.testing.assert_close(doubled, 2 * conv(x).features - conv.bias)


def test_replace_feature_keeps_sites_and_maps():
    x = random_tensor([5, 4, 3], 2, 20, 3)
    x.indice_dict["k"] = None
    y = x.replace_feature(x.features * 2)
    assert y.indices is x.indices and y.spatial_shape == x.spatial_shape and y.batch_size == 2
    assert y.indice_dict is x.indice_dict
    with pytest.raises(ValueError, match="replace_feature"):
        y.features = x.features
    with pytest.raises(ValueError, match="one row per index"):
        x.replace_feature(x.features[:3])


def test_tensor_arithmetic_and_helpers():
    x = random_tensor([5, 4, 3], 2, 20, 3)
    torch.testing.assert_close((x + x).features, 2 * x.features)
    torch.testing.assert_close((x + x.features).features, 2 * x.features)
    torch.testing.assert_close(x.minus().features, -x.features)
    assert x.spatial_size == 60 and x.find_indice_pair(None) is None and x.find_indice_pair("no") is None
    assert x.sparity == x.indices.shape[0] / 60 / 2
    sel = x.select_by_index(torch.arange(5))
    assert sel.indices.shape[0] == 5 and sel.indice_dict == {}
    assert "SparseConvTensor" in repr(x)


def test_spatial_shape_accepts_numpy_and_tensors():
    import numpy as np

    feats, idx = (
        torch.randn(3, 2),
        torch.tensor([[0, 1, 2, 3]] * 3, dtype=torch.int32) + torch.arange(3)[:, None].int(),
    )
    idx[:, 0] = 0
    a = spconv.SparseConvTensor(feats, idx, np.array([8, 8, 8]), 1)
    b = spconv.SparseConvTensor(feats, idx, torch.tensor([8, 8, 8]), torch.tensor(1))
    assert a.spatial_shape == b.spatial_shape == [8, 8, 8] and b.batch_size == 1


# ---------------------------------------------------------------------------- indice_key
def test_subm_layers_share_a_map_by_indice_key():
    x = random_tensor([7, 6, 5], 2, 40, 3)
    a = spconv.SubMConv3d(3, 4, 3, indice_key="subm1")
    b = spconv.SubMConv3d(4, 4, 3, indice_key="subm1")
    y = a(x)
    data = y.find_indice_pair("subm1")
    assert data.is_subm and data.ksize == [3, 3, 3] and torch.equal(data.indices, x.indices)
    z = b(y)
    assert z.indices is x.indices and z.find_indice_pair("subm1") is data
    assert "subm1" not in x.indice_dict  # layers copy the dict: their input is unchanged


def test_indice_key_mismatches_raise():
    x = random_tensor([7, 6, 5], 2, 40, 3)
    y = spconv.SubMConv3d(3, 4, 3, indice_key="k")(x)
    with pytest.raises(ValueError, match="same kernel_size"):
        spconv.SubMConv3d(4, 4, 5, indice_key="k")(y)
    with pytest.raises(ValueError, match="already names a map"):
        spconv.SparseConv3d(4, 4, 3, 2, 1, indice_key="k")(y)
    down = spconv.SparseConv3d(4, 4, 3, 2, 1, indice_key="d")(y)
    with pytest.raises(ValueError, match="strided map"):
        spconv.SubMConv3d(4, 4, 3, indice_key="d")(down)
    with pytest.raises(ValueError, match="kernel_size of the layer it inverts"):
        spconv.SparseInverseConv3d(4, 4, 2, indice_key="d")(down)
    with pytest.raises(ValueError, match="does not hold"):
        spconv.SparseInverseConv3d(4, 4, 3, indice_key="missing")(down)
    with pytest.raises(ValueError, match="submanifold map"):
        spconv.SparseInverseConv3d(4, 4, 3, indice_key="k")(down)
    elsewhere = spconv.SparseConvTensor(
        y.features, y.indices, y.spatial_shape, 2, indice_dict=down.indice_dict
    )
    with pytest.raises(ValueError, match="not on the output sites"):
        spconv.SparseInverseConv3d(4, 4, 3, indice_key="d")(elsewhere)


def test_strided_maps_are_cached_on_the_sites():
    x = random_tensor([7, 6, 5], 2, 40, 3)
    layer = spconv.SparseConv3d(3, 4, 3, 2, 1)
    first, second = layer(x), layer(x)
    assert second.indices is first.indices


# ---------------------------------------------------------------------------- pools
@pytest.mark.parametrize("ndim", [3, 2])
@pytest.mark.parametrize("k,s,p", [(2, None, 0), (3, 2, 1), (3, 1, 1)])
def test_max_pool_matches_dense_max_pool_over_occupied_sites(ndim, k, s, p):
    shape = [7, 6, 5][:ndim] if ndim == 3 else [9, 8]
    x = random_tensor(shape, 2, 40, 3, seed=4, dtype=torch.float64)
    pool = (spconv.SparseMaxPool3d if ndim == 3 else spconv.SparseMaxPool2d)(k, s, p)
    feats = x.features.detach().clone().requires_grad_(True)
    out = pool(x.replace_feature(feats))
    stride = k if s is None else s
    # Empty sites must never win the max: shift features positive, densify, pool, shift back.
    shift = 10.0
    dense = densify(x.features + shift, x.indices, x.spatial_shape, 2)
    maxpool = F.max_pool3d if ndim == 3 else F.max_pool2d
    ref = at_sites(maxpool(F.pad(dense, [p, p] * ndim), k, stride), out.indices) - shift
    torch.testing.assert_close(out.features, ref)
    occ = occupancy(x.indices, x.spatial_shape, 2)
    sup = maxpool(F.pad(occ, [p, p] * ndim), k, stride)
    assert site_set(out.indices) == site_set((sup[:, 0] > 0).nonzero().int())
    out.features.sum().backward()
    assert feats.grad.sum().item() == pytest.approx(out.features.numel())


def test_avg_pool_divides_by_occupied_inputs():
    x = random_tensor([6, 6, 6], 1, 60, 2, seed=9, dtype=torch.float64)
    out = spconv.SparseAvgPool3d(2, 2)(x)
    dense = densify(x.features, x.indices, x.spatial_shape, 1)
    occ = occupancy(x.indices, x.spatial_shape, 1)
    ref = at_sites(F.avg_pool3d(dense, 2), out.indices) / at_sites(F.avg_pool3d(occ, 2), out.indices)
    torch.testing.assert_close(out.features, ref)


def test_inverse_conv_after_a_pool_returns_to_its_sites():
    x = random_tensor([6, 6, 6], 2, 50, 3)
    pooled = spconv.SparseMaxPool3d(2, 2, indice_key="pool")(x)
    up = spconv.SparseInverseConv3d(3, 5, 2, indice_key="pool")(pooled)
    assert torch.equal(up.indices, x.indices) and up.features.shape == (x.indices.shape[0], 5)


def test_global_pools_per_sample():
    x = random_tensor([5, 4, 3], 3, 30, 4)
    b = x.indices[:, 0].long()
    mx, avg = spconv.SparseGlobalMaxPool()(x), spconv.SparseGlobalAvgPool()(x)
    for i in range(3):
        rows = x.features[b == i]
        torch.testing.assert_close(mx[i], rows.max(0).values)
        torch.testing.assert_close(avg[i], rows.mean(0))


# ---------------------------------------------------------------------------- containers and tables
def test_sparse_sequential_applies_dense_modules_to_features():
    x = random_tensor([5, 4, 3], 2, 20, 3)
    seq = spconv.SparseSequential(spconv.SubMConv3d(3, 4, 3), nn.BatchNorm1d(4), nn.ReLU())
    out = seq(x)
    assert (out.features >= 0).all() and len(seq) == 3 and isinstance(seq[-1], nn.ReLU)
    assert spconv.is_spconv_module(seq[0]) and not spconv.is_spconv_module(seq[1])
    seq.add(spconv.ToDense())
    assert seq(x).shape == (2, 4, 5, 4, 3)
    assert spconv.RemoveGrid()(x) is x and spconv.Identity()(x) is x


def test_tables_and_sparse_add():
    x = random_tensor([5, 4, 3], 2, 20, 3)
    y = x.replace_feature(x.features * 3)
    torch.testing.assert_close(spconv.AddTable()([x, y]).features, 4 * x.features)
    assert spconv.JoinTable()([x, y]).features.shape == (x.features.shape[0], 6)
    branches = spconv.ConcatTable().add(spconv.Identity()).add(spconv.SubMConv3d(3, 3, 3))
    outs = branches(x)
    assert len(outs) == 2 and outs[0] is x
    other = random_tensor([5, 4, 3], 2, 15, 3, seed=8)
    with pytest.raises(ValueError, match="same sites"):
        spconv.AddTable()([x, other])
    total = spconv.functional.sparse_add(x, other)
    torch.testing.assert_close(total.dense(), x.dense() + other.dense())
    keys = total.indices.long() @ torch.tensor([60, 12, 3, 1])
    assert bool((keys[1:] > keys[:-1]).all())  # sorted by (batch, d0, d1, d2)
    same = spconv.functional.sparse_add(x, x.select_by_index(torch.arange(4)))
    assert same.indices is x.indices  # union == the larger operand: its sites and maps are kept
    torch.testing.assert_close(same.dense(), x.dense() + x.select_by_index(torch.arange(4)).dense())


# ---------------------------------------------------------------------------- an OpenPCDet-like backbone
class TinyVoxelBackbone(nn.Module):
    """OpenPCDet's VoxelBackBone8x pattern at a tiny size: subm stem, strided stages, dense BEV head."""

    def __init__(self, c_in):
        super().__init__()
        norm = partial(nn.BatchNorm1d, eps=1e-3, momentum=0.01)

        def block(ci, co, k, key, stride=1, padding=0, kind="subm"):
            conv = (
                spconv.SubMConv3d(ci, co, k, bias=False, indice_key=key)
                if kind == "subm"
                else spconv.SparseConv3d(
                    ci, co, k, stride=stride, padding=padding, bias=False, indice_key=key
                )
            )
            return spconv.SparseSequential(conv, norm(co), nn.ReLU())

        self.conv_input = block(c_in, 8, 3, "subm1")
        self.conv1 = spconv.SparseSequential(block(8, 8, 3, "subm1"))
        self.conv2 = spconv.SparseSequential(
            block(8, 16, 3, "spconv2", 2, 1, "spconv"), block(16, 16, 3, "subm2")
        )
        self.conv3 = spconv.SparseSequential(
            block(16, 16, 3, "spconv3", 2, (0, 1, 1), "spconv"), block(16, 16, 3, "subm3")
        )
        self.conv_out = block(16, 16, (3, 1, 1), "spconv_down2", (2, 1, 1), 0, "spconv")
        self.up = spconv.SparseInverseConv3d(16, 8, 3, indice_key="spconv2", bias=False)
        self.head = nn.Conv2d(16 * 1, 2, 1)

    def forward(self, x):
        x = self.conv_input(x)
        x1 = self.conv1(x)
        x2 = self.conv2(x1)
        x3 = self.conv3(x2)
        out = self.conv_out(x3)
        dense = out.dense()
        n, c, d, h, w = dense.shape
        up = self.up(x2)
        assert torch.equal(up.indices, x1.indices)
        return self.head(dense.view(n, c * d, h, w)), up


def test_openpcdet_like_backbone_trains_end_to_end():
    torch.manual_seed(0)
    x = random_tensor([13, 16, 14], 2, 400, 4, seed=12)
    model = TinyVoxelBackbone(4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bev, up = model(x)
    assert bev.shape[:2] == (2, 2) and up.features.shape[1] == 8
    loss = bev.square().mean() + up.features.square().mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    opt.step()
    with torch.no_grad():
        model.eval()
        bev2, _ = model(x)
    assert torch.isfinite(bev2).all()


def test_inverse_of_a_transposed_conv_returns_to_its_input_sites():
    x = random_tensor([5, 4, 3], 2, 20, 3)
    up = spconv.SparseConvTranspose3d(3, 4, 3, 2, 1, indice_key="up")(x)
    back = spconv.SparseInverseConv3d(4, 3, 3, indice_key="up")(up)
    assert torch.equal(back.indices, x.indices) and back.spatial_shape == x.spatial_shape


def test_record_voxel_count_keeps_the_largest_output():
    x = random_tensor([7, 6, 5], 2, 40, 3)
    layer = spconv.SparseConv3d(3, 4, 3, 2, 1, record_voxel_count=True)
    out = layer(x)
    assert int(layer.get_max_num_voxels()) == out.indices.shape[0]
    assert "max_num_voxels_during_training" in layer.state_dict()
    layer(x.select_by_index(torch.arange(3)))
    assert int(layer.get_max_num_voxels()) == out.indices.shape[0]


def test_2d_avg_pool_and_subm_pool():
    x = random_tensor([9, 8], 1, 30, 2, seed=6, dtype=torch.float64)
    avg = spconv.SparseAvgPool2d(2, 2)(x)
    dense = densify(x.features, x.indices, x.spatial_shape, 1)
    occ = occupancy(x.indices, x.spatial_shape, 1)
    ref = at_sites(F.avg_pool2d(dense, 2), avg.indices) / at_sites(F.avg_pool2d(occ, 2), avg.indices)
    torch.testing.assert_close(avg.features, ref)
    subm = spconv.SparseMaxPool2d(3, 1, subm=True)(x)
    assert subm.indices is x.indices
    shifted = densify(x.features + 10, x.indices, x.spatial_shape, 1)
    ref = at_sites(F.max_pool2d(shifted, 3, 1, 1), x.indices) - 10
    torch.testing.assert_close(subm.features, ref)
