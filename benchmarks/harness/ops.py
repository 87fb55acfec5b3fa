"""The one table of voxel layer ops every suite, peer adapter and cross-check uses.

relconv's geometry: output sites q = floor(p / stride) * stride, out[q] = sum_k x[q + offset_k] W[k]
with odd kernels centred and even ones covering 0 .. k-1. `padding` is the same geometry in the
convention of spconv / TorchSparse++ (input i = o * stride - padding + kidx): (k - 1) / 2 for odd
kernels, 0 for even ones. "up2" is the 2^3 transposed conv back onto the fine sites of "down2".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VoxelOp:
    kernel: int
    stride: int
    transposed: bool

    @property
    def padding(self) -> int:
        return (self.kernel - 1) // 2 if self.kernel % 2 else 0

    @property
    def kernel_size(self) -> tuple[int, int, int]:
        return (self.kernel,) * 3


OPS = {
    "subm3": VoxelOp(3, 1, False),
    "down2": VoxelOp(2, 2, False),
    "down3": VoxelOp(3, 2, False),
    "up2": VoxelOp(2, 2, True),
}
