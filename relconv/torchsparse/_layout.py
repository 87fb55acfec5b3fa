"""TorchSparse 2.1's kernel offsets and weight order, expressed as relconv kernels.

TorchSparse 2.1 (default kernel-map mode, built on the fly) reads, per axis, the input at
`o * s + lo + d` for kernel digit d = 0 .. k-1, with
- a submanifold conv (every stride 1): lo = -(k-1)/2 when the kernel volume is odd, lo = 0 when even;
- a strided conv: lo = -padding (its `Conv3d` sets padding (k-1)/2 on odd-sized stride-1 axes).
In its "hashmap" kernel-map mode lo = -((k-1) // 2) on every axis of every conv.
Its flat offset index runs x fastest for an odd kernel volume and z fastest for an even one
(MinkowskiEngine's order for odd kernels); relconv always runs z fastest, with per axis centred
offsets for odd sizes and 0 .. k-1 for even sizes.

An axis whose TorchSparse offsets are relconv's for the same size maps directly. Any other axis
(padding that does not centre an odd kernel, or an even kernel's padding above 0) runs on the
smallest relconv size whose offsets cover TorchSparse's, with zero weight on the offsets outside;
the result is exact and costs the extra offsets' work. Strided convs on bounded sites avoid that
cost: they run over a grid map in TorchSparse's own offsets (`grid_geometry`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor

Triple = tuple[int, int, int]
MAX_RELCONV_SIZE = 7


def relconv_axis_offsets(k: int) -> range:
    return range(-(k // 2), k // 2 + 1) if k % 2 else range(0, k)


def torchsparse_lows(kernel_size: Triple, stride: Triple, padding: Triple, hashmap: bool = False) -> Triple:
    """Per axis the lowest input offset `lo` (in input-grid units) of TorchSparse's map
    (`hashmap`: its "hashmap" kernel-map mode, which centres every kernel at -(k-1)//2)."""
    if hashmap:
        return tuple(-((k - 1) // 2) for k in kernel_size)
    if stride == (1, 1, 1):
        odd = math.prod(kernel_size) % 2 == 1
        return tuple(-((k - 1) // 2) if odd else 0 for k in kernel_size)
    return tuple(-p for p in padding)


def _relconv_size(k: int, lo: int) -> int:
    hi = lo + k - 1
    if relconv_axis_offsets(k) == range(lo, hi + 1):
        return k
    odd = 2 * max(-lo, hi) + 1
    even = hi + 1 + (hi + 1) % 2 if lo >= 0 else None
    size = odd if even is None else min(odd, even)
    if size > MAX_RELCONV_SIZE:
        raise NotImplementedError(
            f"kernel offsets {lo}..{hi} on one axis (kernel size {k}, padding {-lo}) need a relconv "
            f"kernel of size {size} > {MAX_RELCONV_SIZE}; use a padding within the kernel"
        )
    return size


class Geometry(NamedTuple):
    """How a TorchSparse kernel runs as a relconv kernel of size `size`.

    The relconv weight is `W[r] = kernel[index[r]]`, index K (one past TorchSparse's last offset)
    standing for a zero row (`zero_row`); `index` None: the weight is `kernel` unchanged.
    """

    size: Triple
    index: tuple[int, ...] | None
    zero_row: bool


@functools.lru_cache(maxsize=256)
def torchsparse_lows_cached(kernel_size: Triple, stride: Triple, padding: Triple, hashmap: bool) -> Triple:
    return torchsparse_lows(kernel_size, stride, padding, hashmap)


def to_relconv(kernel: Tensor, geometry: Geometry, index: Tensor | None) -> Tensor:
    """relconv's weight from TorchSparse's `kernel`: one gather, differentiable (a single autograd
    node: on a CPU host a third of the host time of a permute-and-copy); `index` is
    `geometry.index` as an int64 tensor on the kernel's device (None when that is None)."""
    if geometry.index is None:
        return kernel
    if geometry.zero_row:
        kernel = F.pad(kernel, (0, 0, 0, 0, 0, 1))
    return kernel.index_select(0, index)


@functools.lru_cache(maxsize=256)
def offset_order(geometry: Geometry) -> tuple[int, ...] | None:
    """Where relconv's kernel has TorchSparse's offsets in another order (`geometry.index` a
    permutation): the relconv offset each row of TorchSparse's kernel holds, for
    `relconv.voxel.conv3d(..., offset_order=)`, which then takes the kernel as it is. None where the
    orders agree or the relconv kernel is larger (zero rows): the weight is converted."""
    index = geometry.index
    if index is None or geometry.zero_row or sorted(index) != list(range(len(index))):
        return None
    order = [0] * len(index)
    for r, j in enumerate(index):
        order[j] = r
    return tuple(order)


@functools.lru_cache(maxsize=256)
def grid_geometry(kernel_size: Triple) -> Geometry:
    """The weight of a strided conv run over a grid map (`relconv.voxel.grid_map.build_map`), whose
    relation r is the kernel digit (d0, d1, d2) with the first axis slowest: TorchSparse's offset d
    per axis is that digit (its input `o * s - padding + d` is the grid map's), so only the order
    of the offsets differs, x fastest for an odd kernel volume (see the top of this module)."""
    kx, ky, kz = kernel_size
    if (kx * ky * kz) % 2 == 0:
        return Geometry(kernel_size, None, False)
    index = tuple(dx + kx * (dy + ky * dz) for dx in range(kx) for dy in range(ky) for dz in range(kz))
    return Geometry(kernel_size, None if index == tuple(range(len(index))) else index, False)


@functools.lru_cache(maxsize=256)
def relconv_geometry(kernel_size: Triple, lows: Triple) -> Geometry:
    """The relconv kernel running TorchSparse's `kernel_size` kernel with per-axis lowest
    offsets `lows` (see `Geometry`)."""
    rk = tuple(_relconv_size(k, lo) for k, lo in zip(kernel_size, lows, strict=True))
    kx, ky, kz = kernel_size
    volume = kx * ky * kz
    odd = volume % 2 == 1
    index = []
    for ex in relconv_axis_offsets(rk[0]):
        for ey in relconv_axis_offsets(rk[1]):
            for ez in relconv_axis_offsets(rk[2]):
                dx, dy, dz = ex - lows[0], ey - lows[1], ez - lows[2]
                if not (0 <= dx < kx and 0 <= dy < ky and 0 <= dz < kz):
                    index.append(volume)
                elif odd:
                    index.append(dx + kx * (dy + ky * dz))
                else:
                    index.append((dx * ky + dy) * kz + dz)
    if index == list(range(volume)):
        return Geometry(rk, None, False)
    return Geometry(rk, tuple(index), volume in index)
