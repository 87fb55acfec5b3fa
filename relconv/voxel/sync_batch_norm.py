"""Training-mode BatchNorm whose statistics span every rank of a process group, on any device.

`torch.nn.SyncBatchNorm` refuses input on CPU (and on any device but CUDA-like ones) once a process
group exists, so a gloo job on CPU cannot run it. `sync_batch_norm` computes the same thing with
collectives every backend has (`all_gather`, `all_reduce`), for a `torch.nn.SyncBatchNorm` or a
`torch.nn.BatchNorm1d` and a process group: the forward gathers each rank's
(mean, sum of squared deviations, count) and merges them (Chan et al.'s pairwise update, stable for
large means and for ranks with different row counts, empty ranks included); the backward all-reduces
(sum dy, sum dy * x_hat) so that every rank's input gradient is that of the global batch. The
weight and bias gradients stay local, as in torch: DistributedDataParallel averages them with the
other parameters. `relconv.voxel.SyncBatchNorm` normalises through it on every device but CUDA (where
torch's SyncBatchNorm kernels serve), and `relconv.voxel.BatchNorm` routes here when its module is a
torch SyncBatchNorm on a non-CUDA device.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn


def sync_group(process_group=None):
    """(process group, world size): `process_group`, or the default group when None; world size 1
    when no process group is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return None, 1
    group = process_group if process_group is not None else dist.group.WORLD
    return group, dist.get_world_size(group)


def sync_batch_norm(feats: Tensor, bn: nn.Module, process_group=None) -> Tensor:
    """`bn(feats)` for `bn` in training mode, with batch statistics over all ranks of a group.

    `bn` is a `torch.nn.BatchNorm1d` or `torch.nn.SyncBatchNorm`; the group is `process_group`,
    else a SyncBatchNorm's own `process_group`, else the default group. `feats` is [N, C]. Running
    statistics and `num_batches_tracked` are updated as torch updates them (unbiased running
    variance over the global row count; momentum None: cumulative average). Every rank of the
    group must call it, in the same order as its other collectives.
    """
    if not isinstance(bn, (nn.BatchNorm1d, nn.SyncBatchNorm)):
        raise TypeError(f"bn must be a torch.nn.BatchNorm1d or SyncBatchNorm, got {type(bn).__name__}")
    if not bn.training:
        raise ValueError("sync_batch_norm normalises by batch statistics: bn must be in training mode")
    if feats.dim() != 2 or feats.shape[1] != bn.num_features:
        raise ValueError(f"feats must have shape [N, {bn.num_features}], got {tuple(feats.shape)}")
    factor = 0.0 if bn.momentum is None else bn.momentum
    if bn.track_running_stats:
        bn.num_batches_tracked.add_(1)
        if bn.momentum is None:
            factor = 1.0 / float(bn.num_batches_tracked)
    running_mean = bn.running_mean if bn.track_running_stats else None
    running_var = bn.running_var if bn.track_running_stats else None
    if process_group is None and isinstance(bn, nn.SyncBatchNorm):
        process_group = bn.process_group
    group, world = sync_group(process_group)
    if world == 1:
        return F.batch_norm(feats, running_mean, running_var, bn.weight, bn.bias, True, factor, bn.eps)
    return _SyncBatchNorm.apply(
        feats, bn.weight, bn.bias, running_mean, running_var, bn.eps, factor, group, world
    )


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, world):
        n, c = x.shape
        xf = x.float()
        if n:
            var, mean = torch.var_mean(xf, 0, correction=0)
        else:  # an empty rank still joins the collective, with zero weight in the merge
            var = mean = xf.new_zeros(c)
        local = torch.cat([mean.double(), var.double() * n, mean.new_full((1,), n, dtype=torch.float64)])
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local, group=group)
        stats = torch.stack(gathered)
        means, m2s, counts = stats[:, :c], stats[:, c : 2 * c], stats[:, 2 * c :]
        # The global count stays on the device: a host read per layer would drain the launch queue
        # of every rank at every BatchNorm. Only a rank with fewer than two rows of its own reads it,
        # since only then can the whole group hold fewer than two.
        total = counts.sum()
        if n < 2 and float(total) < 2:
            raise ValueError(f"Expected more than 1 value per channel when training, got {int(total)}")
        g_mean = (counts * means).sum(0) / total
        g_m2 = (m2s + counts * (means - g_mean) ** 2).sum(0)
        if running_mean is not None:
            running_mean.mul_(1.0 - momentum).add_(g_mean.to(running_mean.dtype), alpha=momentum)
            unbiased = (g_m2 / (total - 1)).to(running_var.dtype)
            running_var.mul_(1.0 - momentum).add_(unbiased, alpha=momentum)
        mean32 = g_mean.float()
        invstd = torch.rsqrt((g_m2 / total).float() + eps)
        xhat = (xf - mean32) * invstd
        out = xhat if weight is None else xhat * weight.float() + bias.float()
        ctx.save_for_backward(x, weight, mean32, invstd)
        ctx.total, ctx.group = total, group
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        dyf = dy.float()
        xhat = (x.float() - mean) * invstd
        sum_dy = dyf.sum(0)
        sum_dy_xhat = (dyf * xhat).sum(0)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            both = torch.cat([sum_dy, sum_dy_xhat])
            dist.all_reduce(both, group=ctx.group)
            g_dy, g_dy_xhat = both.chunk(2)
            scale = invstd if weight is None else invstd * weight.float()
            grad_x = ((dyf - g_dy / ctx.total - xhat * (g_dy_xhat / ctx.total)) * scale).to(x.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = sum_dy_xhat.to(weight.dtype)
        if weight is not None and ctx.needs_input_grad[2]:
            grad_b = sum_dy.to(weight.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None, None
