"""Feature-wise layers that carry the VoxelTensor: norm, activations, dropout, Sequential."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from relconv.ops import batch_norm_act
from relconv.voxel.conv import Conv3d, run_layer
from relconv.voxel.fold import FoldCache
from relconv.voxel.sync_batch_norm import sync_batch_norm, sync_group
from relconv.voxel.tensor import VoxelTensor
from relconv.voxel.utils import registered

_HALF = (torch.float16, torch.bfloat16)


def norm_act(bn: nn.BatchNorm1d, feats: torch.Tensor, relu: bool) -> torch.Tensor:
    """`relu?(bn(feats))` for a torch BatchNorm1d `bn` on `[N, C]` features, its running statistics
    updated as torch updates them: on CUDA one `batch_norm_act` op (BatchNorm and ReLU in two
    kernels a training pass), elsewhere torch's own forward. torch's forward also serves
    momentum=None (a cumulative average divides by num_batches_tracked on the host) and parameters
    in a dtype the op does not take (they must be the features' dtype, or float32 for half ones)."""
    weight, mean = registered(bn, "weight"), registered(bn, "running_mean")
    training = bn.training
    if (
        not feats.is_cuda
        or bn.momentum is None
        or not _op_dtypes(feats.dtype, weight, mean)
        or (training and feats.shape[0] < 2)  # torch's error: one value per channel has no variance
    ):
        out = nn.BatchNorm1d.forward(bn, feats)
        return torch.relu(out) if relu else out
    # torch's rule: the running statistics are read in eval mode and updated in training when tracked.
    use_running = not training or bn.track_running_stats
    return batch_norm_act(
        feats,
        weight,
        registered(bn, "bias"),
        mean if use_running else None,
        registered(bn, "running_var") if use_running else None,
        training or mean is None,
        bn.momentum,
        bn.eps,
        relu,
        # torch counts batches in training when tracking; the op increments it in its kernel.
        registered(bn, "num_batches_tracked") if training and bn.track_running_stats else None,
    )


def _op_dtypes(dtype: torch.dtype, *tensors: torch.Tensor | None) -> bool:
    allowed = (dtype, torch.float32) if dtype in _HALF else (dtype,)
    present = [t.dtype for t in tensors if t is not None]
    return all(d == present[0] and d in allowed for d in present)


class _FeatureWise(nn.Module):
    """Applies a torch module to `x.feats` and keeps coordinates, stride and map cache."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        if not isinstance(x, VoxelTensor):
            raise TypeError(f"x must be a VoxelTensor, got {type(x).__name__}")
        return x.replace_feature(self.module(x.feats))


class BatchNorm(_FeatureWise):
    """`torch.nn.BatchNorm1d` over voxels (statistics over all voxels of the batch).

    Its parameters and state (`module`) are torch's; on CUDA it runs as relconv's `batch_norm_act`
    op (two kernels a training forward and backward, one C++ autograd node), which also takes a
    following ReLU in `Sequential`.

    Distributed training: `relconv.voxel.convert_sync_batchnorm(model)` turns every BatchNorm into
    a `relconv.voxel.SyncBatchNorm` (any device and backend). `torch.nn.SyncBatchNorm.
    convert_sync_batchnorm(model)` works too: it turns `module` into a torch SyncBatchNorm, whose
    training statistics with a process group of more than one rank then span all ranks through
    `relconv.voxel.sync_batch_norm`, the same collectives (DistributedDataParallel refuses torch's
    SyncBatchNorm in a CPU model, so that converter is for GPU jobs).
    Evaluation and single-rank training keep the fused op.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__(nn.BatchNorm1d(num_features, eps=eps, momentum=momentum))

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        if not isinstance(x, VoxelTensor):
            raise TypeError(f"x must be a VoxelTensor, got {type(x).__name__}")
        return x.replace_feature(self.normalise(x.feats, relu=False))

    def normalise(self, feats: torch.Tensor, relu: bool) -> torch.Tensor:
        """`relu?(module(feats))`, the module's running statistics updated as torch updates them."""
        bn = self._modules["module"]  # the registries, not nn.Module.__getattr__ (see `registered`)
        if isinstance(bn, nn.SyncBatchNorm) and bn.training and dist.is_available() and dist.is_initialized():
            # torch's SyncBatchNorm refuses CPU input under a process group, and on CUDA reads the
            # device back every layer; relconv's collectives serve both.
            if not feats.is_cuda or sync_group(bn.process_group)[1] > 1:
                out = sync_batch_norm(feats, bn)
                return torch.relu(out) if relu else out
        return norm_act(bn, feats, relu)


class ReLU(_FeatureWise):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__(nn.ReLU(inplace=inplace))


class LeakyReLU(_FeatureWise):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__(nn.LeakyReLU(negative_slope, inplace=inplace))


class Dropout(_FeatureWise):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__(nn.Dropout(p))


_FOLDING = [True]


@contextlib.contextmanager
def inference_folding(enabled: bool) -> Iterator[None]:
    """Turns the on-the-fly BatchNorm folding of eval-mode forwards (see `Sequential`) on or off
    inside the block; for comparing against the unfolded network."""
    old = _FOLDING[0]
    _FOLDING[0] = bool(enabled)
    try:
        yield
    finally:
        _FOLDING[0] = old


def inference_folding_enabled() -> bool:
    """Whether eval-mode forwards fold BatchNorm into the preceding conv (`inference_folding`)."""
    return _FOLDING[0]


def conv_bn_runs(
    children: list[nn.Module],
    is_conv: Callable[[nn.Module], bool] | None = None,
    norm_of: Callable[[nn.Module], nn.Module | None] | None = None,
    is_relu: Callable[[nn.Module], bool] | None = None,
) -> list:
    """`children` with every conv -> BatchNorm [-> ReLU] run replaced by the tuple (conv, bn, the ReLU
    or None). By default: a relconv `Conv3d` without its own activation, a relconv `BatchNorm`
    tracking running statistics, a relconv `ReLU`; a front end passes its own predicates (`norm_of`
    gives the torch BatchNorm1d a module normalises with, or None)."""
    is_conv = is_conv or (lambda m: isinstance(m, Conv3d) and m.activation is None)
    norm_of = norm_of or (lambda m: m.module if isinstance(m, BatchNorm) else None)
    is_relu = is_relu or (lambda m: isinstance(m, ReLU))
    out: list = []
    i = 0
    while i < len(children):
        m = children[i]
        norm = norm_of(children[i + 1]) if i + 1 < len(children) and is_conv(m) else None
        if norm is not None and norm.running_mean is not None and norm.num_features == m.out_channels:
            relu = children[i + 2] if i + 2 < len(children) and is_relu(children[i + 2]) else None
            out.append((m, children[i + 1], relu))
            i += 3 if relu is not None else 2
        else:
            out.append(m)
            i += 1
    return out


def bn_relu_pairs(children: list[nn.Module]) -> list:
    """`children` with every `BatchNorm -> ReLU` pair replaced by the tuple (bn,): one op."""
    out: list = []
    i = 0
    while i < len(children):
        m = children[i]
        if isinstance(m, BatchNorm) and i + 1 < len(children) and isinstance(children[i + 1], ReLU):
            out.append((m,))
            i += 2
        else:
            out.append(m)
            i += 1
    return out


class Sequential(nn.Sequential):
    """`torch.nn.Sequential` whose input and output are VoxelTensors.

    In eval mode without autograd (`torch.no_grad()` / `torch.inference_mode()`), every
    `Conv3d -> BatchNorm [-> ReLU]` run executes as one conv with the BatchNorm folded into its
    weight and bias and the ReLU in its epilogue (`relconv.voxel.fold`): one kernel instead of
    three, no BatchNorm host work. The folded parameters are cached per run in the dtype the conv
    computes in (the autocast dtype under autocast) and rebuilt when any parameter or statistic
    changes. `inference_folding(False)` runs the layers one by one instead.
    Otherwise (training, autograd) every `BatchNorm -> ReLU` pair runs as one `batch_norm_act`.
    """

    def __init__(self, *args: nn.Module) -> None:
        super().__init__(*args)
        self._fold_plan: tuple[tuple, tuple[list, list]] | None = None

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        if not isinstance(x, VoxelTensor):
            raise TypeError(f"x must be a VoxelTensor, got {type(x).__name__}")
        if self.training or torch.is_grad_enabled() or not _FOLDING[0]:
            for step in self._plans()[1]:
                if type(step) is tuple:  # BatchNorm -> ReLU as one op
                    x = x.replace_feature(step[0].normalise(x.feats, relu=True))
                else:
                    x = step(x)
            return x
        for step in self._plans()[0]:
            if type(step) is tuple:
                conv, bn, relu, cache = step
                norm = bn._modules["module"]  # not bn.module: nn.Module.__getattr__ is a Python frame
                if norm.training:  # a BatchNorm left in training mode normalises by the batch
                    x = bn(conv(x))
                    x = relu(x) if relu is not None else x
                    continue
                w, b = cache.get(conv, norm, x.feats)
                x = run_layer(
                    x,
                    w,
                    conv.kernel_size,
                    conv.stride,
                    conv.dilation,
                    conv.groups,
                    b,
                    conv.transposed,
                    conv.generative,
                    conv.indice_key,
                    None if relu is None else "relu",
                )
            else:
                x = step(x)
        return x

    def _plans(self) -> tuple[list, list]:
        """(inference steps: folded Conv3d -> BatchNorm [-> ReLU] runs as (conv, bn, relu, cache);
        layer steps: BatchNorm -> ReLU pairs as (bn,)), rebuilt when the children change."""
        children = tuple(self._modules.values())
        plan = self._fold_plan
        if plan is None or plan[0] != children:
            inference = [s + (FoldCache(),) if type(s) is tuple else s for s in conv_bn_runs(list(children))]
            plan = self._fold_plan = (children, (inference, bn_relu_pairs(list(children))))
        return plan[1]
