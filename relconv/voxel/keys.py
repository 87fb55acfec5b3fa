"""Packing (batch, x, y, z) coordinates into sortable non-negative int64 keys.

Kernel maps and voxelisation compare coordinates through keys instead of hash tables: a key is
`((b * Sx + x') * Sy + y') * Sz + z'` with `x' = x - lo_x` etc., where `lo` is the per-call minimum
minus a margin and `S` the per-axis span plus the margin on both sides. Because every shifted field
stays in `[0, S)` for all coordinates a call can form (inputs, outputs and input + kernel offset),
adding an offset's key delta to a key is the key of the offset coordinate: no carries, no aliasing.
Negative coordinates are therefore accepted everywhere (the shift makes them non-negative); only
scenes whose packed span exceeds 62 bits are rejected, before any key is formed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Keys stay below 2^62 so that key + (positive or negative) offset delta never overflows int64.
_MAX_KEY_BITS = 62


def check_coords(coords: object, name: str = "coords") -> Tensor:
    """Validates an integer `[N, 4]` (batch, x, y, z) coordinate tensor and returns it unchanged.

    Raises TypeError for a non-tensor or a non-integer dtype, ValueError for a wrong shape or a
    negative batch index (batch indices are sample ids, never shifted).
    """
    if not isinstance(coords, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(coords).__name__}")
    if coords.dtype.is_floating_point or coords.dtype.is_complex or coords.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (int32), got {coords.dtype}")
    if coords.dim() != 2 or coords.shape[1] != 4:
        raise ValueError(f"{name} must have shape [N, 4] = (batch, x, y, z), got {tuple(coords.shape)}")
    return coords


@dataclass(frozen=True)
class KeyPacking:
    """Per-call packing: `key = sum_a (c_a - lo[a]) * mult[a]` over columns (batch, x, y, z)."""

    lo: tuple[int, int, int, int]
    span: tuple[int, int, int, int]

    @property
    def mult(self) -> tuple[int, int, int, int]:
        sz = self.span[3]
        sy = self.span[2] * sz
        sx = self.span[1] * sy
        return (sx, sy, sz, 1)

    def pack(self, coords: Tensor) -> Tensor:
        """[N, 4] integer coordinates -> [N] int64 keys (order = lexicographic (b, x, y, z))."""
        c = coords.long()
        lo = torch.tensor(self.lo, dtype=torch.int64, device=c.device)
        mult = torch.tensor(self.mult, dtype=torch.int64, device=c.device)
        return ((c - lo) * mult).sum(1)

    def unpack(self, keys: Tensor) -> Tensor:
        """[N] int64 keys -> [N, 4] int32 coordinates."""
        cols = []
        rest = keys
        for mult, lo in zip(self.mult, self.lo, strict=True):
            q = torch.div(rest, mult, rounding_mode="floor")
            rest = rest - q * mult
            cols.append(q + lo)
        return torch.stack(cols, 1).to(torch.int32)

    def delta(self, offsets: Tensor) -> Tensor:
        """[K, 3] spatial offsets -> [K] int64 key deltas (valid because fields never carry)."""
        mult = torch.tensor(self.mult[1:], dtype=torch.int64, device=offsets.device)
        return (offsets.long() * mult).sum(1)


def bounds(coords: Tensor) -> tuple[list[int], list[int]]:
    """Per-column min and max of `[N, 4]` coordinates (one host synchronisation)."""
    if coords.shape[0] == 0:
        return [0, 0, 0, 0], [0, 0, 0, 0]
    lo, hi = torch.aminmax(coords.long(), dim=0)
    both = torch.stack([lo, hi]).tolist()
    return both[0], both[1]


def make_packing(lo: list[int], hi: list[int], margin: tuple[int, int, int]) -> KeyPacking:
    """Packing for coordinates in `[lo - margin, hi + margin]` per spatial axis.

    Raises ValueError (naming `coords`) when the batch index is negative or the packed span would
    need more than 62 bits, i.e. when keys could alias.
    """
    if lo[0] < 0:
        raise ValueError(f"coords batch indices (column 0) must be non-negative, got min {lo[0]}")
    for a in range(3):
        if lo[a + 1] - margin[a] < -(2**31) or hi[a + 1] + margin[a] >= 2**31:
            raise ValueError(
                f"coords axis {'xyz'[a]} range [{lo[a + 1]}, {hi[a + 1]}] plus kernel reach {margin[a]} "
                "leaves the int32 coordinate range"
            )
    lo_s = [0] + [lo[a + 1] - margin[a] for a in range(3)]
    span = [hi[0] + 1] + [hi[a + 1] - lo[a + 1] + 2 * margin[a] + 1 for a in range(3)]
    total = 1
    for s in span:
        total *= s
    if total >= 2**_MAX_KEY_BITS:
        raise ValueError(
            f"coords span too large to pack into 62-bit keys without aliasing: batch size {span[0]}, "
            f"extent (x, y, z) = {tuple(span[1:])} including kernel reach {tuple(margin)}; "
            "use a coarser voxel size or split the scene"
        )
    return KeyPacking(tuple(lo_s), tuple(span))
