"""Weight layouts of relconv and the voxel peers, and conversion from relconv's.

relconv (relconv/voxel/conv.py): weight [K, C_in, C_out]; offset k = (ix * ky + iy) * kz + iz (x slowest,
z fastest over the coordinate columns (x, y, z)); per axis odd sizes cover -(k-1)/2 .. (k-1)/2 and
even sizes 0 .. k-1; out[q] = sum_k x[q + offset_k * tensor_stride] @ W[k], q = floor(p / s) * s.

WarpConvNet: weight [K, C_in, C_out]; offsets from a meshgrid with "ij" indexing over (x, y, z), odd
sizes centred and even sizes starting at 0 (kernel_offsets_from_size): the same order, so the weight
is copied unchanged.

spconv 2.x: weight [C_out, kx, ky, kz, C_in] ("KRSC"), kernel axes in the order of the index columns
1..3, which we fill with (x, y, z). Input i = o * s - padding + kidx * dilation, so with padding
(k - 1) / 2 for odd sizes (submanifold, or stride 2 with padding 1) and 0 for even strided sizes the
kernel index kidx is relconv's offset + (k - 1) // 2 per axis: the same flattening order. An
inverse conv (SparseInverseConv3d) reuses its strided conv's pairs with the same kidx.

All three claims are checked numerically before every timed layer (bench.run_case): a wrong order
shows up as a "mismatch" row, never as a time.
"""

from __future__ import annotations

import torch


def to_spconv(weight: torch.Tensor, kernel_size: tuple[int, int, int]) -> torch.Tensor:
    """relconv [K, C_in, C_out] -> spconv [C_out, kx, ky, kz, C_in]."""
    k, c_in, c_out = weight.shape
    return weight.reshape(*kernel_size, c_in, c_out).permute(4, 0, 1, 2, 3).contiguous()


def to_warpconvnet(weight: torch.Tensor) -> torch.Tensor:
    """relconv [K, C_in, C_out] -> WarpConvNet [K, C_in, C_out] (identical order)."""
    return weight.contiguous()
