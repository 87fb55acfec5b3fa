"""VoxelTensor: sparse voxel features with integer coordinates and a shared kernel-map cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from relconv.voxel.kernel_map import MapCache, bounds, check_coords, make_packing
from relconv.voxel.utils import Triple, triple


class VoxelTensor:
    """Sparse voxels: features `[N, C]` at integer coordinates `[N, 4]` = (batch, x, y, z).

    Coordinates are in units of the finest grid; a tensor at tensor stride `s` has coordinates that
    are multiples of `s` per axis (batch column excepted). Coordinates may be negative. Every row
    must be a distinct (batch, x, y, z) site; `coalesce()` merges duplicates explicitly (kernel-map
    builders raise on them).

    Args:
        feats: [N, C] floating-point features.
        coords: [N, 4] integer coordinates (int32; int64 is converted after a range check).
        stride: tensor stride, an int or (sx, sy, sz).
    """

    __slots__ = ("feats", "coords", "stride", "cache")

    def __init__(
        self,
        feats: Tensor,
        coords: Tensor,
        stride: int | Sequence[int] = 1,
        cache: MapCache | None = None,
    ) -> None:
        if not isinstance(feats, Tensor):
            raise TypeError(f"feats must be a torch.Tensor, got {type(feats).__name__}")
        if feats.dim() != 2:
            raise ValueError(f"feats must have shape [N, C], got {tuple(feats.shape)}")
        if not feats.dtype.is_floating_point:
            raise TypeError(f"feats must be a floating-point tensor, got {feats.dtype}")
        coords = check_coords(coords)
        if coords.shape[0] != feats.shape[0]:
            raise ValueError(
                f"feats has {feats.shape[0]} rows but coords has {coords.shape[0]}; "
                "one coordinate row per feature row"
            )
        if coords.device != feats.device:
            raise ValueError(f"coords is on {coords.device} but feats is on {feats.device}")
        if coords.dtype != torch.int32:
            coords = _to_int32(coords)
        self.feats = feats
        self.coords = coords
        self.stride = triple(stride, "stride")
        if cache is None:
            cache = MapCache()
            cache.coords[self.stride] = coords
        self.cache = cache

    @classmethod
    def _trusted(cls, feats: Tensor, coords: Tensor, stride: Triple, cache: MapCache) -> VoxelTensor:
        """A tensor from parts relconv already validated (a layer's output, new features on the same
        sites): skips the argument checks, which cost more host time than a cached layer's launch."""
        out = cls.__new__(cls)
        out.feats, out.coords, out.stride, out.cache = feats, coords, stride, cache
        return out

    # ------------------------------------------------------------------ basics
    @property
    def device(self) -> torch.device:
        return self.feats.device

    @property
    def dtype(self) -> torch.dtype:
        return self.feats.dtype

    def __len__(self) -> int:
        return self.feats.shape[0]

    def __repr__(self) -> str:
        return (
            f"VoxelTensor(num_voxels={len(self)}, channels={self.feats.shape[1]}, stride={self.stride}, "
            f"dtype={self.dtype}, device={self.device})"
        )

    def batch_size(self) -> int:
        """1 + the largest batch index (one host synchronisation; 0 when empty)."""
        return int(self.coords[:, 0].max().item()) + 1 if len(self) else 0

    def replace_feature(self, feats: Tensor) -> VoxelTensor:
        """Same coordinates, stride and map cache with new features `[N, C']`."""
        if not isinstance(feats, Tensor) or feats.dim() != 2 or feats.shape[0] != self.feats.shape[0]:
            shape = tuple(feats.shape) if isinstance(feats, Tensor) else type(feats).__name__
            raise ValueError(f"feats must have shape [{len(self)}, C], got {shape}")
        if feats.device != self.device:
            raise ValueError(f"feats is on {feats.device} but the tensor is on {self.device}")
        if not feats.dtype.is_floating_point:
            raise TypeError(f"feats must be a floating-point tensor, got {feats.dtype}")
        return VoxelTensor._trusted(feats, self.coords, self.stride, self.cache)

    def to(self, *args, **kwargs) -> VoxelTensor:
        """`feats.to(...)`; coordinates follow the device. A new device starts a new map cache."""
        feats = self.feats.to(*args, **kwargs)
        if feats.device == self.device:
            return VoxelTensor(feats, self.coords, self.stride, cache=self.cache)
        return VoxelTensor(feats, self.coords.to(feats.device), self.stride)

    def same_coords(self, other: VoxelTensor) -> bool:
        """True when both tensors hold identical coordinate rows in the same order."""
        if self.coords is other.coords:
            return True
        return (
            self.stride == other.stride
            and self.coords.shape == other.coords.shape
            and self.coords.device == other.coords.device
            and bool(torch.equal(self.coords, other.coords))
        )

    def __add__(self, other: VoxelTensor) -> VoxelTensor:
        """Element-wise sum of features on the same coordinates."""
        if not isinstance(other, VoxelTensor):
            return NotImplemented
        _check_same_coords(self, other, "other")
        return self.replace_feature(self.feats + other.feats)

    # ------------------------------------------------------------------ duplicates
    def coalesce(self, reduce: str = "sum") -> VoxelTensor:
        """Merges rows with equal coordinates (`reduce` in sum/mean/amax/amin); sorts by coordinate."""
        if reduce not in ("sum", "mean", "amax", "amin"):
            raise ValueError(f"reduce must be one of sum, mean, amax, amin; got {reduce!r}")
        lo, hi = bounds(self.coords)
        packing = make_packing(lo, hi, (0, 0, 0))
        keys, inverse = torch.unique(packing.pack(self.coords), sorted=True, return_inverse=True)
        index = inverse.unsqueeze(1).expand_as(self.feats)
        feats = self.feats.new_zeros(keys.numel(), self.feats.shape[1])
        feats = feats.scatter_reduce(0, index, self.feats, reduce, include_self=False)
        return VoxelTensor(feats, packing.unpack(keys), self.stride)

    # ------------------------------------------------------------------ dense conversion
    def dense(
        self,
        spatial_shape: Sequence[int] | None = None,
        origin: Sequence[int] = (0, 0, 0),
        batch_size: int | None = None,
    ) -> Tensor:
        """Dense `[B, C, X, Y, Z]` with voxel (b, p) at `[b, :, (p - origin) / stride]`; empty = 0.

        `spatial_shape` defaults to the smallest grid holding every voxel. Raises ValueError when a
        voxel falls outside the grid (e.g. coordinates below `origin`).
        """
        origin_t = torch.tensor(tuple(origin), dtype=torch.int64, device=self.device)
        step = torch.tensor(self.stride, dtype=torch.int64, device=self.device)
        idx = torch.div(self.coords[:, 1:].long() - origin_t, step, rounding_mode="floor")
        b = self.coords[:, 0].long()
        if batch_size is None:
            batch_size = self.batch_size()
        if spatial_shape is None:
            spatial_shape = (idx.max(0).values + 1).tolist() if len(self) else [0, 0, 0]
        shape = tuple(int(s) for s in spatial_shape)
        if len(self):
            limit = torch.tensor(shape, device=self.device)
            if bool((idx < 0).any()) or bool((idx >= limit).any()) or int(b.max()) >= batch_size:
                raise ValueError(
                    f"voxels fall outside the dense grid (batch_size={batch_size}, spatial_shape={shape}, "
                    f"origin={tuple(origin)}); pass a larger spatial_shape or a smaller origin"
                )
        out = self.feats.new_zeros(batch_size, *shape, self.feats.shape[1])
        out = out.index_put((b, idx[:, 0], idx[:, 1], idx[:, 2]), self.feats)
        return out.permute(0, 4, 1, 2, 3)

    @classmethod
    def from_dense(
        cls, dense: Tensor, stride: int | Sequence[int] = 1, origin: Sequence[int] = (0, 0, 0)
    ) -> VoxelTensor:
        """Sites of `dense [B, C, X, Y, Z]` where any channel is non-zero, as a VoxelTensor."""
        if not isinstance(dense, Tensor) or dense.dim() != 5:
            raise ValueError(f"dense must have shape [B, C, X, Y, Z], got {getattr(dense, 'shape', dense)}")
        st = triple(stride, "stride")
        site = (dense != 0).any(1)
        b, x, y, z = site.nonzero(as_tuple=True)
        feats = dense.permute(0, 2, 3, 4, 1)[b, x, y, z]
        scale = torch.tensor(st, device=dense.device)
        org = torch.tensor(tuple(origin), device=dense.device)
        xyz = torch.stack([x, y, z], 1) * scale + org
        coords = torch.cat([b.unsqueeze(1), xyz], 1).to(torch.int32)
        return cls(feats, coords, st)


def cat(tensors: Sequence[VoxelTensor]) -> VoxelTensor:
    """Concatenates the features of tensors on the same coordinates (channel dimension)."""
    if not tensors:
        raise ValueError("tensors must be a non-empty sequence of VoxelTensor")
    first = tensors[0]
    for i, t in enumerate(tensors[1:], start=1):
        if not isinstance(t, VoxelTensor):
            raise TypeError(f"tensors[{i}] must be a VoxelTensor, got {type(t).__name__}")
        _check_same_coords(first, t, f"tensors[{i}]")
    return first.replace_feature(torch.cat([t.feats for t in tensors], 1))


def _check_same_coords(a: VoxelTensor, b: VoxelTensor, name: str) -> None:
    if not a.same_coords(b):
        raise ValueError(
            f"{name} has different coordinates ({len(b)} voxels, stride {b.stride}) than the first "
            f"operand ({len(a)} voxels, stride {a.stride}); element-wise ops need identical coords"
        )


def _to_int32(coords: Tensor) -> Tensor:
    if coords.numel():
        lo, hi = torch.aminmax(coords)
        if lo.item() < -(2**31) or hi.item() >= 2**31:
            raise ValueError(f"coords values must fit int32, got range [{lo.item()}, {hi.item()}]")
    return coords.to(torch.int32)
