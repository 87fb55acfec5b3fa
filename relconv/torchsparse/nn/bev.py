"""TorchSparse's `ToDenseBEVConvolution` and `ToBEVHeightCompression`: sparse voxels -> a dense
bird's-eye-view feature map.

Both index like TorchSparse 2.1: `dim` and the BEV axes select entries of `shape` and of the tensor
stride over (x, y, z), but columns of the batch-first coordinates (so the default dim=1 reads column
1, x, as the height, and columns 0 and 2 as the BEV cell)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from relconv.torchsparse.tensor import SparseTensor
from relconv.voxel.utils import small_constant

__all__ = ["ToBEVHeightCompression", "ToDenseBEVConvolution"]


class ToDenseBEVConvolution(nn.Module):
    """Each voxel's features times the kernel of its height slice, summed per BEV cell.

    Args:
        in_channels, out_channels: C_in, C_out.
        shape: (X, Y, Z) grid extent (in units of the input's tensor stride along `dim`).
        offset: subtracted from (x, y, z) before indexing.
        dim: the height axis (see the module docstring for TorchSparse's column indexing).
        bias: learnable `[1, C_out]` bias.
    Forward: SparseTensor -> dense `[B, C_out, A, B']` over the two remaining axes of `shape`.
    State: `kernel [shape[dim], C_in, C_out]`, `bias`, buffers `offset [1, 4]` and `shape [3]`, as
    TorchSparse's.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        shape: Sequence[int] | Tensor,
        offset: Sequence[int] = (0, 0, 0),
        dim: int = 1,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        _register_geometry(self, shape, offset, dim)
        self.n_kernels = int(self.shape[dim])
        self.kernel = nn.Parameter(torch.zeros(self.n_kernels, in_channels, out_channels))
        self.bias = nn.Parameter(torch.zeros(1, out_channels)) if bias else 0
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, out_channels={self.out_channels}, n_kernels={self.n_kernels}"

    def reset_parameters(self) -> None:
        std = 1.0 / math.sqrt(self.in_channels)
        with torch.no_grad():
            self.kernel.uniform_(-std, std)

    def forward(self, input: SparseTensor) -> Tensor:
        if not isinstance(input, SparseTensor):
            raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
        coords, feats = input.coords, input.feats
        step = input.stride[self.dim]
        height = torch.div(coords[:, self.dim].long(), step, rounding_mode="trunc")
        c = (coords - self.offset).t()[[0, *self.bev_dims]].long()
        c[1:] = torch.div(c[1:], step, rounding_mode="trunc")
        sizes = (int(self.bev_shape[0]), int(self.bev_shape[1]))
        # The kernel's slice is checked with the cells: both index tensors before any lookup.
        batch_size = _batch_size(torch.cat([c, height[None]]), (*sizes, self.n_kernels), type(self).__name__)
        kernel = self.kernel.index_select(0, height)
        out = torch.bmm(feats.unsqueeze(1), kernel.to(feats.dtype)).squeeze(1) + self.bias
        return _dense_bev(out, c, sizes, batch_size)


class ToBEVHeightCompression(nn.Module):
    """Stacks the height slices of each BEV cell into channels: a dense `[B, Z * C, A, B']` map whose
    channel `z * C + c` holds channel c of the voxel at height z (voxels sharing a cell and height are
    summed; heights outside [0, Z) are clamped to its ends, as TorchSparse does).

    Args:
        channels: C, the input's channels.
        shape: (X, Y, Z) grid extent (in units of the input's tensor stride), Z = shape[dim].
        offset: subtracted from (x, y, z) before indexing.
        dim: the height axis (see the module docstring for TorchSparse's column indexing).
    State: buffers `offset [1, 4]` and `shape [3]`, as TorchSparse's.
    """

    def __init__(
        self,
        channels: int,
        shape: Sequence[int] | Tensor,
        offset: Sequence[int] = (0, 0, 0),
        dim: int = 1,
    ) -> None:
        super().__init__()
        self.channels = channels
        _register_geometry(self, shape, offset, dim)

    def extra_repr(self) -> str:
        return f"channels={self.channels}"

    def forward(self, input: SparseTensor) -> Tensor:
        if not isinstance(input, SparseTensor):
            raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
        coords, feats = input.coords, input.feats
        if feats.shape[1] != self.channels:
            raise ValueError(f"input has {feats.shape[1]} channels, the module {self.channels}")
        axes = [*self.bev_dims, self.dim]
        c = (coords - self.offset).t()[[0, *axes]].long()
        step = small_constant([input.stride[i] for i in axes], c.device).unsqueeze(1)
        c[1:] = torch.div(c[1:], step, rounding_mode="trunc")
        height = int(self.shape[self.dim])
        c[3] = c[3].clamp(0, height - 1)
        sizes = (int(self.bev_shape[0]), int(self.bev_shape[1]), height)
        # [B, A, B', Z, C] viewed as [B, A, B', Z * C]: height z's C channels at z * C.
        return _dense_bev(feats, c, sizes, _batch_size(c, sizes, type(self).__name__))


def _register_geometry(module: nn.Module, shape, offset, dim: int) -> None:
    """The `offset`, `shape` buffers and the height / BEV axes both BEV modules share."""
    if dim not in (0, 1, 2):
        raise ValueError(f"dim must be 0, 1 or 2, got {dim!r}")
    if len(offset) != 3:
        raise ValueError(f"offset must have 3 values, got {offset!r}")
    module.register_buffer("offset", torch.tensor([[*offset, 0]], dtype=torch.int32))
    shape_t = shape.int() if isinstance(shape, Tensor) else torch.tensor(list(shape), dtype=torch.int32)
    if shape_t.numel() != 3:
        raise ValueError(f"shape must have 3 values, got {shape!r}")
    module.register_buffer("shape", shape_t)
    module.dim = dim
    module.bev_dims = [i for i in range(3) if i != dim]
    module.bev_shape = shape_t[module.bev_dims]


def _batch_size(c: Tensor, sizes: tuple[int, ...], name: str) -> int:
    """1 + the largest batch index of `c = [batch, i0, i1, ...]` (`[1 + len(sizes), N]`), after
    checking every index against its extent in `sizes`: one host sync, and a ValueError for a voxel
    outside the grid instead of an out-of-bounds index."""
    if c.shape[1] == 0:
        raise ValueError(f"{name}: the input has no voxels")
    bounds = small_constant(sizes, c.device).unsqueeze(1)
    outside = ((c[1:] < 0) | (c[1:] >= bounds)).any() | (c[0] < 0).any()
    batch_size, bad = torch.stack([c[0].max() + 1, outside.long()]).tolist()
    if bad:
        raise ValueError(
            f"{name}: a voxel falls outside the grid {sizes} (BEV cell, then height; after offset and stride)"
        )
    return batch_size


def _dense_bev(values: Tensor, c: Tensor, sizes: tuple[int, ...], batch_size: int) -> Tensor:
    """`values [N, C]` summed into a dense `[B, *sizes, C]` at the rows of `c = [batch, i0, ...]`
    (checked by `_batch_size`), returned as `[B, prod(sizes[2:]) * C, sizes[0], sizes[1]]`."""
    flat = c[0]
    for i, n in enumerate(sizes):
        flat = flat * n + c[1 + i]
    dense = values.new_zeros(batch_size * math.prod(sizes), values.shape[1]).index_add_(0, flat, values)
    return dense.view(batch_size, sizes[0], sizes[1], -1).permute(0, 3, 1, 2).contiguous()
