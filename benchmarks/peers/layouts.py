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

TorchSparse++ 2.1: `Conv3d.kernel` [K, C_in, C_out]; 1x1x1 convs hold [C_in, C_out]. Per-axis
offsets as relconv's (odd centred, even 0 .. k-1: torchsparse/nn/utils/kernel.py and the map
builders in backend/others/sparsemapping_cuda.cu, whose downsampling map stores offset index
K - 1 - j, i.e. the same per-axis digit). The flattening order depends on the kernel volume, for
MinkowskiEngine compatibility: an odd volume runs x fastest and z slowest (the reverse of relconv),
an even volume x slowest and z fastest (relconv's). A transposed conv reuses its strided conv's
map with the same indices.

All four claims are checked numerically before every timed layer (bench.run_case): a wrong order
shows up as a "mismatch" row, never as a time. The conversions are `relconv.convert.convert_weight`.
"""

from __future__ import annotations

import torch

from relconv.convert import convert_weight


def to_spconv(weight: torch.Tensor, kernel_size: tuple[int, int, int]) -> torch.Tensor:
    """relconv [K, C_in, C_out] -> spconv [C_out, kx, ky, kz, C_in]."""
    return convert_weight(weight, "relconv", "spconv", kernel_size)


def to_warpconvnet(weight: torch.Tensor) -> torch.Tensor:
    """relconv [K, C_in, C_out] -> WarpConvNet [K, C_in, C_out] (identical order)."""
    return weight.contiguous()


def to_torchsparse(weight: torch.Tensor, kernel_size: tuple[int, int, int]) -> torch.Tensor:
    """relconv [K, C_in, C_out] -> TorchSparse++ `Conv3d.kernel` [K, C_in, C_out] (or [C_in, C_out]
    for a 1x1x1 kernel, which TorchSparse++ runs as a plain matmul)."""
    return convert_weight(weight, "relconv", "torchsparse", kernel_size)
