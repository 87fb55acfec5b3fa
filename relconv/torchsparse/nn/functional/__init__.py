"""TorchSparse 2.1's `torchsparse.nn.functional` on relconv."""

from relconv.torchsparse._missing import missing
from relconv.torchsparse.nn.functional.activation import leaky_relu, relu, silu
from relconv.torchsparse.nn.functional.conv import conv3d
from relconv.torchsparse.nn.functional.conv_config import (
    ConvMode,
    Dataflow,
    clear_global_conv_config,
    get_conv_mode,
    get_default_conv_config,
    get_downsample_mode,
    get_global_conv_config,
    get_kmap_mode,
    set_conv_mode,
    set_downsample_mode,
    set_global_conv_config,
    set_kmap_mode,
)
from relconv.torchsparse.nn.functional.crop import spcrop
from relconv.torchsparse.nn.functional.point import (
    calc_ti_weights,
    spcount,
    spdevoxelize,
    sphash,
    sphashquery,
    spvoxelize,
)
from relconv.torchsparse.nn.functional.pooling import global_avg_pool, global_max_pool

__all__ = [
    "ConvMode",
    "Dataflow",
    "calc_ti_weights",
    "clear_global_conv_config",
    "conv3d",
    "get_conv_mode",
    "get_default_conv_config",
    "get_downsample_mode",
    "get_global_conv_config",
    "get_kmap_mode",
    "global_avg_pool",
    "global_max_pool",
    "leaky_relu",
    "relu",
    "set_conv_mode",
    "set_downsample_mode",
    "set_global_conv_config",
    "set_kmap_mode",
    "silu",
    "spcount",
    "spcrop",
    "spdevoxelize",
    "sphash",
    "sphashquery",
    "spvoxelize",
]


def __getattr__(name: str):
    raise missing("torchsparse.nn.functional", name)
