"""TorchSparse's feature-wise modules (norms, activations), global pooling and crop; like
`torchsparse.nn.modules`, it also exports the conv and the BEV modules.

The norms and activations are torch's own modules applied to `feats`, so their parameters,
buffers and state_dict keys are TorchSparse's (which subclasses the same torch modules).
On CUDA, `BatchNorm` runs relconv's fused `batch_norm_act` op, as relconv's own voxel layers do.
With autograd off, an eval-mode `BatchNorm` and a `ReLU` applied to a conv's output fold into that
conv; otherwise a `BatchNorm`'s output waits for its first use, and an in-place `ReLU` as that use
runs inside the norm (`relconv.torchsparse.nn.functional.pending`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from relconv.torchsparse._missing import missing
from relconv.torchsparse.nn.bev import ToBEVHeightCompression, ToDenseBEVConvolution
from relconv.torchsparse.nn.functional import global_avg_pool, global_max_pool, spcrop
from relconv.torchsparse.nn.functional.conv import Conv3d
from relconv.torchsparse.nn.functional.pending import PendingConv, PendingNorm
from relconv.torchsparse.tensor import SparseTensor

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
]


def __getattr__(name: str):
    raise missing("torchsparse.nn.modules", name)


def _sparse(input: object) -> SparseTensor:
    if not isinstance(input, SparseTensor):
        raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
    return input


class ReLU(nn.ReLU):
    def forward(self, input: SparseTensor) -> SparseTensor:
        kind = type(input)
        if kind is PendingConv:  # becomes the conv's epilogue where it can
            folded = input.with_relu()
            if folded is not None:
                return folded
        elif kind is PendingNorm and self.inplace:  # runs inside the norm, as it would have in place
            joined = input.with_relu()
            if joined is not None:
                return joined
        x = _sparse(input)
        return x._like(super().forward(x.feats))


class LeakyReLU(nn.LeakyReLU):
    def forward(self, input: SparseTensor) -> SparseTensor:
        x = _sparse(input)
        return x._like(super().forward(x.feats))


class SiLU(nn.SiLU):
    def forward(self, input: SparseTensor) -> SparseTensor:
        x = _sparse(input)
        return x._like(super().forward(x.feats))


class InstanceNorm(nn.InstanceNorm1d):
    """torch's InstanceNorm1d on the `[N, C]` features (statistics over all voxels per channel)."""

    def forward(self, input: SparseTensor) -> SparseTensor:
        x = _sparse(input)
        return x._like(super().forward(x.feats))


class BatchNorm(nn.BatchNorm1d):
    """torch's BatchNorm1d over the voxels; on CUDA relconv's `batch_norm_act` op with torch's
    statistics rules (running statistics read in eval, updated in training when tracked)."""

    def forward(self, input: SparseTensor) -> SparseTensor:
        if type(input) is PendingConv:  # folds into the conv where it can (eval, no autograd)
            folded = input.with_norm(self)
            if folded is not None:
                return folded
        # Runs at its first use, with a following in-place ReLU inside where that is the use.
        return PendingNorm(self, _sparse(input))


class GroupNorm(nn.GroupNorm):
    """torch's GroupNorm per sample: each sample's voxels form one `[1, C, N_b]` instance."""

    def forward(self, input: SparseTensor) -> SparseTensor:
        x = _sparse(input)
        coords, feats = x.coords, x.feats
        out = torch.zeros_like(feats)
        batch = coords[:, 0]
        for b in torch.unique(batch).tolist():
            rows = batch == b
            sample = feats[rows].t().unsqueeze(0)
            out[rows] = super().forward(sample).squeeze(0).t()
        return x._like(out)


class GlobalAvgPool(nn.Module):
    def forward(self, input: SparseTensor) -> Tensor:
        return global_avg_pool(input)


class GlobalMaxPool(nn.Module):
    def forward(self, input: SparseTensor) -> Tensor:
        return global_max_pool(input)


class SparseCrop(nn.Module):
    def __init__(
        self, coords_min: Sequence[int] | None = None, coords_max: Sequence[int] | None = None
    ) -> None:
        super().__init__()
        self.coords_min, self.coords_max = coords_min, coords_max

    def forward(self, input: SparseTensor) -> SparseTensor:
        return spcrop(input, self.coords_min, self.coords_max)
