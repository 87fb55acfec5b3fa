"""MinkUNet as TorchSparse's model zoo defines it (mit-han-lab/spvnas, `core/models/semantic_kitti/
minkunet.py`, the network of the TorchSparse papers): the same module tree and parameter names, so
its SemanticKITTI checkpoints load.

Stem of two 3^3 conv-BN-ReLU, `stage1`..`stage4` (2^3 stride-2 block + two residual blocks),
`up1`..`up4` (ModuleList [2^3 transposed block, Sequential of two residual blocks] over the
upsampled features concatenated with the skip), `classifier` (Sequential(Linear)) on the last
decoder's features. `point_transforms` and `dropout` exist for SPVCNN-style subclasses and
checkpoints; this forward does not use them (as the original).
"""

from __future__ import annotations

from torch import Tensor, nn

from relconv.torchsparse import nn as spnn
from relconv.torchsparse.operators import cat
from relconv.torchsparse.tensor import SparseTensor

__all__ = ["BasicConvolutionBlock", "BasicDeconvolutionBlock", "MinkUNet", "ResidualBlock"]

CHANNELS = (32, 32, 64, 128, 256, 256, 128, 96, 96)


class BasicConvolutionBlock(nn.Module):
    """`net` = conv -> BatchNorm -> ReLU."""

    def __init__(self, inc: int, outc: int, ks: int = 3, stride: int = 1, dilation: int = 1) -> None:
        super().__init__()
        self.net = nn.Sequential(
            spnn.Conv3d(inc, outc, kernel_size=ks, dilation=dilation, stride=stride),
            spnn.BatchNorm(outc),
            spnn.ReLU(True),
        )

    def forward(self, x: SparseTensor) -> SparseTensor:
        return self.net(x)


class BasicDeconvolutionBlock(nn.Module):
    """`net` = transposed conv -> BatchNorm -> ReLU."""

    def __init__(self, inc: int, outc: int, ks: int = 3, stride: int = 1) -> None:
        super().__init__()
        self.net = nn.Sequential(
            spnn.Conv3d(inc, outc, kernel_size=ks, stride=stride, transposed=True),
            spnn.BatchNorm(outc),
            spnn.ReLU(True),
        )

    def forward(self, x: SparseTensor) -> SparseTensor:
        return self.net(x)


class ResidualBlock(nn.Module):
    """relu(net(x) + downsample(x)); `downsample` is an empty Sequential (identity) unless
    channels or stride change, then a 1x1x1 conv and BatchNorm."""

    def __init__(self, inc: int, outc: int, ks: int = 3, stride: int = 1, dilation: int = 1) -> None:
        super().__init__()
        self.net = nn.Sequential(
            spnn.Conv3d(inc, outc, kernel_size=ks, dilation=dilation, stride=stride),
            spnn.BatchNorm(outc),
            spnn.ReLU(True),
            spnn.Conv3d(outc, outc, kernel_size=ks, dilation=dilation, stride=1),
            spnn.BatchNorm(outc),
        )
        if inc == outc and stride == 1:
            self.downsample = nn.Sequential()
        else:
            self.downsample = nn.Sequential(
                spnn.Conv3d(inc, outc, kernel_size=1, dilation=1, stride=stride), spnn.BatchNorm(outc)
            )
        self.relu = spnn.ReLU(True)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return self.relu(self.net(x) + self.downsample(x))


class MinkUNet(nn.Module):
    """Keyword arguments as the original: `num_classes` (required), `cr` (channel ratio, default
    1.0), `run_up` (accepted). Input: 4 channels at tensor stride 1. Forward -> logits
    `[N, num_classes]` in the input's row order."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        if "num_classes" not in kwargs:
            raise TypeError("MinkUNet needs the keyword argument num_classes")
        cs = [int(kwargs.get("cr", 1.0) * c) for c in CHANNELS]
        self.run_up = kwargs.get("run_up", True)
        self.stem = nn.Sequential(
            spnn.Conv3d(4, cs[0], kernel_size=3, stride=1),
            spnn.BatchNorm(cs[0]),
            spnn.ReLU(True),
            spnn.Conv3d(cs[0], cs[0], kernel_size=3, stride=1),
            spnn.BatchNorm(cs[0]),
            spnn.ReLU(True),
        )
        for i in range(4):
            cin, cout = cs[i], cs[i + 1]
            stage = nn.Sequential(
                BasicConvolutionBlock(cin, cin, ks=2, stride=2),
                ResidualBlock(cin, cout, ks=3),
                ResidualBlock(cout, cout, ks=3),
            )
            self.add_module(f"stage{i + 1}", stage)
        for i in range(4):
            cin, cout, skip = cs[4 + i], cs[5 + i], cs[3 - i]
            up = nn.ModuleList(
                [
                    BasicDeconvolutionBlock(cin, cout, ks=2, stride=2),
                    nn.Sequential(ResidualBlock(cout + skip, cout, ks=3), ResidualBlock(cout, cout, ks=3)),
                ]
            )
            self.add_module(f"up{i + 1}", up)
        self.classifier = nn.Sequential(nn.Linear(cs[8], kwargs["num_classes"]))
        self.point_transforms = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU(True))
            for a, b in ((cs[0], cs[4]), (cs[4], cs[6]), (cs[6], cs[8]))
        )
        self.dropout = nn.Dropout(0.3, True)

    def forward(self, x: SparseTensor) -> Tensor:
        skips = [self.stem(x)]
        for i in range(1, 5):
            skips.append(self._modules[f"stage{i}"](skips[-1]))
        y = skips.pop()
        for i in range(1, 5):
            up = self._modules[f"up{i}"]
            y = up[1](cat([up[0](y), skips.pop()]))
        return self.classifier(y.F)
