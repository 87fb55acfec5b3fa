"""Bad input gets a clear error naming the argument."""

import pytest
import torch
from voxel_refs import random_voxels

from relconv.voxel import Conv3d, VoxelTensor, cat, conv3d, devoxelize, submanifold_map, voxelize


def test_non_integer_coords():
    with pytest.raises(TypeError, match="coords must be an integer"):
        VoxelTensor(torch.randn(3, 2), torch.zeros(3, 4))


def test_wrongly_shaped_coords():
    with pytest.raises(ValueError, match="coords must have shape \\[N, 4\\]"):
        VoxelTensor(torch.randn(3, 2), torch.zeros(3, 3, dtype=torch.int32))


def test_feature_coordinate_length_mismatch():
    with pytest.raises(ValueError, match="feats has 3 rows but coords has 2"):
        VoxelTensor(torch.randn(3, 2), torch.zeros(2, 4, dtype=torch.int32))


def test_feats_shape_and_dtype():
    with pytest.raises(ValueError, match="feats must have shape"):
        VoxelTensor(torch.randn(3), torch.zeros(3, 4, dtype=torch.int32))
    with pytest.raises(TypeError, match="feats must be a floating-point"):
        VoxelTensor(torch.ones(3, 1, dtype=torch.int64), torch.zeros(3, 4, dtype=torch.int32))


def test_int64_coords_out_of_int32_range():
    c = torch.zeros(2, 4, dtype=torch.int64)
    c[1, 1] = 2**40
    with pytest.raises(ValueError, match="coords values must fit int32"):
        VoxelTensor(torch.randn(2, 1), c)


def test_negative_batch_index():
    c = torch.tensor([[-1, 0, 0, 0]], dtype=torch.int32)
    x = VoxelTensor(torch.randn(1, 1), c)
    with pytest.raises(ValueError, match="batch indices"):
        conv3d(x, torch.randn(27, 1, 1), 3)


def test_negative_spatial_coords_are_shifted_safely():
    c = torch.tensor([[0, -5, -5, -5], [0, -4, -5, -5]], dtype=torch.int32)
    rmap = submanifold_map(c, (3, 3, 3), (1, 1, 1), (1, 1, 1))
    assert rmap.num_pairs == 4


def test_duplicate_coords():
    c = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1]], dtype=torch.int32)
    x = VoxelTensor(torch.randn(2, 1), c)
    with pytest.raises(ValueError, match="duplicate.*coalesce"):
        conv3d(x, torch.randn(27, 1, 1), 3)


def test_coordinates_too_large_to_pack():
    c = torch.tensor([[0, -(2**30), -(2**30), -(2**30)], [3, 2**30, 2**30, 2**30]], dtype=torch.int32)
    x = VoxelTensor(torch.randn(2, 1), c)
    with pytest.raises(ValueError, match="coords span too large"):
        conv3d(x, torch.randn(27, 1, 1), 3)


def test_kernel_reach_leaves_int32_range():
    c = torch.tensor([[0, 2**31 - 1, 0, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match="int32 coordinate range"):
        conv3d(VoxelTensor(torch.randn(1, 1), c), torch.randn(27, 1, 1), 3)


def test_mismatched_devices():
    x = random_voxels(10, 3, 1)
    with pytest.raises(ValueError, match="coords is on"):
        VoxelTensor(x.feats, x.coords.to("meta"))
    with pytest.raises(ValueError, match="weight is on"):
        conv3d(x, torch.randn(27, 1, 1, device="meta"), 3)
    with pytest.raises(ValueError, match="point_to_voxel is on"):
        devoxelize(x, torch.zeros(3, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match="batch is on"):
        voxelize(torch.randn(3, 3), 0.1, batch=torch.zeros(3, dtype=torch.int64, device="meta"))


def test_bad_conv_arguments():
    x = random_voxels(10, 3, 2)
    with pytest.raises(ValueError, match="kernel_size must lie in 1..7"):
        Conv3d(2, 2, 8)
    with pytest.raises(TypeError, match="stride must be"):
        Conv3d(2, 2, 3, stride=(1, 2))
    with pytest.raises(ValueError, match="groups"):
        Conv3d(2, 3, 3, groups=2)
    with pytest.raises(ValueError, match="weight has 8 offsets"):
        conv3d(x, torch.randn(8, 2, 2, dtype=torch.float64), 3)
    with pytest.raises(TypeError, match="x must be a VoxelTensor"):
        conv3d(x.feats, torch.randn(27, 2, 2), 3)
    with pytest.raises(ValueError, match="generative=True needs transposed"):
        Conv3d(2, 2, 3, generative=True)


def test_bad_voxelize_arguments():
    with pytest.raises(TypeError, match="points must be a floating-point"):
        voxelize(torch.zeros(3, 3, dtype=torch.int64), 0.1)
    with pytest.raises(ValueError, match="points must have shape"):
        voxelize(torch.zeros(3, 2), 0.1)
    with pytest.raises(ValueError, match="voxel_size"):
        voxelize(torch.zeros(3, 3), -1.0)
    with pytest.raises(ValueError, match="feats must have shape \\[3, C\\]"):
        voxelize(torch.zeros(3, 3), 0.1, feats=torch.zeros(2, 1))
    with pytest.raises(ValueError, match="reduce"):
        voxelize(torch.zeros(3, 3), 0.1, reduce="median")
    with pytest.raises(ValueError, match="NaN"):
        voxelize(torch.tensor([[float("nan"), 0.0, 0.0]]), 0.1)
    with pytest.raises(ValueError, match="int32 coordinate range"):
        voxelize(torch.tensor([[1e12, 0.0, 0.0]]), 0.1)


def test_cat_needs_voxel_tensors():
    x = random_voxels(10, 3, 1)
    with pytest.raises(TypeError, match="tensors\\[1\\]"):
        cat([x, x.feats])
