"""Global pooling per sample: `[B, C]` from a SparseTensor (TorchSparse's `global_*_pool`)."""

from __future__ import annotations

from torch import Tensor

from relconv.torchsparse.tensor import SparseTensor
from relconv.voxel import global_pool

__all__ = ["global_avg_pool", "global_max_pool"]


def _check(inputs: object) -> None:
    if not isinstance(inputs, SparseTensor):
        raise TypeError(f"inputs must be a SparseTensor, got {type(inputs).__name__}")


def global_avg_pool(inputs: SparseTensor) -> Tensor:
    """[B, C] mean over each sample's voxels, B = 1 + the largest batch index (one host sync)."""
    _check(inputs)
    return global_pool(inputs._voxel(), "mean")


def global_max_pool(inputs: SparseTensor) -> Tensor:
    """[B, C] max over each sample's voxels, B = 1 + the largest batch index (one host sync)."""
    _check(inputs)
    return global_pool(inputs._voxel(), "amax")
