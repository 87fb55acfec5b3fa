"""Synchronized BatchNorm over voxels for data-parallel training, and the model converter."""

from __future__ import annotations

import torch
from torch import nn

from relconv.voxel.nn import BatchNorm
from relconv.voxel.sync_batch_norm import sync_batch_norm, sync_group


class SyncBatchNorm(BatchNorm):
    """`relconv.voxel.BatchNorm` whose training statistics span every rank of `process_group`.

    In training with more than one rank in the group (None: the default group), the mean and
    variance are those of the voxels of all ranks together, on any device and backend, through
    `relconv.voxel.sync_batch_norm` (one all_gather in the forward, one all_reduce in the backward,
    no host read).
    Otherwise (evaluation, one rank, no process group) it is BatchNorm, fused op included.
    `module` stays a `torch.nn.BatchNorm1d`, so the state_dict is BatchNorm's (checkpoints move
    between the two unchanged) and DistributedDataParallel takes the model on CPU too. Every rank
    must run every SyncBatchNorm layer in the same order.
    """

    def __init__(
        self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, process_group=None
    ) -> None:
        super().__init__(num_features, eps=eps, momentum=momentum)
        self.process_group = process_group

    def normalise(self, feats: torch.Tensor, relu: bool) -> torch.Tensor:
        bn = self._modules["module"]
        if bn.training and sync_group(self.process_group)[1] > 1:
            out = sync_batch_norm(feats, bn, self.process_group)
            return torch.relu(out) if relu else out
        return super().normalise(feats, relu)


def convert_sync_batchnorm(module: nn.Module, process_group=None) -> nn.Module:
    """`module` with every `relconv.voxel.BatchNorm` replaced by a `SyncBatchNorm` over
    `process_group` (None: the default group) that shares its parameters and statistics.

    Replaces in place and returns `module` (or the new layer when `module` itself is a BatchNorm),
    as `torch.nn.SyncBatchNorm.convert_sync_batchnorm` does; torch's own BatchNorm layers elsewhere
    in the model are left to that function.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if isinstance(module, BatchNorm) and not isinstance(module, SyncBatchNorm):
        norm = module._modules["module"]
        out = SyncBatchNorm(norm.num_features, process_group=process_group)
        out.module = norm  # the same parameters, buffers, eps, momentum and mode
        out.train(module.training)
        return out
    for name, child in module.named_children():
        converted = convert_sync_batchnorm(child, process_group)
        if converted is not child:
            module._modules[name] = converted
    if isinstance(module, SyncBatchNorm) and process_group is not None:
        module.process_group = process_group
    return module
