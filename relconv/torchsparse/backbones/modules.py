"""The blocks of TorchSparse's backbones (same module tree and parameter names)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from relconv.torchsparse import nn as spnn
from relconv.torchsparse.tensor import SparseTensor

__all__ = ["SparseConvBlock", "SparseConvTransposeBlock", "SparseResBlock"]

Size = int | Sequence[int]


class SparseConvBlock(nn.Sequential):
    """conv -> BatchNorm -> ReLU (children 0, 1, 2)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1, dilation: int = 1
    ):
        super().__init__(
            spnn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, dilation=dilation),
            spnn.BatchNorm(out_channels),
            spnn.ReLU(True),
        )


class SparseConvTransposeBlock(nn.Sequential):
    """transposed conv -> BatchNorm -> ReLU (children 0, 1, 2)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1, dilation: int = 1
    ):
        super().__init__(
            spnn.Conv3d(
                in_channels, out_channels, kernel_size, stride=stride, dilation=dilation, transposed=True
            ),
            spnn.BatchNorm(out_channels),
            spnn.ReLU(True),
        )


class SparseResBlock(nn.Module):
    """relu(main(x) + shortcut(x)); main = conv, BN, ReLU, conv, BN; the shortcut is a 1x1x1 conv
    and BN when channels or stride change, else the identity."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1, dilation: int = 1
    ):
        super().__init__()
        self.main = nn.Sequential(
            spnn.Conv3d(in_channels, out_channels, kernel_size, dilation=dilation, stride=stride),
            spnn.BatchNorm(out_channels),
            spnn.ReLU(True),
            spnn.Conv3d(out_channels, out_channels, kernel_size, dilation=dilation),
            spnn.BatchNorm(out_channels),
        )
        strided = (math.prod(stride) if not isinstance(stride, int) else stride) != 1
        if in_channels != out_channels or strided:
            self.shortcut = nn.Sequential(
                spnn.Conv3d(in_channels, out_channels, 1, stride=stride),
                spnn.BatchNorm(out_channels),
            )
        else:
            self.shortcut = nn.Identity()
        self.relu = spnn.ReLU(True)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return self.relu(self.main(x) + self.shortcut(x))
