"""sparse_quantize, sparse_collate(_fn), to_dense and the tensor-cache switches against plain
numpy / torch reimplementations of TorchSparse 2.1's documented behaviour."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relconv.torchsparse import SparseTensor
from relconv.torchsparse.utils import make_divisible, make_ntuple, to_dense
from relconv.torchsparse.utils.collate import sparse_collate, sparse_collate_fn
from relconv.torchsparse.utils.quantize import ravel_hash, sparse_quantize
from relconv.torchsparse.utils.tensor_cache import TensorCacheMode, set_tensor_cache_mode


def _reference_quantize(points, voxel_size):
    """Voxels floor(p / size) in lexicographic (x, y, z) order, first point of each, point -> voxel."""
    voxels = np.floor(points / np.asarray(voxel_size)).astype(np.int32)
    order = np.lexsort(voxels.T[::-1])  # stable: first point of a voxel comes first
    first, seen = [], {}
    for i in order:
        key = tuple(voxels[i])
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
    inverse = np.array([seen[tuple(v)] for v in voxels])
    return voxels[first], np.array(first), inverse


@pytest.mark.parametrize("voxel_size", [0.5, 1, (0.2, 0.5, 1.0)])
def test_sparse_quantize_matches_reference(voxel_size):
    rng = np.random.default_rng(0)
    points = rng.uniform(-3, 3, size=(300, 3))
    coords, index, inverse = sparse_quantize(points, voxel_size, return_index=True, return_inverse=True)
    size = voxel_size if isinstance(voxel_size, tuple) else (voxel_size,) * 3
    want_coords, want_index, want_inverse = _reference_quantize(points, size)
    assert coords.dtype == np.int32
    np.testing.assert_array_equal(coords, want_coords)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_array_equal(inverse, want_inverse)
    np.testing.assert_array_equal(coords[inverse], np.floor(points / np.asarray(size)).astype(np.int32))
    only = sparse_quantize(points, voxel_size)
    np.testing.assert_array_equal(only, want_coords)
    coords2, inverse2 = sparse_quantize(points, voxel_size, return_inverse=True)
    np.testing.assert_array_equal(inverse2, want_inverse)


def test_sparse_quantize_bad_arguments():
    with pytest.raises(ValueError, match="voxel_size"):
        sparse_quantize(np.zeros((3, 3)), (1, 2))
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        sparse_quantize(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="2-D"):
        ravel_hash(np.zeros(3))


def test_sparse_collate_prepends_the_batch_column():
    a = SparseTensor(np.ones((2, 2), dtype=np.float32), np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32))
    b = SparseTensor(torch.zeros(1, 2), torch.tensor([[7, 8, 9]], dtype=torch.int32))
    out = sparse_collate([a, b])
    assert out.coords.tolist() == [[0, 1, 2, 3], [0, 4, 5, 6], [1, 7, 8, 9]]
    assert out.coords.dtype == torch.int32 and out.feats.shape == (3, 2) and out.stride == (1, 1, 1)
    with pytest.raises(ValueError, match="stride"):
        sparse_collate([a, SparseTensor(torch.zeros(1, 2), torch.zeros(1, 3, dtype=torch.int32), stride=2)])
    with pytest.raises(ValueError, match="non-empty"):
        sparse_collate([])


def test_sparse_collate_fn_collates_dicts_key_by_key():
    samples = [
        {
            "input": SparseTensor(torch.ones(2, 1), torch.zeros(2, 3, dtype=torch.int32) + i),
            "array": np.full(3, i),
            "tensor": torch.full((2,), i),
            "name": f"s{i}",
            "nested": {"label": torch.tensor([i])},
        }
        for i in range(2)
    ]
    out = sparse_collate_fn(samples)
    assert out["input"].coords[:, 0].tolist() == [0, 0, 1, 1]
    assert torch.equal(out["array"], torch.tensor([[0, 0, 0], [1, 1, 1]]))
    assert torch.equal(out["tensor"], torch.tensor([[0, 0], [1, 1]]))
    assert out["name"] == ["s0", "s1"]
    assert torch.equal(out["nested"]["label"], torch.tensor([[0], [1]]))
    plain = [1, 2]
    assert sparse_collate_fn(plain) is plain


def test_to_dense_and_helpers():
    feats = torch.arange(6.0).reshape(3, 2)
    coords = torch.tensor([[0, 0, 1, 2], [1, 2, 0, 0], [0, 1, 1, 1]], dtype=torch.int32)
    dense = to_dense(feats, coords, (2, 3, 3, 3))
    assert dense.shape == (2, 3, 3, 3, 2)
    assert dense[1, 2, 0, 0].tolist() == [2.0, 3.0] and float(dense.sum()) == float(feats.sum())
    with pytest.raises(ValueError, match="spatial_range"):
        to_dense(feats, coords, (3, 3, 3))
    assert make_ntuple(2, 3) == (2, 2, 2) and make_ntuple([1, 2, 3], 3) == (1, 2, 3)
    assert make_divisible(5, 4) == 8
    with pytest.raises(TypeError, match="3 ints"):
        make_ntuple((1, 2), 3)


def test_only_the_per_tensor_cache_mode_is_provided():
    set_tensor_cache_mode(TensorCacheMode.SEPARATE_TENSOR_CACHE)
    with pytest.raises(NotImplementedError, match="GLOBAL_TENSOR_CACHE"):
        set_tensor_cache_mode(TensorCacheMode.GLOBAL_TENSOR_CACHE)
    with pytest.raises(TypeError, match="TensorCacheMode"):
        set_tensor_cache_mode(1)
