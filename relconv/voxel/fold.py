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
    return fold_tensors(conv.weight, conv.bias, conv.groups, bn)


@torch.no_grad()
def fold_tensors(
    weight: Tensor, bias: Tensor | None, groups: int, bn: nn.BatchNorm1d
) -> tuple[Tensor, Tensor]:
    """`folded_parameters` of a relconv-layout weight (`[K, C_in, C_out]`, or grouped
    `[K, G, C_in/G, C_out/G]`: output channels last) and bias, for layers that keep their own."""
    gain = bn.running_var.to(torch.float64).add(bn.eps).rsqrt()
    if bn.weight is not None:
        gain = gain * bn.weight.to(torch.float64)
    shift = -bn.running_mean.to(torch.float64)
    if bias is not None:
        shift = shift + bias.to(torch.float64)
    shift = shift * gain
    if bn.bias is not None:
        shift = shift + bn.bias.to(torch.float64)
    g = gain.reshape(groups, 1, -1) if weight.dim() == 4 else gain
    return (weight.to(torch.float64) * g).to(weight.dtype), shift.to(weight.dtype)


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
        return self.get_tensors(registered(conv, "weight"), registered(conv, "bias"), conv.groups, bn, feats)

    def get_tensors(
        self, weight: Tensor, bias: Tensor | None, groups: int, bn: nn.BatchNorm1d, feats: Tensor
    ) -> tuple[Tensor, Tensor]:
        """`get` for a relconv-layout weight and bias that a layer keeps in its own form."""
        tensors = (weight, bias, *_bn_inputs(bn))
        dtype = compute_dtype_for(weight.dtype, feats)
        key = (dtype, bn.eps, *[None if t is None else (id(t), t._version) for t in tensors])
        if key != self.key:
            weight, bias = fold_tensors(weight, bias, groups, bn)
            self.weight, self.bias = weight.to(dtype), bias.to(dtype)
            self.key, self.tensors = key, tensors
        return self.weight, self.bias


def _bn_inputs(bn: nn.BatchNorm1d) -> tuple:
    """(weight, bias, running mean, running var): what the folding reads of the BatchNorm."""
    return (
        registered(bn, "weight"),
        registered(bn, "bias"),
        registered(bn, "running_mean"),
        registered(bn, "running_var"),
    )
