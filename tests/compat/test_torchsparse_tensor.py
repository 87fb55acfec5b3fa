"""relconv.torchsparse.SparseTensor, cat and generative_add against TorchSparse 2.1's documented
behaviour and plain torch/numpy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relconv.torchsparse as torchsparse
import relconv.torchsparse.nn as spnn
from relconv.torchsparse import SparseTensor
from tests.compat.torchsparse_refs import scene


def test_attributes_and_aliases():
    feats, coords = (
        torch.randn(3, 2),
        torch.tensor([[0, 1, 2, 3], [0, 0, 0, 0], [1, 4, 4, 4]], dtype=torch.int32),
    )
    x = SparseTensor(feats, coords, stride=2, spatial_range=[2, 8, 8, 8])
    assert x.F is feats and x.feats is feats and x.C is coords and x.coords is coords
    assert x.s == (2, 2, 2) and x.stride == (2, 2, 2) and x.spatial_range == (2, 8, 8, 8)
    x.s = (1, 2, 1)
    assert x.stride == (1, 2, 1)
    new = torch.zeros(3, 2)
    x.F = new
    assert x.feats is new
    assert isinstance(x._caches.cmaps, dict) and isinstance(x._caches.kmaps, dict)
    assert isinstance(x._caches.hashmaps, dict)
    assert "SparseTensor" in repr(x)


def test_dense_is_channels_last_over_the_spatial_range():
    x = scene(grid=5)
    x.spatial_range = (2, 5, 5, 5)
    dense = x.dense()
    assert dense.shape == (2, 5, 5, 5, 3)
    c = x.coords.long()
    torch.testing.assert_close(dense[c[:, 0], c[:, 1], c[:, 2], c[:, 3]], x.feats)
    assert int((dense.abs().sum(-1) > 0).sum()) == len(c)
    with pytest.raises(ValueError, match="spatial_range"):
        scene().dense()
    x.spatial_range = (2, 3, 3, 3)
    with pytest.raises(ValueError, match="outside"):
        x.dense()


def test_add_keeps_sites_and_cache():
    x = scene()
    y = spnn.ReLU()(x)
    z = x + y
    torch.testing.assert_close(z.feats, x.feats + torch.relu(x.feats))
    assert z.coords is x.coords and z._caches is x._caches and z.stride == x.stride
    with pytest.raises(ValueError, match="equal shape"):
        x + SparseTensor(torch.zeros(1, 3), torch.zeros(1, 4, dtype=torch.int32))


def test_moves_are_in_place_and_return_self():
    x = scene()
    assert x.cpu() is x and x.to("cpu") is x and x.detach() is x
    assert x.half() is x and x.feats.dtype == torch.float16


def test_strided_output_coordinates_are_in_its_own_grid_units():
    x = scene()
    out = spnn.Conv3d(3, 2, 2, stride=2).double()(x)
    base = out._voxel()  # relconv's coordinates: TorchSparse's times the stride
    torch.testing.assert_close(base.coords[:, 1:], out.coords[:, 1:] * 2)
    # a tensor derived without known coordinates computes them from relconv's on first read
    lazy = SparseTensor._from_voxel(base, None, None, out._caches)
    assert torch.equal(lazy.coords, out.coords)


def test_a_user_tensor_sharing_the_cache_reuses_the_maps():
    x = scene()
    a = spnn.Conv3d(3, 3, 3).double()(x)
    y = SparseTensor(a.feats * 2, a.coords, a.stride)
    y._caches = a._caches
    assert y._voxel().cache is a._voxel().cache
    copied = SparseTensor(a.feats, a.coords.clone(), a.stride)
    copied._caches = a._caches
    assert copied._voxel().cache is a._voxel().cache and copied._caches is a._caches
    # other coordinates than the cache holds at that stride get their own cache
    z = SparseTensor(a.feats[:5].clone(), a.coords[:5].clone())
    z._caches = a._caches
    z._voxel()
    assert z._caches is not a._caches


def test_cat_concatenates_channels_on_the_first_tensors_sites():
    x = scene()
    y = spnn.ReLU()(x)
    out = torchsparse.cat([x, y])
    torch.testing.assert_close(out.feats, torch.cat([x.feats, y.feats], 1))
    assert out.coords is x.coords and out._caches is x._caches
    with pytest.raises(ValueError, match="non-empty"):
        torchsparse.cat([])
    with pytest.raises(ValueError, match="same sites"):
        torchsparse.cat([x, SparseTensor(torch.zeros(1, 3), torch.zeros(1, 4, dtype=torch.int32))])
    with pytest.raises(TypeError, match="inputs\\[1\\]"):
        torchsparse.cat([x, x.feats])


def test_generative_add_sums_over_the_union():
    a = scene(n=20, seed=1)
    b = scene(n=12, seed=2)
    out = torchsparse.generative_add(a, b)
    ref: dict = {}
    for t in (a, b):
        for c, f in zip(t.coords.tolist(), t.feats, strict=True):
            ref[tuple(c)] = ref.get(tuple(c), 0) + f
    keys = sorted(ref)
    assert out.coords.tolist() == [list(k) for k in keys]
    torch.testing.assert_close(out.feats, torch.stack([ref[k] for k in keys]))
    with pytest.raises(TypeError, match="b must be"):
        torchsparse.generative_add(a, np.zeros(3))


def test_bad_construction_arguments():
    with pytest.raises(TypeError, match="stride"):
        SparseTensor(torch.zeros(1, 1), torch.zeros(1, 4, dtype=torch.int32), stride=(1, 2))
    with pytest.raises(TypeError, match="spatial_range"):
        SparseTensor(torch.zeros(1, 1), torch.zeros(1, 4, dtype=torch.int32), spatial_range=(1, -2, 3, 4))


def test_point_tensor_fields():
    p = torchsparse.PointTensor(torch.ones(4, 2), torch.zeros(4, 4))
    q = p + p
    torch.testing.assert_close(q.F, 2 * torch.ones(4, 2))
    assert q.C is p.C and p.idx_query == {} and set(p.additional_features) == {"idx_query", "counts"}
