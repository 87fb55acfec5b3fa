"""Training-mode BatchNorm whose statistics span every rank of a process group, on any device.

`sync_batch_norm` normalises a rank's rows by the statistics of the whole group, for a
`torch.nn.SyncBatchNorm` or a `torch.nn.BatchNorm1d`: the forward gathers each rank's (mean, sum of
squared deviations, count) and merges them on the device (Chan et al.'s pairwise update, stable for
large means and for ranks with different row counts, empty ranks included); the backward all-reduces
(sum dy, sum dy * (x - mean)) so that every rank's input gradient is that of the global batch. The
weight and bias gradients stay local, as in torch: DistributedDataParallel averages them with the
other parameters. On CUDA it runs torch's SyncBatchNorm kernels (`batch_norm_stats`,
`batch_norm_gather_stats_with_counts`, `batch_norm_elemt`, `batch_norm_backward_reduce`,
`batch_norm_backward_elemt`); unlike `torch.nn.SyncBatchNorm` it never reads the device back (that
one reads the gathered counts once a layer to drop empty ranks), so the host keeps queueing work
while the collectives run. It serves
CPU ranks under gloo too, which torch's SyncBatchNorm refuses. `relconv.voxel.SyncBatchNorm` and
`relconv.voxel.BatchNorm` around a torch SyncBatchNorm both normalise through it.
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
        x = x.contiguous()
        global_stats = _global_stats_cuda if x.is_cuda else _global_stats_exact
        mean, invstd, counts = global_stats(x, running_mean, running_var, eps, momentum, group, world)
        ctx.save_for_backward(x, weight, mean, invstd, counts)
        ctx.group = group
        return _normalise(x, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd, counts = ctx.saved_tensors
        dy = dy.contiguous()
        needs_w = weight is not None and ctx.needs_input_grad[1]
        needs_b = weight is not None and ctx.needs_input_grad[2]
        sum_dy, sum_dy_xmu, grad_w, grad_b = _grad_sums(dy, x, weight, mean, invstd, needs_w, needs_b)
        grad_x = None
        if ctx.needs_input_grad[0]:
            both = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(both, group=ctx.group)
            grad_x = _grad_input(dy, x, weight, mean, invstd, *both.chunk(2), counts)
        return grad_x, grad_w, grad_b, None, None, None, None, None, None


# The global count stays on the device: a host read per layer would drain the launch queue of every
# rank at every BatchNorm (torch's SyncBatchNorm reads the counts to drop empty ranks). Only a rank
# with fewer than two rows of its own reads it, since only then can the whole group hold fewer.
def _check_total(n: int, counts: Tensor) -> None:
    if n < 2 and float(counts.sum()) < 2:
        raise ValueError(f"Expected more than 1 value per channel when training, got {int(counts.sum())}")


def _global_stats_cuda(x, running_mean, running_var, eps, momentum, group, world):
    """(mean, invstd, per-rank counts) of the group's rows, running statistics updated, in torch's
    CUDA BatchNorm kernels: a few launches and one all_gather a layer, as few as the host can queue."""
    n, c = x.shape
    if n:
        mean, invstd = torch.batch_norm_stats(x, eps)
    else:  # an empty rank joins the collective with zero weight
        mean, invstd = x.new_zeros(c, dtype=torch.float32), x.new_ones(c, dtype=torch.float32)
    stats = _all_gather_rows(torch.cat([mean, invstd, mean.new_full((1,), n)]), world, group)
    counts = stats[:, 2 * c]
    _check_total(n, counts)
    # The merge kernel folds the ranks one by one with weight count / (rows so far + count): a tiny
    # count keeps an empty first rank from 0 / 0 and still weighs it at nothing.
    weights = counts.clamp_min(1e-30)
    if running_mean is not None:
        weights = weights.to(running_mean.dtype)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x, stats[:, :c], stats[:, c : 2 * c], running_mean, running_var, momentum, eps, weights
    )
    return mean, invstd, counts


def _global_stats_exact(x, running_mean, running_var, eps, momentum, group, world):
    """The same in float64 tensor arithmetic (Chan et al.'s merge of per-rank mean and squared
    deviations), for devices without torch's SyncBatchNorm kernels."""
    n, c = x.shape
    if n:
        var, mean = torch.var_mean(x.float(), 0, correction=0)
    else:
        var = mean = x.new_zeros(c, dtype=torch.float32)
    local = torch.cat([mean.double(), var.double() * n, mean.new_full((1,), n, dtype=torch.float64)])
    stats = _all_gather_rows(local, world, group)
    means, m2s, counts = stats[:, :c], stats[:, c : 2 * c], stats[:, 2 * c :]
    _check_total(n, counts)
    total = counts.sum()
    g_mean = (counts * means).sum(0) / total
    g_m2 = (m2s + counts * (means - g_mean) ** 2).sum(0)
    if running_mean is not None:
        running_mean.mul_(1.0 - momentum).add_(g_mean.to(running_mean.dtype), alpha=momentum)
        unbiased = (g_m2 / (total - 1)).to(running_var.dtype)
        running_var.mul_(1.0 - momentum).add_(unbiased, alpha=momentum)
    return g_mean.float(), torch.rsqrt((g_m2 / total).float() + eps), counts.view(-1)


def _all_gather_rows(local: Tensor, world: int, group) -> Tensor:
    """[world, len(local)]: every rank's `local`, in rank order (gloo has no all_gather_into_tensor)."""
    if dist.get_backend(group) == "gloo":
        rows = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(rows, local, group=group)
        return torch.stack(rows)
    out = local.new_empty(world, len(local))
    dist.all_gather_into_tensor(out, local, group=group)
    return out


# Per-rank pieces: torch's BatchNorm kernels on CUDA ([N, C] input of any float dtype, float32
# statistics), the same arithmetic in float32 elsewhere.


def _normalise(x: Tensor, weight, bias, mean: Tensor, invstd: Tensor, eps: float) -> Tensor:
    if x.is_cuda:
        return torch.batch_norm_elemt(x, weight, bias, mean, invstd, eps) if len(x) else torch.empty_like(x)
    xhat = (x.float() - mean) * invstd
    return (xhat if weight is None else xhat * weight.float() + bias.float()).to(x.dtype)


def _grad_sums(dy, x, weight, mean, invstd, needs_w: bool, needs_b: bool):
    """(sum of dy, sum of dy * (x - mean), weight gradient, bias gradient) over this rank's rows;
    the two sums in float32, the gradients None where not needed."""
    if x.is_cuda and len(x):
        return torch.batch_norm_backward_reduce(dy, x, mean, invstd, weight, True, needs_w, needs_b)
    dyf = dy.float()
    sum_dy, sum_dy_xmu = dyf.sum(0), (dyf * (x.float() - mean)).sum(0)
    grad_w = (sum_dy_xmu * invstd).to(weight.dtype) if needs_w else None
    grad_b = sum_dy.to(weight.dtype) if needs_b else None
    return sum_dy, sum_dy_xmu, grad_w, grad_b


def _grad_input(dy, x, weight, mean, invstd, sum_dy, sum_dy_xmu, counts) -> Tensor:
    """The input gradient of the global batch's normalisation for this rank's rows, from the
    group's gradient sums."""
    if x.is_cuda:
        if not len(x):
            return torch.empty_like(x)
        count = counts.to(torch.int32)
        return torch.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count)
    total = counts.sum().float()
    scale = invstd if weight is None else invstd * weight.float()
    xmu = x.float() - mean
    grad = (dy.float() - sum_dy / total - xmu * (invstd * invstd) * (sum_dy_xmu / total)) * scale
    return grad.to(x.dtype)
