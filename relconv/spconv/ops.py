"""The geometry helpers of `spconv.pytorch.ops` (output grid sizes); its kernels are not provided."""

from __future__ import annotations

from relconv.spconv._missing import missing
from relconv.spconv.algo import ConvAlgo
from relconv.voxel import grid_map

__all__ = ["ConvAlgo", "get_conv_output_size", "get_deconv_output_size"]


def get_conv_output_size(input_size, kernel_size, stride, padding, dilation) -> list[int]:
    """Output grid of a regular sparse conv (spconv's signature)."""
    return grid_map.conv_output_size(
        list(input_size), list(kernel_size), list(stride), list(padding), list(dilation)
    )


def get_deconv_output_size(input_size, kernel_size, stride, padding, dilation, output_padding) -> list[int]:
    """Output grid of a transposed sparse conv (spconv's signature; dilation does not enter it)."""
    return grid_map.deconv_output_size(
        list(input_size), list(kernel_size), list(stride), list(padding), list(output_padding)
    )


def __getattr__(name: str):
    raise missing("spconv.pytorch.ops", name)
