"""Inference-time folding of BatchNorm into the preceding sparse conv (and ReLU into its epilogue).

In eval mode a BatchNorm is the per-channel affine map `y = (x - mean) * g + beta` with
`g = gamma / sqrt(var + eps)`, so `BN(conv(x, W) + b)` equals `conv(x, W * g) + ((b - mean) * g + beta)`:
the conv absorbs it exactly (up to rounding) and the network runs one kernel where it ran three
(conv, normalise, activation) with two fewer passes over the features.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from relconv.voxel.conv import Conv3d
from relconv.voxel.nn import BatchNorm, ReLU


@torch.no_grad()
def fold_batchnorm(conv: Conv3d, bn: nn.BatchNorm1d, relu: bool = False) -> Conv3d:
    """A new Conv3d (with bias) computing `relu?(bn(conv(x)))` with BatchNorm in eval mode."""
    if not isinstance(conv, Conv3d):
        raise TypeError(f"conv must be a relconv.voxel.Conv3d, got {type(conv).__name__}")
    if not isinstance(bn, nn.BatchNorm1d) or bn.running_mean is None or bn.running_var is None:
        raise TypeError("bn must be a BatchNorm1d that tracks running statistics")
    if bn.num_features != conv.out_channels:
        raise ValueError(f"bn has {bn.num_features} features but conv has {conv.out_channels} outputs")
    fused = copy.deepcopy(conv)
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
    fused.weight = nn.Parameter((w.to(torch.float64) * g).to(w.dtype))
    fused.bias = nn.Parameter(bias.to(w.dtype))
    fused.activation = "relu" if relu else None
    return fused


def fuse_conv_bn(model: nn.Module) -> nn.Module:
    """An eval-mode copy of `model` with every `Conv3d -> BatchNorm [-> ReLU]` run folded into one conv.

    Runs are found inside every `torch.nn.Sequential` (relconv's `Sequential` included), which is how
    relconv's models and blocks chain their layers. The original model is left untouched. Use for
    inference only: the folded conv uses the BatchNorm's running statistics.
    """
    fused = copy.deepcopy(model).eval()
    for module in list(fused.modules()):
        if isinstance(module, nn.Sequential):
            _fuse_sequential(module)
    return fused


def _fuse_sequential(seq: nn.Sequential) -> None:
    children = list(seq.children())
    out: list[nn.Module] = []
    i = 0
    while i < len(children):
        m = children[i]
        nxt = children[i + 1] if i + 1 < len(children) else None
        if isinstance(m, Conv3d) and m.activation is None and isinstance(nxt, BatchNorm):
            relu = i + 2 < len(children) and isinstance(children[i + 2], ReLU)
            out.append(fold_batchnorm(m, nxt.module, relu))
            i += 3 if relu else 2
        else:
            out.append(m)
            i += 1
    if len(out) != len(children):
        for name in list(seq._modules):
            del seq._modules[name]
        for j, m in enumerate(out):
            seq.add_module(str(j), m)
