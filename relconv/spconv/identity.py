"""`Identity`: returns its input (a SparseConvTensor or anything else)."""

from __future__ import annotations

from torch.nn import Module

from relconv.spconv._missing import missing


class Identity(Module):
    def forward(self, input):
        return input

    def input_spatial_size(self, out_size):
        return out_size


def __getattr__(name: str):
    raise missing("spconv.pytorch.identity", name)
