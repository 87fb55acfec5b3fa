"""Feature-wise layers that carry the VoxelTensor: norm, activations, dropout, Sequential."""

from __future__ import annotations

from torch import nn

from relconv.voxel.tensor import VoxelTensor


class _FeatureWise(nn.Module):
    """Applies a torch module to `x.feats` and keeps coordinates, stride and map cache."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        if not isinstance(x, VoxelTensor):
            raise TypeError(f"x must be a VoxelTensor, got {type(x).__name__}")
        return x.replace_feature(self.module(x.feats))


class BatchNorm(_FeatureWise):
    """`torch.nn.BatchNorm1d` over voxels (statistics over all voxels of the batch)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__(nn.BatchNorm1d(num_features, eps=eps, momentum=momentum))


class ReLU(_FeatureWise):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__(nn.ReLU(inplace=inplace))


class LeakyReLU(_FeatureWise):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__(nn.LeakyReLU(negative_slope, inplace=inplace))


class Dropout(_FeatureWise):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__(nn.Dropout(p))


class Sequential(nn.Sequential):
    """`torch.nn.Sequential` whose input and output are VoxelTensors."""

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        if not isinstance(x, VoxelTensor):
            raise TypeError(f"x must be a VoxelTensor, got {type(x).__name__}")
        return super().forward(x)
