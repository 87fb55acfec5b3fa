"""TorchSparse 2.1's `SparseTensor` on relconv's `VoxelTensor`.

TorchSparse 2.1 keeps coordinates in units of the tensor's own grid: a tensor at tensor stride
(2, 2, 2) holds `floor(p / 2)`, not `floor(p / 2) * 2` as relconv does. A `SparseTensor` shows
TorchSparse's coordinates (`coords`, `C`) and runs layers on a `VoxelTensor` whose coordinates are
those times the stride; both are kept per tensor stride in the shared `TensorCache`, so neither is
recomputed while a network runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from relconv.voxel import MapCache, VoxelTensor
from relconv.voxel.utils import small_constant

__all__ = [
    "SparseTensor",
    "TensorCache",
    "get_allow_negative_coordinates",
    "set_allow_negative_coordinates",
]

# TorchSparse's module-level switch (torchsparse.tensor.set_allow_negative_coordinates): it widens
# the lower bound of downsampled coordinates below 0. A one-element list, read at call time.
_ALLOW_NEGATIVE = [False]


def get_allow_negative_coordinates() -> bool:
    return _ALLOW_NEGATIVE[0]


def set_allow_negative_coordinates(allow_negative_coordinates: bool) -> None:
    _ALLOW_NEGATIVE[0] = bool(allow_negative_coordinates)


def make_ntuple(x: Any, ndim: int, name: str = "value") -> tuple:
    """An int, list, tuple or tensor -> a tuple of `ndim` ints (TorchSparse's `make_ntuple`)."""
    if isinstance(x, bool):
        raise TypeError(f"{name} must be an int or {ndim} ints, got bool")
    if isinstance(x, int):
        return (x,) * ndim
    if isinstance(x, Tensor):
        x = x.reshape(-1).tolist()
    if (
        isinstance(x, (list, tuple))
        and len(x) == ndim
        and all(isinstance(v, int) and not isinstance(v, bool) for v in x)
    ):
        return tuple(x)
    raise TypeError(f"{name} must be an int or a sequence of {ndim} ints, got {x!r}")


class TensorCache:
    """Maps and coordinates shared by every tensor derived from one input (TorchSparse's
    `TensorCache`).

    `cmaps[stride]` = (coordinates, spatial_range) of each tensor stride reached, as TorchSparse
    fills it (a transposed conv returns to these); `kmaps[(stride, kernel_size, conv_stride,
    dilation)]` = the downsampling record of each strided conv geometry (`DownsampleRecord`);
    `hashmaps` exists for code that reads it and stays empty. `voxel` is relconv's `MapCache`
    holding the kernel maps, and `pairs[stride]` = (TorchSparse coordinates, relconv coordinates)
    of the same sites.
    """

    def __init__(self) -> None:
        self.cmaps: dict[tuple, tuple[Tensor, tuple | None]] = {}
        self.kmaps: dict[tuple, Any] = {}
        self.hashmaps: dict[tuple, Any] = {}
        self.voxel = MapCache()
        self.pairs: dict[tuple, tuple[Tensor, Tensor]] = {}


class SparseTensor:
    """Sparse voxels: `feats [N, C]` at int32 `coords [N, 4]` = (batch, x, y, z) in units of the
    tensor stride `stride` (TorchSparse 2.1's layout).

    Args:
        feats: [N, C] features.
        coords: [N, 4] int32 coordinates (a per-sample [N, 3] array is fine before
            `sparse_collate` adds the batch column).
        stride: tensor stride, an int or 3 ints.
        spatial_range: optional (batch_size, X, Y, Z) grid extent; `dense()` needs it, and strided
            convs bound their output coordinates by it.
    """

    def __init__(
        self,
        feats: Tensor,
        coords: Tensor,
        stride: int | Sequence[int] = 1,
        spatial_range: int | Sequence[int] | None = None,
    ) -> None:
        self.feats = feats
        self._coords = coords
        self._stride = make_ntuple(stride, 3, "stride")
        self.spatial_range = None if spatial_range is None else _range_tuple(spatial_range)
        self._caches = TensorCache()
        self._base: VoxelTensor | None = None

    @classmethod
    def _from_voxel(
        cls,
        vt: VoxelTensor,
        coords: Tensor | None,
        spatial_range: tuple | None,
        caches: TensorCache,
    ) -> SparseTensor:
        """A layer's output: relconv's tensor `vt` with its TorchSparse coordinates (`coords`, or
        None to derive them from vt's on first read)."""
        out = cls.__new__(cls)
        out.feats, out._coords, out._stride = vt.feats, coords, vt.stride
        out.spatial_range, out._caches, out._base = spatial_range, caches, vt
        return out

    def _like(self, feats: Tensor) -> SparseTensor:
        """New features on the same sites, sharing the cache (TorchSparse's `fapply`)."""
        out = SparseTensor.__new__(SparseTensor)
        out.feats, out._coords, out._stride = feats, self._coords, self._stride
        out.spatial_range, out._caches, out._base = self.spatial_range, self._caches, self._base
        return out

    # ------------------------------------------------------------------ TorchSparse's attributes
    @property
    def coords(self) -> Tensor:
        if self._coords is None:
            base = self._base
            step = small_constant((1, *base.stride), base.coords.device, base.coords.dtype)
            self._coords = torch.div(base.coords, step, rounding_mode="floor")
        return self._coords

    @coords.setter
    def coords(self, coords: Tensor) -> None:
        self._coords, self._base = coords, None

    @property
    def stride(self) -> tuple[int, int, int]:
        return self._stride

    @stride.setter
    def stride(self, stride: int | Sequence[int]) -> None:
        self._stride, self._base = make_ntuple(stride, 3, "stride"), None

    F = property(lambda self: self.feats, lambda self, v: setattr(self, "feats", v), doc="feats")
    C = property(lambda self: self.coords, lambda self, v: setattr(self, "coords", v), doc="coords")
    s = property(lambda self: self.stride, lambda self, v: setattr(self, "stride", v), doc="stride")

    def __repr__(self) -> str:
        shape = tuple(self.feats.shape) if isinstance(self.feats, Tensor) else type(self.feats).__name__
        return f"SparseTensor(feats={shape}, stride={self.stride}, spatial_range={self.spatial_range})"

    # ------------------------------------------------------------------ moves (in place, as TorchSparse)
    def _moved(self, coords: Tensor, feats: Tensor) -> SparseTensor:
        if coords.device != self.coords.device:
            self._caches = TensorCache()  # maps live on one device
        self._coords, self.feats, self._base = coords, feats, None
        return self

    def cpu(self) -> SparseTensor:
        return self._moved(self.coords.cpu(), self.feats.cpu())

    def cuda(self, device: Any = None) -> SparseTensor:
        return self._moved(self.coords.cuda(device), self.feats.cuda(device))

    def to(self, device: Any, non_blocking: bool = True) -> SparseTensor:
        return self._moved(
            self.coords.to(device, non_blocking=non_blocking),
            self.feats.to(device, non_blocking=non_blocking),
        )

    def half(self) -> SparseTensor:
        self.feats = self.feats.half()
        return self

    def detach(self) -> SparseTensor:
        self.feats = self.feats.detach()
        return self

    # ------------------------------------------------------------------ arithmetic and dense
    def __add__(self, other: SparseTensor) -> SparseTensor:
        if not isinstance(other, SparseTensor):
            return NotImplemented
        if other.feats.shape != self.feats.shape:
            raise ValueError(
                f"SparseTensor + SparseTensor needs features of equal shape on the same sites, "
                f"got {tuple(self.feats.shape)} and {tuple(other.feats.shape)}"
            )
        return self._like(self.feats + other.feats)

    def dense(self) -> Tensor:
        """Dense `[B, X, Y, Z, C]` (channels last) over `spatial_range`; voxel (b, x, y, z) at
        `[b, x, y, z]` in this tensor's own grid units; empty sites are 0."""
        if self.spatial_range is None:
            raise ValueError("dense() needs spatial_range (batch_size, X, Y, Z); set it on the tensor")
        if len(self.spatial_range) != 4:
            raise ValueError(
                f"dense() needs a spatial_range of 4 ints (batch, X, Y, Z), got {self.spatial_range}"
            )
        coords, feats = self.coords, self.feats
        rng = torch.tensor(self.spatial_range, device=coords.device)
        c = coords.long()
        if c.numel() and (bool((c < 0).any()) or bool((c >= rng).any())):
            raise ValueError(f"coords fall outside spatial_range {self.spatial_range}")
        out = feats.new_zeros(*self.spatial_range, feats.shape[1])
        return out.index_put((c[:, 0], c[:, 1], c[:, 2], c[:, 3]), feats)

    # ------------------------------------------------------------------ relconv side
    def _voxel(self) -> VoxelTensor:
        """The relconv tensor of these sites and features (built once per coordinate set)."""
        base = self._base
        if base is not None:
            return base if base.feats is self.feats else base.replace_feature(self.feats)
        coords = self.coords
        if not isinstance(coords, Tensor) or coords.dim() != 2 or coords.shape[1] != 4:
            what = tuple(coords.shape) if isinstance(coords, Tensor) else type(coords).__name__
            raise ValueError(f"coords must be a [N, 4] (batch, x, y, z) tensor to run a layer, got {what}")
        if not isinstance(self.feats, Tensor):
            raise TypeError(f"feats must be a torch.Tensor to run a layer, got {type(self.feats).__name__}")
        caches, stride = self._caches, self._stride
        known = caches.pairs.get(stride)
        if known is not None and _same(known[0], coords):
            fine = known[1]
        else:
            if known is not None:
                # Other coordinates than the cache holds at this stride: their own maps.
                caches = self._caches = TensorCache()
            fine = coords
            if stride != (1, 1, 1):
                step = small_constant((1, *stride), coords.device, coords.dtype)
                fine = coords * step
            vt = VoxelTensor(self.feats, fine, stride, cache=caches.voxel)
            fine = vt.coords  # int32
            caches.pairs[stride] = (coords, fine)
            caches.voxel.coords.setdefault(stride, fine)
            self._base = vt
            return vt
        self._base = VoxelTensor(self.feats, fine, stride, cache=caches.voxel)
        return self._base


class PointTensor:
    """TorchSparse's point container (SPVCNN's point branch): `F [N, C]`, `C [N, 4]` float
    coordinates and the `idx_query` / `weights` / `additional_features` dicts its users fill."""

    def __init__(
        self, feats: Tensor, coords: Tensor, idx_query: dict | None = None, weights: dict | None = None
    ):
        self.F, self.C = feats, coords
        self.idx_query = idx_query if idx_query is not None else {}
        self.weights = weights if weights is not None else {}
        self.additional_features: dict = {"idx_query": {}, "counts": {}}

    def cuda(self) -> PointTensor:
        self.F, self.C = self.F.cuda(), self.C.cuda()
        return self

    def detach(self) -> PointTensor:
        self.F, self.C = self.F.detach(), self.C.detach()
        return self

    def to(self, device: Any, non_blocking: bool = True) -> PointTensor:
        self.F = self.F.to(device, non_blocking=non_blocking)
        self.C = self.C.to(device, non_blocking=non_blocking)
        return self

    def __add__(self, other: PointTensor) -> PointTensor:
        out = PointTensor(self.F + other.F, self.C, self.idx_query, self.weights)
        out.additional_features = self.additional_features
        return out


def _same(a: Tensor, b: Tensor) -> bool:
    """Whether `b` holds the coordinates `a` (the same tensor; else, a copy of it: one comparison)."""
    if a is b:
        return True
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b))


def _range_tuple(spatial_range: Any) -> tuple:
    if isinstance(spatial_range, Tensor):
        spatial_range = spatial_range.reshape(-1).tolist()
    if not isinstance(spatial_range, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in spatial_range
    ):
        raise TypeError(
            f"spatial_range must be a sequence of positive ints (batch, X, Y, Z), got {spatial_range!r}"
        )
    return tuple(spatial_range)
