"""spconv's table modules: `ConcatTable` (branch), `AddTable` and `JoinTable` (merge on equal sites)."""

from __future__ import annotations

import torch

from relconv.spconv._missing import missing
from relconv.spconv.core import SparseConvTensor, SparseModule
from relconv.spconv.functional import sparse_add


def _check_aligned(inputs: list, what: str) -> None:
    if not inputs or not all(isinstance(t, SparseConvTensor) for t in inputs):
        raise TypeError(f"{what} takes a non-empty list of SparseConvTensor")
    first = inputs[0]
    for i, t in enumerate(inputs[1:], start=1):
        if (
            t.spatial_shape != first.spatial_shape
            or t.batch_size != first.batch_size
            or t.indices.shape[0] != first.indices.shape[0]
        ):
            raise ValueError(
                f"{what} needs tensors on the same sites: input {i} has spatial_shape {t.spatial_shape}, "
                f"batch_size {t.batch_size}, {t.indices.shape[0]} sites; input 0 has {first.spatial_shape}, "
                f"{first.batch_size}, {first.indices.shape[0]} (AddTableMisaligned adds misaligned ones)"
            )


class JoinTable(SparseModule):
    """Concatenates the features of tensors on the same sites (channel dimension)."""

    def forward(self, input: list[SparseConvTensor]) -> SparseConvTensor:
        _check_aligned(input, "JoinTable")
        return input[0].replace_feature(torch.cat([t.features for t in input], 1))

    def input_spatial_size(self, out_size):
        return out_size


class AddTable(SparseModule):
    """Sums the features of tensors on the same sites."""

    def forward(self, input: list[SparseConvTensor]) -> SparseConvTensor:
        _check_aligned(input, "AddTable")
        return input[0].replace_feature(sum(t.features for t in input))

    def input_spatial_size(self, out_size):
        return out_size


class AddTableMisaligned(SparseModule):
    """Sums tensors on different sites of one grid (the union of their sites; `sparse_add`)."""

    def forward(self, input: list[SparseConvTensor]) -> SparseConvTensor:
        return sparse_add(*input)

    def input_spatial_size(self, out_size):
        return out_size


class ConcatTable(SparseModule):
    """Runs every child module on the same input and returns the list of their outputs."""

    def forward(self, input):
        return [module(input) for module in self._modules.values()]

    def add(self, module):
        self._modules[str(len(self._modules))] = module
        return self

    def input_spatial_size(self, out_size):
        return self._modules["0"].input_spatial_size(out_size)


def __getattr__(name: str):
    raise missing("spconv.pytorch.tables", name)
