"""Kernel-map caching on the tensor and explicit sharing by indice_key."""

import pytest
import torch
from voxel_refs import random_voxels

from relconv.voxel import Conv3d, conv3d


def _w(k, cin, cout):
    return torch.randn(k, cin, cout, dtype=torch.float64)


def test_maps_are_cached_and_shared_by_derived_tensors():
    x = random_voxels(80, 6, 2)
    y = conv3d(x, _w(27, 2, 2), 3)
    assert len(x.cache.maps) == 1 and y.cache is x.cache
    conv3d(y, _w(27, 2, 2), 3)
    assert len(x.cache.maps) == 1  # same geometry, same coordinates: reused
    z = conv3d(y, _w(8, 2, 2), 2, stride=2)
    assert z.cache is x.cache and len(x.cache.maps) == 2
    up = conv3d(z, _w(8, 2, 2), 2, stride=2, transposed=True)
    assert up.coords is x.coords and len(x.cache.maps) == 2  # the strided map, transposed
    conv3d(z, _w(27, 2, 2), 3, dilation=2)
    assert len(x.cache.maps) == 3


def test_indice_key_shares_map_explicitly():
    x = random_voxels(80, 6, 2)
    down = Conv3d(2, 4, 3, stride=2, indice_key="d1").double()
    up = Conv3d(4, 2, 3, stride=2, transposed=True, indice_key="d1").double()
    y = down(x)
    z = up(y)
    assert z.coords is x.coords
    assert x.cache.named["d1"].transposed is not None
    with pytest.raises(ValueError, match="indice_key 'd1'"):
        up(x)


def test_transposed_without_known_coordinates_raises():
    x = random_voxels(20, 4, 2, stride=2)
    with pytest.raises(ValueError, match="generative=True"):
        conv3d(x, _w(8, 2, 2), 2, stride=2, transposed=True)
    y = conv3d(x, _w(8, 2, 2), 2, stride=2, transposed=True, generative=True)
    assert y.stride == (1, 1, 1) and y.cache is not x.cache
