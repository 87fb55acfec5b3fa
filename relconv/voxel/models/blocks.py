"""Conv-norm-activation and residual blocks shared by the voxel models."""

from __future__ import annotations

from torch import nn

from relconv.voxel.conv import Conv3d
from relconv.voxel.nn import BatchNorm, ReLU, Sequential
from relconv.voxel.tensor import VoxelTensor


def conv_bn_relu(
    cin: int, cout: int, kernel_size: int = 3, stride: int = 1, transposed: bool = False
) -> Sequential:
    """Conv3d -> BatchNorm -> ReLU."""
    return Sequential(
        Conv3d(cin, cout, kernel_size, stride=stride, transposed=transposed), BatchNorm(cout), ReLU(True)
    )


class ResidualBlock(nn.Module):
    """Two 3^3 submanifold convs with a (1x1x1 projected when channels change) identity shortcut."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.main = Sequential(
            Conv3d(cin, cout, kernel_size),
            BatchNorm(cout),
            ReLU(True),
            Conv3d(cout, cout, kernel_size),
            BatchNorm(cout),
        )
        self.shortcut = Sequential(Conv3d(cin, cout, 1), BatchNorm(cout)) if cin != cout else Sequential()
        self.relu = ReLU(True)

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        return self.relu(self.main(x) + self.shortcut(x))
