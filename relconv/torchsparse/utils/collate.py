"""TorchSparse's batching of samples: `sparse_collate` and the DataLoader `sparse_collate_fn`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from relconv.torchsparse.tensor import SparseTensor

__all__ = ["sparse_collate", "sparse_collate_fn"]


def sparse_collate(inputs: Sequence[SparseTensor]) -> SparseTensor:
    """Per-sample tensors with [N_i, 3] coordinates -> one tensor with (batch, x, y, z) rows,
    batch index = position in `inputs` (numpy coords/feats are converted to tensors in place)."""
    if not inputs:
        raise ValueError("inputs must be a non-empty sequence of SparseTensor")
    stride = inputs[0].stride
    coords, feats = [], []
    for k, x in enumerate(inputs):
        if not isinstance(x, SparseTensor):
            raise TypeError(f"inputs[{k}] must be a SparseTensor, got {type(x).__name__}")
        if isinstance(x.coords, np.ndarray):
            x.coords = torch.tensor(x.coords)
        if isinstance(x.feats, np.ndarray):
            x.feats = torch.tensor(x.feats)
        if not isinstance(x.coords, torch.Tensor) or not isinstance(x.feats, torch.Tensor):
            raise TypeError(f"inputs[{k}] must hold tensors or numpy arrays as coords and feats")
        if x.stride != stride:
            raise ValueError(f"inputs[{k}] has stride {x.stride} but inputs[0] has {stride}")
        batch = torch.full((x.coords.shape[0], 1), k, dtype=torch.int32, device=x.coords.device)
        coords.append(torch.cat((batch, x.coords.to(torch.int32)), dim=1))
        feats.append(x.feats)
    return SparseTensor(torch.cat(feats, 0), torch.cat(coords, 0), stride)


def sparse_collate_fn(inputs: list[Any]) -> Any:
    """Collates a list of dict samples key by key: SparseTensors with `sparse_collate`, arrays and
    tensors stacked on a new first axis, nested dicts recursively, anything else as a list.
    A list of non-dicts comes back unchanged."""
    if not inputs or not isinstance(inputs[0], dict):
        return inputs
    output = {}
    for name, first in inputs[0].items():
        values = [sample[name] for sample in inputs]
        if isinstance(first, dict):
            output[name] = sparse_collate_fn(values)
        elif isinstance(first, np.ndarray):
            output[name] = torch.stack([torch.tensor(v) for v in values], dim=0)
        elif isinstance(first, torch.Tensor):
            output[name] = torch.stack(values, dim=0)
        elif isinstance(first, SparseTensor):
            output[name] = sparse_collate(values)
        else:
            output[name] = values
    return output
