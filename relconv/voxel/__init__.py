"""Voxel sparse convolution on the relconv core: VoxelTensor, voxelize, kernel maps, layers, models.

See docs/voxel.md for the conventions (coordinate layout, kernel-offset order, weight layouts,
negative coordinates, map caching and `indice_key`).
"""

from relconv.voxel.conv import Conv3d, PreparedCalls, conv3d
from relconv.voxel.fuse import fold_batchnorm, fuse_conv_bn
from relconv.voxel.kernel_map import (
    MapCache,
    generative_map,
    kernel_offsets,
    strided_map,
    strided_output_coords,
    submanifold_map,
    transposed_map,
)
from relconv.voxel.nn import BatchNorm, Dropout, LeakyReLU, ReLU, Sequential, inference_folding
from relconv.voxel.pool import (
    AvgPool3d,
    GlobalAvgPool,
    GlobalMaxPool,
    MaxPool3d,
    PoolTranspose3d,
    SumPool3d,
    global_pool,
    pool3d,
    pool_transpose3d,
)
from relconv.voxel.sites import Prune, Union, prune, union
from relconv.voxel.sync_nn import SyncBatchNorm, convert_sync_batchnorm
from relconv.voxel.tensor import VoxelTensor, cat
from relconv.voxel.voxelize import Voxelized, collate, devoxelize, voxelize

__all__ = [
    "AvgPool3d",
    "BatchNorm",
    "Conv3d",
    "Dropout",
    "GlobalAvgPool",
    "GlobalMaxPool",
    "LeakyReLU",
    "MapCache",
    "MaxPool3d",
    "PoolTranspose3d",
    "PreparedCalls",
    "Prune",
    "ReLU",
    "Sequential",
    "SumPool3d",
    "SyncBatchNorm",
    "Union",
    "VoxelTensor",
    "Voxelized",
    "cat",
    "collate",
    "conv3d",
    "convert_sync_batchnorm",
    "devoxelize",
    "fold_batchnorm",
    "fuse_conv_bn",
    "generative_map",
    "global_pool",
    "inference_folding",
    "kernel_offsets",
    "pool3d",
    "pool_transpose3d",
    "prune",
    "strided_map",
    "strided_output_coords",
    "submanifold_map",
    "transposed_map",
    "union",
    "voxelize",
]
