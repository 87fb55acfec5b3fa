"""TorchSparse 2.1's `torchsparse.nn.functional` on relconv."""

from relconv.torchsparse._missing import missing
from relconv.torchsparse.nn.functional.activation import leaky_relu, relu, silu
from relconv.torchsparse.nn.functional.conv import conv3d
from relconv.torchsparse.nn.functional.crop import spcrop
from relconv.torchsparse.nn.functional.pooling import global_avg_pool, global_max_pool

__all__ = ["conv3d", "global_avg_pool", "global_max_pool", "leaky_relu", "relu", "silu", "spcrop"]


def __getattr__(name: str):
    raise missing("torchsparse.nn.functional", name)
