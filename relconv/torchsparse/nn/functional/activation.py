"""TorchSparse's functional activations: torch's, applied to the features."""

from __future__ import annotations

from torch.nn import functional as tF

from relconv.torchsparse.nn.utils import fapply
from relconv.torchsparse.tensor import SparseTensor

__all__ = ["leaky_relu", "relu", "silu"]


def relu(input: SparseTensor, inplace: bool = True) -> SparseTensor:
    return fapply(input, tF.relu, inplace=inplace)


def silu(input: SparseTensor, inplace: bool = True) -> SparseTensor:
    return fapply(input, tF.silu, inplace=inplace)


def leaky_relu(input: SparseTensor, negative_slope: float = 0.1, inplace: bool = True) -> SparseTensor:
    return fapply(input, tF.leaky_relu, negative_slope=negative_slope, inplace=inplace)
