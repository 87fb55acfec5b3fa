"""spconv's module containers: `SparseModule`, `SparseSequential` and the small sparse modules."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from relconv.spconv._missing import missing
from relconv.spconv.conv import SparseConvolution
from relconv.spconv.core import SparseConvTensor, SparseModule


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
        for module in self._modules.values():
            if is_spconv_module(module):
                input = module(input)
            elif isinstance(input, SparseConvTensor):
                if input.indices.shape[0] != 0:
                    input = input.replace_feature(module(input.features))
            else:
                input = module(input)
        return input


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
