"""Inference-time folding of BatchNorm into the preceding sparse conv (and ReLU into its epilogue), as a
new module: for export or inspection. Eval-mode forwards without autograd fold on the fly
(`relconv.voxel.Sequential`), so running a model does not need this; the arithmetic is
`relconv.voxel.fold.folded_parameters`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from relconv.voxel.conv import Conv3d
from relconv.voxel.fold import folded_parameters
from relconv.voxel.nn import conv_bn_runs


@torch.no_grad()
def fold_batchnorm(conv: Conv3d, bn: nn.BatchNorm1d, relu: bool = False) -> Conv3d:
    """A new Conv3d (with bias) computing `relu?(bn(conv(x)))` with BatchNorm in eval mode."""
    if not isinstance(conv, Conv3d):
        raise TypeError(f"conv must be a relconv.voxel.Conv3d, got {type(conv).__name__}")
    # A SyncBatchNorm folds as a BatchNorm1d does: in eval mode both normalise by running statistics.
    norms = (nn.BatchNorm1d, nn.SyncBatchNorm)
    if not isinstance(bn, norms) or bn.running_mean is None or bn.running_var is None:
        raise TypeError("bn must be a BatchNorm1d or SyncBatchNorm that tracks running statistics")
    if bn.num_features != conv.out_channels:
        raise ValueError(f"bn has {bn.num_features} features but conv has {conv.out_channels} outputs")
    fused = copy.deepcopy(conv)
    weight, bias = folded_parameters(conv, bn)
    fused.weight = nn.Parameter(weight)
    fused.bias = nn.Parameter(bias)
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
    runs = conv_bn_runs(list(seq.children()))
    if all(type(r) is not tuple for r in runs):
        return
    out = [fold_batchnorm(r[0], r[1].module, r[2] is not None) if type(r) is tuple else r for r in runs]
    for name in list(seq._modules):
        del seq._modules[name]
    for j, m in enumerate(out):
        seq.add_module(str(j), m)
