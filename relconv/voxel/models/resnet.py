"""A sparse ResNet backbone: stem, stride-2 stages of residual blocks, optional pooled classifier."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from relconv.voxel.models.blocks import ResidualBlock, conv_bn_relu
from relconv.voxel.nn import Sequential
from relconv.voxel.pool import global_pool
from relconv.voxel.tensor import VoxelTensor


class ResNet(nn.Module):
    """Sparse ResNet (ResNet-18-like with `layers=(2, 2, 2, 2)`).

    Args:
        in_channels: input feature channels.
        channels: output channels of the stem and each stage; stage i downsamples by 2 first.
        layers: residual blocks per stage.
        num_classes: when set, a global average pool and a linear head give `[B, num_classes]`.
    Forward: VoxelTensor -> the last stage's VoxelTensor (tensor stride 2^stages), or logits [B, classes].
    """

    def __init__(
        self,
        in_channels: int = 4,
        channels: Sequence[int] = (32, 64, 128, 256),
        layers: Sequence[int] = (2, 2, 2, 2),
        num_classes: int | None = None,
    ) -> None:
        super().__init__()
        if len(channels) != len(layers) or not channels:
            raise ValueError(
                f"channels {tuple(channels)} and layers {tuple(layers)} need equal, non-zero length"
            )
        self.stem = conv_bn_relu(in_channels, channels[0])
        stages = []
        prev = channels[0]
        for c, n in zip(channels, layers, strict=True):
            blocks = [conv_bn_relu(prev, c, kernel_size=2, stride=2)]
            blocks += [ResidualBlock(c, c) for _ in range(n)]
            stages.append(Sequential(*blocks))
            prev = c
        self.stages = Sequential(*stages)
        self.head = nn.Linear(prev, num_classes) if num_classes is not None else None

    def forward(self, x: VoxelTensor) -> VoxelTensor | Tensor:
        y = self.stages(self.stem(x))
        if self.head is None:
            return y
        return self.head(global_pool(y, "mean"))
