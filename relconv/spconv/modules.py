"""spconv's module containers: `SparseModule`, `SparseSequential` and the small sparse modules."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.modules.module import (
    _global_backward_hooks,
    _global_backward_pre_hooks,
    _global_forward_hooks,
    _global_forward_pre_hooks,
)

from relconv.spconv._missing import missing
from relconv.spconv.conv import SparseConvolution
from relconv.spconv.core import SparseConvTensor, SparseModule
from relconv.voxel.fold import FoldCache
from relconv.voxel.nn import conv_bn_runs, inference_folding_enabled, norm_act


class SparseBatchNorm(nn.BatchNorm1d):
    """BatchNorm1d over a SparseConvTensor's features (or a plain tensor)."""

    def forward(self, input):
        if isinstance(input, SparseConvTensor):
            return input.replace_feature(super().forward(input.features))
        return super().forward(input)


class SparseSyncBatchNorm(nn.SyncBatchNorm):
    """SyncBatchNorm over a SparseConvTensor's features (or a plain tensor)."""

    def forward(self, input):
        if isinstance(input, SparseConvTensor):
            return input.replace_feature(super().forward(input.features))
        return super().forward(input)


class SparseReLU(nn.ReLU):
    """ReLU over a SparseConvTensor's features (or a plain tensor)."""

    def forward(self, input):
        if isinstance(input, SparseConvTensor):
            return input.replace_feature(super().forward(input.features))
        return super().forward(input)


class SparseIdentity(nn.Identity):
    """Identity over a SparseConvTensor's features (or a plain tensor)."""

    def forward(self, input):
        if isinstance(input, SparseConvTensor):
            return input.replace_feature(super().forward(input.features))
        return super().forward(input)


def is_spconv_module(module: nn.Module) -> bool:
    """Whether `module` takes the SparseConvTensor itself inside a SparseSequential."""
    return isinstance(module, (SparseModule, SparseBatchNorm, SparseReLU))


def is_sparse_conv(module: nn.Module) -> bool:
    return isinstance(module, SparseConvolution)


def assign_name_for_sparse_modules(module: nn.Module) -> None:
    for k, n in module.named_modules():
        if isinstance(n, SparseModule):
            n._sparse_unique_name = k


class SparseSequential(SparseModule):
    """Sequential container: sparse modules get the SparseConvTensor, dense modules (BatchNorm1d,
    ReLU, ...) its features (skipped when the tensor has no sites, as in spconv).

    Takes modules as positional arguments, one OrderedDict, or keyword arguments.

    In eval mode without autograd, every sparse conv -> `torch.nn.BatchNorm1d` [-> `torch.nn.ReLU`]
    run executes as one relconv conv with the BatchNorm folded into its weight and bias and the
    ReLU in its epilogue, as `relconv.voxel.Sequential` does (what spconv's `fused()` does by
    hand); `relconv.voxel.inference_folding(False)` runs the modules one by one instead.
    Otherwise (training, autograd) every `torch.nn.BatchNorm1d` [-> `torch.nn.ReLU`] run on a
    SparseConvTensor executes as one relconv `batch_norm_act` op on CUDA, as `relconv.voxel`'s
    BatchNorm does, with torch's statistics rules.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)
        for name, module in kwargs.items():
            if name in self._modules:
                raise ValueError(f"SparseSequential got the module name {name!r} twice")
            self.add_module(name, module)

    def __getitem__(self, idx: int) -> nn.Module:
        if not (-len(self) <= idx < len(self)):
            raise IndexError(f"index {idx} is out of range")
        return list(self._modules.values())[idx]

    def __len__(self) -> int:
        return len(self._modules)

    def add(self, module: nn.Module, name: str | None = None) -> None:
        if name is None:
            name = str(len(self._modules))
        if name in self._modules:
            raise KeyError(f"SparseSequential already has a module named {name!r}")
        self.add_module(name, module)

    def forward(self, input):
        folding = not self.training and not torch.is_grad_enabled() and inference_folding_enabled()
        for step in self._steps(folding):
            kind = type(step)
            if kind is _Norm:
                input = _normalise(step, input)
            elif kind is tuple:
                conv, bn, relu, cache = step
                if not bn.training and isinstance(input, SparseConvTensor):
                    input = conv.folded(input, bn, relu is not None, cache)
                    continue
                for module in (conv, bn) if relu is None else (conv, bn, relu):
                    input = _apply(module, input)
            else:
                input = _apply(step, input)
        return input

    def _steps(self, folding: bool) -> list:
        """The children as run: every `torch.nn.BatchNorm1d` [-> `torch.nn.ReLU`] run as a `_Norm`
        and, when `folding`, every foldable sparse conv -> BatchNorm1d [-> ReLU] run as (conv, bn,
        relu, FoldCache) first; rebuilt when the children change."""
        children = tuple(self._modules.values())
        plan = self.__dict__.get("_fold_plan")
        if plan is None or plan[0] != children:
            runs = conv_bn_runs(
                list(children),
                is_conv=lambda m: isinstance(m, SparseConvolution) and m.can_fold(),
                norm_of=lambda m: m if type(m) in _NORMS else None,
                is_relu=lambda m: type(m) in _RELUS,
            )
            folded = _norm_runs([s + (FoldCache(),) if type(s) is tuple else s for s in runs])
            plan = (children, folded, _norm_runs(list(children)))
            self.__dict__["_fold_plan"] = plan
        return plan[1] if folding else plan[2]


_NORMS = (nn.BatchNorm1d, SparseBatchNorm)
_RELUS = (nn.ReLU, SparseReLU)


class _Norm(NamedTuple):
    """A BatchNorm1d [-> ReLU] run of a SparseSequential, run as one relconv op on CUDA
    (`relconv.voxel.nn.norm_act`): two kernels a training pass where torch's BatchNorm and ReLU
    take five."""

    bn: nn.BatchNorm1d
    relu: nn.Module | None


def _hooked(step: _Norm) -> bool:
    """Whether a forward or backward hook (global or of the run's modules) expects module calls."""
    if (
        _global_forward_hooks
        or _global_forward_pre_hooks
        or _global_backward_hooks
        or _global_backward_pre_hooks
    ):
        return True
    return any(
        m is not None
        and (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)
        for m in step
    )


def _norm_runs(steps: list) -> list:
    out: list = []
    i = 0
    while i < len(steps):
        m = steps[i]
        if type(m) in _NORMS:
            relu = steps[i + 1] if i + 1 < len(steps) and type(steps[i + 1]) in _RELUS else None
            out.append(_Norm(m, relu))
            i += 2 if relu is not None else 1
        else:
            out.append(m)
            i += 1
    return out


def _normalise(step: _Norm, input):
    if not isinstance(input, SparseConvTensor) or _hooked(step):
        # A plain tensor may be [N, C, L], and hooks see their modules called: the modules as they are.
        input = _apply(step.bn, input)
        return input if step.relu is None else _apply(step.relu, input)
    if input.indices.shape[0] == 0:
        return input
    return input.replace_feature(norm_act(step.bn, input.features, step.relu is not None))


def _apply(module: nn.Module, input):
    """One module of a SparseSequential: sparse modules take the tensor, dense ones its features."""
    if is_spconv_module(module):
        return module(input)
    if isinstance(input, SparseConvTensor):
        if input.indices.shape[0] == 0:
            return input
        return input.replace_feature(module(input.features))
    return module(input)


class ToDense(SparseModule):
    """SparseConvTensor -> dense `[B, C, *spatial_shape]`."""

    def forward(self, x: SparseConvTensor) -> torch.Tensor:
        return x.dense()


class RemoveGrid(SparseModule):
    """Drops the tensor's pre-allocated grid (spconv's; relconv allocates none)."""

    def forward(self, x: SparseConvTensor) -> SparseConvTensor:
        x.grid = None
        return x


def __getattr__(name: str):
    raise missing("spconv.pytorch.modules", name)
