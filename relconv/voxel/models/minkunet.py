"""MinkUNet: the sparse U-Net used for SemanticKITTI segmentation in the TorchSparse papers.

Stem of two 3^3 convs, four encoder stages (2^3 stride-2 conv + two residual blocks), four decoder
stages (2^3 stride-2 transposed conv back onto the encoder's coordinates, concatenation with the skip
tensor, two residual blocks) and a per-voxel linear classifier. Channel plan
[32, 32, 64, 128, 256, 256, 128, 96, 96] times the width multiplier.
"""

from __future__ import annotations

from torch import Tensor, nn

from relconv.voxel.models.blocks import ResidualBlock, conv_bn_relu
from relconv.voxel.nn import Sequential
from relconv.voxel.tensor import VoxelTensor, cat

BASE_CHANNELS = (32, 32, 64, 128, 256, 256, 128, 96, 96)


class MinkUNet(nn.Module):
    """Sparse U-Net segmentation network.

    Args:
        in_channels: input feature channels (e.g. 4 for x, y, z, intensity).
        num_classes: output classes per voxel (19 for SemanticKITTI).
        width: channel multiplier (TorchSparse evaluates 0.5 and 1.0).
    Forward: VoxelTensor [N, in_channels] at tensor stride 1 -> logits [N, num_classes], same rows.
    """

    def __init__(self, in_channels: int = 4, num_classes: int = 19, width: float = 1.0) -> None:
        super().__init__()
        if width <= 0:
            raise ValueError(f"width must be positive, got {width}")
        cs = [max(1, int(round(c * width))) for c in BASE_CHANNELS]
        self.stem = Sequential(conv_bn_relu(in_channels, cs[0]), conv_bn_relu(cs[0], cs[0]))
        self.down = nn.ModuleList()
        for i in range(4):
            self.down.append(
                Sequential(
                    conv_bn_relu(cs[i], cs[i], kernel_size=2, stride=2),
                    ResidualBlock(cs[i], cs[i + 1]),
                    ResidualBlock(cs[i + 1], cs[i + 1]),
                )
            )
        self.up = nn.ModuleList()
        self.fuse = nn.ModuleList()
        for i in range(4):
            cin, cout, skip = cs[4 + i], cs[5 + i], cs[3 - i]
            self.up.append(conv_bn_relu(cin, cout, kernel_size=2, stride=2, transposed=True))
            self.fuse.append(Sequential(ResidualBlock(cout + skip, cout), ResidualBlock(cout, cout)))
        self.classifier = nn.Linear(cs[8], num_classes)

    def forward(self, x: VoxelTensor) -> Tensor:
        skips = [self.stem(x)]
        for stage in self.down:
            skips.append(stage(skips[-1]))
        y = skips.pop()
        for up, fuse in zip(self.up, self.fuse, strict=True):
            y = up(y)
            y = fuse(cat([y, skips.pop()]))
        return self.classifier(y.feats)
