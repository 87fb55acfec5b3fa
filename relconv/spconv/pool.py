"""spconv's sparse pooling: window max / average over the occupied inputs, and global pools.

A window pool has the output sites of a regular sparse conv of the same geometry (or the input
sites with `subm=True`) and reduces the inputs each output's window reaches; the average divides by
the number of occupied inputs, as spconv's does. Its map is stored under `indice_key`, so an inverse
conv can return to the pool's input sites.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relconv.spconv._missing import missing
from relconv.spconv.conv import as_3d, check_ndim, strided_sites
from relconv.spconv.core import IndiceData, SparseConvTensor, SparseModule, check_geometry, expand_nd
from relconv.voxel import submanifold_map
from relconv.voxel.grid_map import conv_output_size

_MAX_NUM_VOXELS_DURING_TRAINING = "max_num_voxels_during_training"


class SparseMaxPool(SparseModule):
    """spconv's window max pool (`reduce="amax"`); `SparseAvgPool` averages instead.

    Args follow spconv 2.3: `ndim, kernel_size=3, stride=1 (None: kernel_size), padding=0,
    dilation=1, indice_key=None, subm=False, algo=None, record_voxel_count=False, name=None`.
    """

    reduce = "amax"

    def __init__(
        self,
        ndim: int,
        kernel_size=3,
        stride=1,
        padding=0,
        dilation=1,
        indice_key: str | None = None,
        subm: bool = False,
        algo=None,
        record_voxel_count: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        check_ndim(ndim, type(self).__name__)
        self.ndim = ndim
        self.kernel_size = expand_nd(ndim, kernel_size, "kernel_size")
        self.stride = list(self.kernel_size) if stride is None else expand_nd(ndim, stride, "stride")
        self.padding = expand_nd(ndim, padding, "padding")
        self.dilation = expand_nd(ndim, dilation, "dilation")
        check_geometry(
            kernel_size=self.kernel_size, stride=self.stride, dilation=self.dilation, padding=self.padding
        )
        if subm and any(k % 2 == 0 for k in self.kernel_size):
            raise ValueError(f"a submanifold pool's kernel_size must be odd per axis, got {self.kernel_size}")
        self.subm, self.indice_key, self.algo = subm, indice_key, algo
        self.record_voxel_count = record_voxel_count
        if record_voxel_count and not subm:
            self.register_buffer(_MAX_NUM_VOXELS_DURING_TRAINING, torch.zeros(1, dtype=torch.int32))

    def extra_repr(self) -> str:
        s = f"kernel_size={self.kernel_size}, stride={self.stride}"
        if any(self.padding):
            s += f", padding={self.padding}"
        if self.dilation != [1] * self.ndim:
            s += f", dilation={self.dilation}"
        return s

    def get_max_num_voxels(self) -> Tensor | None:
        return self._buffers.get(_MAX_NUM_VOXELS_DURING_TRAINING)

    def forward(self, input: SparseConvTensor) -> SparseConvTensor:
        if not isinstance(input, SparseConvTensor):
            raise TypeError(f"input must be a SparseConvTensor, got {type(input).__name__}")
        if len(input.spatial_shape) != self.ndim:
            raise ValueError(
                f"{type(self).__name__} takes a {self.ndim}-D tensor, got spatial_shape {input.spatial_shape}"
            )
        key = self.indice_key
        if key is not None and key in input.indice_dict:
            raise ValueError(f"indice_key {key!r} already names a map in this tensor; give the pool its own")
        shape = input.spatial_shape
        if self.subm:
            rmap = submanifold_map(
                input._sites.coords,
                tuple(as_3d(self.kernel_size, 1)),
                tuple(as_3d(self.dilation, 1)),
                (1, 1, 1),
            )
            out_sites, out_shape = input._sites, shape
        else:
            out_shape = conv_output_size(shape, self.kernel_size, self.stride, self.padding, self.dilation)
            if min(out_shape) < 1:
                raise ValueError(
                    f"the output spatial shape {out_shape} reaches zero (input spatial_shape {shape})"
                )
            rmap, out_sites = strided_sites(
                input, self.kernel_size, out_shape, self.stride, self.padding, self.dilation, False
            )
            count = self._buffers.get(_MAX_NUM_VOXELS_DURING_TRAINING)
            if count is not None:
                count.clamp_(min=rmap.num_out)
        features = input.features
        rows = features.index_select(0, rmap.in_index.long())
        index = rmap.out_index.long().unsqueeze(1).expand_as(rows)
        out = features.new_zeros(rmap.num_out, features.shape[1])
        out = out.scatter_reduce(0, index, rows, self.reduce, include_self=False)
        indice_dict = input.indice_dict
        if key is not None:
            indice_dict = dict(indice_dict)
            indice_dict[key] = IndiceData(
                out_sites.indices,
                input.indices,
                shape,
                out_shape,
                self.subm,
                self.kernel_size,
                self.stride,
                self.dilation,
                self.padding,
                self.algo,
                rmap=rmap,
                in_sites=input._sites,
                out_sites=out_sites,
            )
        return SparseConvTensor._make(out, out_sites, out_shape, input.batch_size, indice_dict)


class SparseAvgPool(SparseMaxPool):
    """spconv's window average pool: the mean over the occupied inputs of each window."""

    reduce = "mean"


def _pool_class(base: type, name: str, ndim: int) -> type:
    def __init__(
        self,
        kernel_size,
        stride=None,
        padding=0,
        dilation=1,
        indice_key=None,
        algo=None,
        record_voxel_count=False,
        name=None,
        subm=False,
    ):
        base.__init__(
            self,
            ndim,
            kernel_size,
            stride,
            padding,
            dilation,
            indice_key,
            subm,
            algo,
            record_voxel_count,
            name,
        )

    doc = (
        f"spconv's {ndim}-D {base.__name__[6:9].lower()} pool; stride defaults to kernel_size; "
        "`subm=True` (after spconv's arguments) keeps the input sites."
    )
    return type(name, (base,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


SparseMaxPool1d = _pool_class(SparseMaxPool, "SparseMaxPool1d", 1)
SparseMaxPool2d = _pool_class(SparseMaxPool, "SparseMaxPool2d", 2)
SparseMaxPool3d = _pool_class(SparseMaxPool, "SparseMaxPool3d", 3)
SparseMaxPool4d = _pool_class(SparseMaxPool, "SparseMaxPool4d", 4)
SparseAvgPool1d = _pool_class(SparseAvgPool, "SparseAvgPool1d", 1)
SparseAvgPool2d = _pool_class(SparseAvgPool, "SparseAvgPool2d", 2)
SparseAvgPool3d = _pool_class(SparseAvgPool, "SparseAvgPool3d", 3)


class SparseGlobalMaxOrAvgPool(SparseModule):
    """Per-sample reduction of the features: SparseConvTensor -> [batch_size, C] (empty samples: 0)."""

    def __init__(self, is_mean: bool, name: str | None = None) -> None:
        super().__init__(name=name)
        self.is_mean = is_mean

    def forward(self, input: SparseConvTensor) -> Tensor:
        if not isinstance(input, SparseConvTensor):
            raise TypeError(f"input must be a SparseConvTensor, got {type(input).__name__}")
        features = input.features
        index = input.indices[:, 0].long().unsqueeze(1).expand_as(features)
        out = features.new_zeros(input.batch_size, features.shape[1])
        return out.scatter_reduce(0, index, features, "mean" if self.is_mean else "amax", include_self=False)


class SparseGlobalAvgPool(SparseGlobalMaxOrAvgPool):
    def __init__(self, name: str | None = None) -> None:
        super().__init__(is_mean=True, name=name)


class SparseGlobalMaxPool(SparseGlobalMaxOrAvgPool):
    def __init__(self, name: str | None = None) -> None:
        super().__init__(is_mean=False, name=name)


def __getattr__(name: str):
    raise missing("spconv.pytorch.pool", name)
