"""TorchSparse's sparse ResNet backbones (same module tree and parameter names)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from relconv.torchsparse.backbones.modules import SparseConvBlock, SparseResBlock
from relconv.torchsparse.tensor import SparseTensor

__all__ = ["SparseResNet", "SparseResNet21D"]


class SparseResNet(nn.ModuleList):
    """Stages of (num_blocks, out_channels, kernel_size, stride): a strided `SparseConvBlock`
    then residual blocks. Forward returns every stage's output."""

    def __init__(
        self, blocks: Sequence[tuple], *, in_channels: int = 4, width_multiplier: float = 1.0
    ) -> None:
        super().__init__()
        self.blocks = blocks
        self.in_channels = in_channels
        self.width_multiplier = width_multiplier
        channels = in_channels
        for num_blocks, out_channels, kernel_size, stride in blocks:
            out_channels = int(out_channels * width_multiplier)
            stage = []
            for index in range(num_blocks):
                if index == 0:
                    stage.append(SparseConvBlock(channels, out_channels, kernel_size, stride=stride))
                else:
                    stage.append(SparseResBlock(channels, out_channels, kernel_size))
                channels = out_channels
            self.append(nn.Sequential(*stage))

    def forward(self, x: SparseTensor) -> list[SparseTensor]:
        outputs = []
        for stage in self:
            x = stage(x)
            outputs.append(x)
        return outputs


class SparseResNet21D(SparseResNet):
    """Stages 16 (3^3), 32, 64, 128 (3^3 stride 2), then 128 with a (1, 3, 1) kernel, stride (1, 2, 1)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(
            blocks=[
                (3, 16, 3, 1),
                (3, 32, 3, 2),
                (3, 64, 3, 2),
                (3, 128, 3, 2),
                (1, 128, (1, 3, 1), (1, 2, 1)),
            ],
            **kwargs,
        )
