"""TorchSparse's `torchsparse.nn.utils`: `fapply` and `get_kernel_offsets`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from relconv.torchsparse.tensor import SparseTensor, make_ntuple

__all__ = ["fapply", "get_kernel_offsets"]


def fapply(input: SparseTensor, fn: Callable[..., Tensor], *args, **kwargs) -> SparseTensor:
    """`fn(input.feats, ...)` on the same sites, stride, spatial_range and cache."""
    if not isinstance(input, SparseTensor):
        raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
    return input._like(fn(input.feats, *args, **kwargs))


def get_kernel_offsets(
    size: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    dilation: int | Sequence[int] = 1,
    device: torch.device | str = "cpu",
) -> Tensor:
    """[K, 3] int32 offsets in TorchSparse's order: per axis `(-k) // 2 + 1 .. k // 2` times
    stride * dilation; x fastest for an odd kernel volume, z fastest for an even one."""
    size = make_ntuple(size, 3, "size")
    stride = make_ntuple(stride, 3, "stride")
    dilation = make_ntuple(dilation, 3, "dilation")
    axes = [
        [v * stride[a] * dilation[a] for v in range((-size[a]) // 2 + 1, size[a] // 2 + 1)] for a in range(3)
    ]
    if (size[0] * size[1] * size[2]) % 2 == 1:
        offsets = [(x, y, z) for z in axes[2] for y in axes[1] for x in axes[0]]
    else:
        offsets = [(x, y, z) for x in axes[0] for y in axes[1] for z in axes[2]]
    return torch.tensor(offsets, dtype=torch.int32, device=device).reshape(-1, 3)
