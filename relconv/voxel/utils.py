"""Argument normalisation, module access and small device constants shared by the voxel front end
and the shims."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor, nn

Triple = tuple[int, int, int]


def triple(value: int | Sequence[int], name: str, minimum: int = 1) -> Triple:
    """An int or a length-3 sequence of ints -> (x, y, z); raises naming `name` otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or 3 ints, got bool")
    if isinstance(value, int):
        vals = (value, value, value)
    elif (
        isinstance(value, Sequence)
        and len(value) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        vals = tuple(value)
    else:
        raise TypeError(f"{name} must be an int or a sequence of 3 ints, got {value!r}")
    if min(vals) < minimum:
        raise ValueError(f"{name} must be >= {minimum} along every axis, got {vals}")
    return vals  # type: ignore[return-value]


def registered(module: nn.Module, name: str):
    """`getattr(module, name)` for a parameter or buffer, read from the module's registries: plain
    attribute access on a module runs nn.Module.__getattr__, a Python frame (~0.4 us on a fast host),
    and the per-call paths of the voxel layers read several. Anything not registered there (a
    parametrized or reassigned attribute) comes through getattr."""
    params = module._parameters
    if name in params:
        return params[name]
    buffers = module._buffers
    if name in buffers:
        return buffers[name]
    return getattr(module, name)


def small_constant(values: Sequence[int], device: torch.device, dtype: torch.dtype = torch.int64) -> Tensor:
    """A small integer constant on `device`, for reading only. A CUDA one is made once per
    (values, device, dtype, stream) and reused: making one takes a pinned host block, its event and an
    asynchronous copy (a copy from pageable memory would wait for the GPU), 60-90 us of host time on
    an H200 host, and a strided conv of the compatibility layers reads several per call. Keyed by the
    current stream, a constant is read only behind its own copy. While a CUDA graph is captured a
    constant is made afresh: a captured copy fills it only when the graph replays."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    if torch.cuda.is_current_stream_capturing():
        return _to_cuda(values, device, dtype)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _kept_constant(tuple(values), device, dtype, torch.cuda.current_stream(device).cuda_stream)


def _to_cuda(values: Sequence[int], device: torch.device, dtype: torch.dtype) -> Tensor:
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


@functools.lru_cache(maxsize=256)
def _kept_constant(values: tuple, device: torch.device, dtype: torch.dtype, stream: int) -> Tensor:
    return _to_cuda(values, device, dtype)
