"""BatchNorm folded into the preceding sparse conv: the arithmetic, and the cache eval-mode forwards use.

In eval mode a BatchNorm is the per-channel affine map `y = (x - mean) * g + beta` with
`g = gamma / sqrt(var + eps)`, so `BN(conv(x, W) + b)` equals `conv(x, W * g) + ((b - mean) * g + beta)`:
the conv absorbs it exactly (up to rounding) and the network runs one kernel where it ran three
(conv, normalise, activation) with two fewer passes over the features.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relconv.ops import compute_dtype_for
from relconv.voxel.utils import registered


@torch.no_grad()
def folded_parameters(conv: nn.Module, bn: nn.BatchNorm1d) -> tuple[Tensor, Tensor]:
    """(weight, bias) of the conv computing `bn(conv(x))`, BatchNorm in eval mode, in the conv's
    weight dtype (the arithmetic runs in float64)."""
    w = conv.weight
    gain = bn.running_var.to(torch.float64).add(bn.eps).rsqrt()
    if bn.weight is not None:
        gain = gain * bn.weight.to(torch.float64)
    bias = -bn.running_mean.to(torch.float64)
    if conv.bias is not None:
        bias = bias + conv.bias.to(torch.float64)
    bias = bias * gain
    if bn.bias is not None:
        bias = bias + bn.bias.to(torch.float64)
    # Output channels are the last weight axis; grouped weights [K, G, Cin/G, Cout/G] split them by group.
    g = gain.reshape(conv.groups, 1, -1) if w.dim() == 4 else gain
    return (w.to(torch.float64) * g).to(w.dtype), bias.to(w.dtype)


class FoldCache:
    """The folded (weight, bias) of one Conv3d -> BatchNorm pair, in the dtype the conv computes in.

    Rebuilt whenever a parameter or running statistic changes: the key holds each tensor's identity
    and version counter (bumped by every in-place write: optimiser steps, `load_state_dict`, BN
    statistics updates), and the entry keeps the tensors alive so that an identity is never reused.
    """

    __slots__ = ("key", "tensors", "weight", "bias")

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.tensors: tuple = ()
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None

    def get(self, conv: nn.Module, bn: nn.BatchNorm1d, feats: Tensor) -> tuple[Tensor, Tensor]:
        """The folded parameters for a forward of `feats`: in the conv weight's dtype, or in the
        autocast dtype when a float32 conv runs under autocast."""
        tensors = _fold_inputs(conv, bn)
        dtype = compute_dtype_for(tensors[0].dtype, feats)
        key = (dtype, bn.eps, *[None if t is None else (id(t), t._version) for t in tensors])
        if key != self.key:
            weight, bias = folded_parameters(conv, bn)
            self.weight, self.bias = weight.to(dtype), bias.to(dtype)
            self.key, self.tensors = key, tensors
        return self.weight, self.bias


def _fold_inputs(conv: nn.Module, bn: nn.BatchNorm1d) -> tuple:
    """(conv weight, conv bias, bn weight, bn bias, running mean, running var): what the folding reads."""
    return (
        registered(conv, "weight"),
        registered(conv, "bias"),
        registered(bn, "weight"),
        registered(bn, "bias"),
        registered(bn, "running_mean"),
        registered(bn, "running_var"),
    )
