"""TorchSparse 2.1's `torchsparse.nn` on relconv (`import relconv.torchsparse.nn as spnn`)."""

from relconv.torchsparse._missing import missing
from relconv.torchsparse.nn import functional, utils
from relconv.torchsparse.nn.bev import ToBEVHeightCompression, ToDenseBEVConvolution
from relconv.torchsparse.nn.functional.conv import Conv3d
from relconv.torchsparse.nn.modules import (
    BatchNorm,
    GlobalAvgPool,
    GlobalMaxPool,
    GroupNorm,
    InstanceNorm,
    LeakyReLU,
    ReLU,
    SiLU,
    SparseCrop,
)

__all__ = [
    "BatchNorm",
    "Conv3d",
    "GlobalAvgPool",
    "GlobalMaxPool",
    "GroupNorm",
    "InstanceNorm",
    "LeakyReLU",
    "ReLU",
    "SiLU",
    "SparseCrop",
    "ToBEVHeightCompression",
    "ToDenseBEVConvolution",
    "functional",
    "utils",
]


def __getattr__(name: str):
    raise missing("torchsparse.nn", name)
