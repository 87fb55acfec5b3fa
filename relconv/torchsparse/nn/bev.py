"""TorchSparse's `ToDenseBEVConvolution`: sparse voxels -> a dense bird's-eye-view feature map."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from relconv.torchsparse.tensor import SparseTensor

__all__ = ["ToDenseBEVConvolution"]


class ToDenseBEVConvolution(nn.Module):
    """Each voxel's features times the kernel of its height slice, summed per BEV cell.

    Args:
        in_channels, out_channels: C_in, C_out.
        shape: (X, Y, Z) grid extent (in units of the input's tensor stride along `dim`).
        offset: subtracted from (x, y, z) before indexing.
        dim: the height axis. Indexing follows TorchSparse 2.1 exactly: `dim` and the BEV axes
            select entries of `shape` and of the stride over (x, y, z), but columns of the
            batch-first coordinates (so the default dim=1 reads column 1, x).
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
        if dim not in (0, 1, 2):
            raise ValueError(f"dim must be 0, 1 or 2, got {dim!r}")
        if len(offset) != 3:
            raise ValueError(f"offset must have 3 values, got {offset!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.register_buffer("offset", torch.tensor([[*offset, 0]], dtype=torch.int32))
        shape_t = shape.int() if isinstance(shape, Tensor) else torch.tensor(list(shape), dtype=torch.int32)
        if shape_t.numel() != 3:
            raise ValueError(f"shape must have 3 values, got {shape!r}")
        self.register_buffer("shape", shape_t)
        self.dim = dim
        self.n_kernels = int(self.shape[dim])
        self.bev_dims = [i for i in range(3) if i != dim]
        self.bev_shape = self.shape[self.bev_dims]
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
        kernel = self.kernel.index_select(0, height)
        out = torch.bmm(feats.unsqueeze(1), kernel.to(feats.dtype)).squeeze(1) + self.bias
        c = (coords - self.offset).t()[[0, *self.bev_dims]].long()
        c[1:] = torch.div(c[1:], step, rounding_mode="trunc")
        a, b = int(self.bev_shape[0]), int(self.bev_shape[1])
        cells = c[0] * (a * b) + c[1] * b + c[2]
        batch_size = int(c[0].max()) + 1
        dense = out.new_zeros(batch_size * a * b, out.shape[1]).index_add_(0, cells, out)
        return dense.view(batch_size, a, b, -1).permute(0, 3, 1, 2).contiguous()
