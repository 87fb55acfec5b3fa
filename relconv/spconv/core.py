"""`SparseConvTensor` (spconv's sparse tensor), the records that layers share through it, and
`SparseModule`, the base of the modules that take the tensor itself.

A tensor holds features `[N, C]` at int32 indices `[N, ndim + 1]` = (batch, d0, .., d{ndim-1}) inside a
grid of `spatial_shape`. Its coordinates live in a `SiteSet`, shared by every tensor on the same sites
(`replace_feature`, submanifold layers, an inverse conv returning to earlier sites): the set keeps the
relconv map cache that serves relconv's submanifold maps, and the strided maps built
from it, so repeated layers over the same sites build nothing twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from relconv.core import RelationalMap
from relconv.spconv._missing import missing
from relconv.voxel import MapCache, VoxelTensor


def expand_nd(ndim: int, value: object, name: str = "value") -> list[int]:
    """An int or a length-`ndim` sequence -> list of `ndim` ints (spconv's `expand_nd`)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or {ndim} ints, got bool")
    if isinstance(value, (int, np.integer)):
        return [int(value)] * ndim
    if isinstance(value, Tensor):
        value = value.tolist()
    if isinstance(value, (Sequence, np.ndarray)) and len(value) == ndim:
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
            return [int(v) for v in value]
    raise TypeError(f"{name} must be an int or a sequence of {ndim} ints, got {value!r}")


# The smallest value each geometry argument of a conv or pool takes along an axis.
_GEOMETRY_LOWEST = {"kernel_size": 1, "stride": 1, "dilation": 1, "padding": 0, "output_padding": 0}


def check_geometry(**values: list[int]) -> None:
    """Raises ValueError naming the first geometry argument (`kernel_size=[...]`, ...) that falls
    below its smallest value along some axis."""
    for arg, per_axis in values.items():
        low = _GEOMETRY_LOWEST[arg]
        if min(per_axis) < low:
            raise ValueError(f"{arg} must be >= {low} along every axis, got {per_axis}")


class SiteSet:
    """One coordinate set: the user-facing `indices [N, ndim + 1]`, the relconv coordinates
    `coords [N, 4]` (2-D grids get a zero third axis), the relconv map cache that holds the
    submanifold maps, and the spconv-geometry maps built from these sites (`relconv.voxel.grid_map`),
    keyed by their geometry. `built`: the output sites of a relconv map builder, valid by
    construction, so no map built on them checks them again (`MapCache.add_built`)."""

    __slots__ = ("indices", "coords", "_cache", "maps", "built")

    def __init__(self, indices: Tensor, coords: Tensor | None = None, built: bool = False) -> None:
        self.indices = indices
        self.built = built
        if coords is None:
            if indices.shape[1] == 4:
                coords = indices.contiguous()  # the map builders read rows of 4
            else:
                pad = indices.new_zeros(indices.shape[0], 4 - indices.shape[1])
                coords = torch.cat([indices, pad], 1)
        self.coords = coords
        self._cache: MapCache | None = None
        self.maps: dict[tuple, object] = {}

    def voxel(self, features: Tensor) -> VoxelTensor:
        """`features` on these sites as a relconv VoxelTensor sharing the sites' map cache (the set
        keeps the cache only, not a tensor's features). The first call checks the coordinates and
        keeps the checked ones; later calls check only the features, whose checks VoxelTensor's
        constructor repeats (with its messages) when one fails."""
        cache = self._cache
        coords = None if cache is None else cache.coords.get((1, 1, 1))
        if coords is not None:
            if (
                isinstance(features, Tensor)
                and features.dim() == 2
                and features.shape[0] == coords.shape[0]
                and features.device == coords.device
                and features.dtype.is_floating_point
            ):
                return VoxelTensor._trusted(features, coords, (1, 1, 1), cache)
        voxel = VoxelTensor(features, self.coords, cache=cache)
        if cache is None and self.built:
            voxel.cache.add_built(voxel.coords, (1, 1, 1))
        self._cache = voxel.cache
        return voxel


@dataclass
class IndiceData:
    """What a layer stores under its `indice_key` (spconv's `IndiceData`): the sites on both sides,
    the geometry, and the relconv map (`rmap`: pairs (input row, output row, kernel offset) with
    offsets in spconv's flattening order, first kernel axis slowest)."""

    out_indices: Tensor
    indices: Tensor
    spatial_shape: list[int]
    out_spatial_shape: list[int]
    is_subm: bool
    ksize: list[int]
    stride: list[int]
    dilation: list[int]
    padding: list[int]
    algo: object = None
    rmap: RelationalMap | None = None
    in_sites: SiteSet | None = field(default=None, repr=False)
    out_sites: SiteSet | None = field(default=None, repr=False)
    voxel_num: object = None


def _spatial_shape(value: object) -> list[int]:
    if isinstance(value, Tensor):
        value = value.tolist()
    if not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"spatial_shape must be a sequence of ints, got {type(value).__name__}")
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError) as err:
        raise TypeError(f"spatial_shape must be a sequence of ints, got {value!r}") from err


class SparseConvTensor:
    """spconv's sparse tensor: `features [N, C]` at `indices [N, ndim + 1]` int32 (batch first).

    Args:
        features: [N, C] floating-point features.
        indices: [N, ndim + 1] int32, (batch, d0, .., d{ndim-1}), each inside `spatial_shape`.
        spatial_shape: the grid size per axis (ints, a numpy array or a tensor).
        batch_size: number of samples (> 0).
        grid, voxel_num, benchmark: accepted for spconv compatibility, unused.
        indice_dict: maps stored by `indice_key` (normally left None).
    """

    def __init__(
        self,
        features: Tensor,
        indices: Tensor,
        spatial_shape: Sequence[int],
        batch_size: int,
        grid: Tensor | None = None,
        voxel_num: Tensor | None = None,
        indice_dict: dict | None = None,
        benchmark: bool = False,
        permanent_thrust_allocator: bool = False,
        enable_timer: bool = False,
        force_algo: object = None,
    ) -> None:
        if not isinstance(features, Tensor) or features.dim() != 2:
            raise ValueError(f"features must be a 2-D tensor [N, C], got {_describe(features)}")
        if not isinstance(indices, Tensor) or indices.dim() != 2:
            raise ValueError(f"indices must be a 2-D tensor [N, ndim + 1], got {_describe(indices)}")
        if indices.dtype != torch.int32:
            raise TypeError(f"indices must be int32 (spconv's index type), got {indices.dtype}")
        shape = _spatial_shape(spatial_shape)
        if len(shape) != indices.shape[1] - 1:
            raise ValueError(
                f"spatial_shape has {len(shape)} axes but indices has {indices.shape[1]} columns; "
                "indices are (batch, d0, .., d{ndim-1}) with ndim = len(spatial_shape)"
            )
        if min(shape, default=1) < 1:
            raise ValueError(f"spatial_shape must be positive along every axis, got {shape}")
        if features.shape[0] != indices.shape[0]:
            raise ValueError(
                f"features has {features.shape[0]} rows but indices has {indices.shape[0]}; "
                "one index row per feature row"
            )
        if features.device != indices.device:
            raise ValueError(f"indices is on {indices.device} but features is on {features.device}")
        batch = int(batch_size.item() if isinstance(batch_size, Tensor) else batch_size)
        if batch < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self._features = features
        self._sites = SiteSet(indices)
        self.spatial_shape = shape
        self.batch_size = batch
        self.indice_dict = {} if indice_dict is None else indice_dict
        self.grid = grid
        self.voxel_num = voxel_num
        self.benchmark = benchmark
        self.benchmark_record: dict = {}
        self.thrust_allocator = None
        self.force_algo = force_algo
        self.int8_scale = None

    @classmethod
    def _make(
        cls, features: Tensor, sites: SiteSet, spatial_shape: list[int], batch_size: int, indice_dict: dict
    ) -> SparseConvTensor:
        """A tensor from parts a layer produced (already valid): no checks, the host cost of a layer."""
        out = cls.__new__(cls)
        out._features, out._sites, out.spatial_shape, out.batch_size = (
            features,
            sites,
            spatial_shape,
            batch_size,
        )
        out.indice_dict, out.grid, out.voxel_num, out.benchmark = indice_dict, None, None, False
        out.benchmark_record, out.thrust_allocator, out.force_algo, out.int8_scale = {}, None, None, None
        return out

    # ------------------------------------------------------------------ attributes
    @property
    def features(self) -> Tensor:
        return self._features

    @features.setter
    def features(self, value: Tensor) -> None:
        raise ValueError(
            "you can't set features directly, use 'x = x.replace_feature(new_features)' "
            "to make a new SparseConvTensor instead"
        )

    @property
    def indices(self) -> Tensor:
        return self._sites.indices

    @indices.setter
    def indices(self, value: Tensor) -> None:
        if value is not self._sites.indices:
            if not isinstance(value, Tensor) or value.dim() != 2 or value.dtype != torch.int32:
                raise ValueError(f"indices must be an int32 tensor [N, ndim + 1], got {_describe(value)}")
            self._sites = SiteSet(value)

    @property
    def ndim(self) -> int:
        return len(self.spatial_shape)

    @property
    def is_quantized(self) -> bool:
        return self._features.dtype == torch.qint8

    @property
    def spatial_size(self) -> int:
        return int(np.prod(self.spatial_shape))

    @property
    def sparity(self) -> float:
        """The fraction of grid cells holding a site (spconv's name, spelling kept)."""
        return self.indices.shape[0] / self.spatial_size / self.batch_size

    def __repr__(self) -> str:
        return f"SparseConvTensor[shape={self._features.shape}]"

    # ------------------------------------------------------------------ derived tensors
    def replace_feature(self, feature: Tensor) -> SparseConvTensor:
        """Same sites, shape, batch size and maps with new features `[N, C']`."""
        if (
            not isinstance(feature, Tensor)
            or feature.dim() != 2
            or feature.shape[0] != self._features.shape[0]
        ):
            raise ValueError(
                f"feature must have shape [{self._features.shape[0]}, C] (one row per index), "
                f"got {_describe(feature)}"
            )
        out = SparseConvTensor._make(
            feature, self._sites, self.spatial_shape, self.batch_size, self.indice_dict
        )
        out.grid, out.voxel_num, out.benchmark = self.grid, self.voxel_num, self.benchmark
        out.benchmark_record, out.force_algo, out.int8_scale = (
            self.benchmark_record,
            self.force_algo,
            self.int8_scale,
        )
        return out

    def shadow_copy(self) -> SparseConvTensor:
        """A new tensor with every member shared."""
        return self.replace_feature(self._features)

    def select_by_index(self, valid_indices: Tensor) -> SparseConvTensor:
        """The rows `valid_indices` (new sites: the stored maps are dropped)."""
        out = self.shadow_copy()
        out._sites = SiteSet(self.indices[valid_indices])
        out._features = self._features[valid_indices]
        out.indice_dict = {}
        return out

    def minus(self) -> SparseConvTensor:
        return self.replace_feature(-self._features)

    def dequantize(self) -> SparseConvTensor:
        return self.replace_feature(self._features.dequantize())

    def q_scale(self) -> float:
        if self.is_quantized:
            return self._features.q_scale()
        raise ValueError("sparse tensor must be quantized")

    def find_indice_pair(self, key: str | None) -> IndiceData | None:
        """The map stored under `key`, or None."""
        if key is None:
            return None
        return self.indice_dict.get(key)

    @classmethod
    def from_dense(cls, x: Tensor) -> SparseConvTensor:
        """Sites of a channel-last dense tensor `[B, *spatial, C]` where any channel is non-zero."""
        if not isinstance(x, Tensor) or x.dim() < 3:
            raise ValueError(f"x must be a channel-last dense tensor [B, *spatial, C], got {_describe(x)}")
        x_sp = x.to_sparse(x.dim() - 1)
        indices = x_sp.indices().permute(1, 0).contiguous().int()
        return cls(x_sp.values(), indices, list(x_sp.shape[1:-1]), x_sp.shape[0])

    def dense(self, channels_first: bool = True) -> Tensor:
        """Dense `[B, C, *spatial_shape]` (or `[B, *spatial_shape, C]`); empty sites are zero."""
        idx = self.indices.to(self._features.device).long()
        out = self._features.new_zeros(self.batch_size, *self.spatial_shape, self._features.shape[1])
        out = out.index_put(tuple(idx.t()), self._features)
        if not channels_first:
            return out
        ndim = len(self.spatial_shape)
        return out.permute(0, ndim + 1, *range(1, ndim + 1)).contiguous()

    # ------------------------------------------------------------------ arithmetic
    def _other_features(self, other: object) -> Tensor:
        if isinstance(other, SparseConvTensor):
            return other.features
        if isinstance(other, Tensor):
            return other
        raise TypeError(f"can only add a SparseConvTensor or a Tensor, got {type(other).__name__}")

    def __add__(self, other: SparseConvTensor | Tensor) -> SparseConvTensor:
        return self.replace_feature(self._features + self._other_features(other))

    __radd__ = __add__

    def __iadd__(self, other: SparseConvTensor | Tensor) -> SparseConvTensor:
        self._features += self._other_features(other)
        return self

    def __getattr__(self, name: str):
        # Only reached for names the tensor does not have: spconv internals the shim leaves out.
        if name.startswith("__"):
            raise AttributeError(name)
        raise missing("spconv.pytorch.SparseConvTensor", name)


def _describe(t: object) -> str:
    return f"shape {tuple(t.shape)} ({t.dtype})" if isinstance(t, Tensor) else type(t).__name__


def __getattr__(name: str):
    raise missing("spconv.pytorch.core", name)


class SparseModule(nn.Module):
    """Base of the modules that take a SparseConvTensor (SparseSequential passes them the tensor,
    every other module its features)."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__()
        self.name = name
        self._sparse_unique_name = ""
