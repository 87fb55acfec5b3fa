"""spconv's sparse convolutions (`SubMConv*d`, `SparseConv*d`, `SparseInverseConv*d`,
`SparseConvTranspose*d`) on relconv's core.

Weights keep spconv's layout `[C_out, k0, .., k{ndim-1}, C_in]` (a spconv `state_dict` loads as it is);
each forward views them as relconv's `[K, C_in, C_out]` with one permute (inside the autograd graph;
cached between calls that need no gradient). Kernel index `r` per axis reads the input at
`o*s - p + r*d`; flattened with the first axis slowest, it is both spconv's weight order and, for odd
sizes, relconv's offset order (offset = r - (k-1)/2), so submanifold layers run relconv.voxel's
conv (cached maps). Regular, inverse and transposed layers run `relational_conv` over the maps of
`relconv.voxel.grid_map`, through a per-layer `relconv.ops.MapCalls` (prepared calls by map).
2-D layers run as 3-D with a third axis of size 1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from relconv.ops import MapCalls
from relconv.spconv._missing import missing
from relconv.spconv.core import IndiceData, SiteSet, SparseConvTensor, SparseModule, check_geometry, expand_nd
from relconv.voxel import PreparedCalls
from relconv.voxel.conv import run_checked
from relconv.voxel.fold import FoldCache
from relconv.voxel.grid_map import build_map, conv_output_size, deconv_output_size
from relconv.voxel.utils import registered

_MAX_NUM_VOXELS_DURING_TRAINING = "max_num_voxels_during_training"
SUPPORTED_NDIM = (2, 3)


def check_ndim(ndim: int, what: str) -> None:
    if ndim not in SUPPORTED_NDIM:
        raise NotImplementedError(
            f"relconv.spconv runs {what} on 2-D and 3-D grids only, got ndim={ndim} "
            f"(spconv's {ndim}-D layers are not provided)"
        )


def as_3d(values: list[int], fill: int) -> list[int]:
    """A 2-D grid's per-axis values with relconv's third axis appended."""
    return values if len(values) == 3 else [*values, fill]


def _act_name(act_type: object) -> str | None:
    # spconv passes cumm's tv.gemm.Activation; only "none" is supported here.
    if act_type is None:
        return None
    name = getattr(act_type, "name", str(act_type))
    return None if name in ("None_", "None") else name


class SparseConvolution(SparseModule):
    """spconv's generic sparse convolution; use the `SubMConv3d`, `SparseConv3d`, ... subclasses.

    Args follow spconv 2.3: `ndim, in_channels, out_channels, kernel_size=3, stride=1, padding=0,
    dilation=1, groups=1, bias=True, subm=False, output_padding=0, transposed=False, inverse=False,
    indice_key=None, algo=None, fp32_accum=None, record_voxel_count=False, act_type=None,
    act_alpha=0, act_beta=0, large_kernel_fast_algo=False, name=None, device=None, dtype=None`.
    `algo`, `fp32_accum` and `large_kernel_fast_algo` are accepted and ignored (relconv picks its
    own kernels and accumulates half precision in float32).
    """

    def __init__(
        self,
        ndim: int,
        in_channels: int,
        out_channels: int,
        kernel_size=3,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        subm: bool = False,
        output_padding=0,
        transposed: bool = False,
        inverse: bool = False,
        indice_key: str | None = None,
        algo=None,
        fp32_accum: bool | None = None,
        record_voxel_count: bool = False,
        act_type=None,
        act_alpha: float = 0,
        act_beta: float = 0,
        large_kernel_fast_algo: bool = False,
        name: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(name=name)
        check_ndim(ndim, type(self).__name__)
        for arg, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if groups != 1:
            raise NotImplementedError(f"spconv's sparse convolutions take groups=1 only, got groups={groups}")
        if _act_name(act_type) is not None:
            raise NotImplementedError(f"relconv.spconv runs act_type=None only, got {act_type}")
        if inverse and indice_key is None:
            raise ValueError("an inverse conv needs the indice_key of the strided layer it inverts")
        self.ndim = ndim
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = expand_nd(ndim, kernel_size, "kernel_size")
        self.stride = expand_nd(ndim, stride, "stride")
        self.padding = expand_nd(ndim, padding, "padding")
        self.dilation = expand_nd(ndim, dilation, "dilation")
        self.output_padding = expand_nd(ndim, output_padding, "output_padding")
        check_geometry(
            kernel_size=self.kernel_size,
            stride=self.stride,
            dilation=self.dilation,
            padding=self.padding,
            output_padding=self.output_padding,
        )
        kv = math.prod(self.kernel_size)
        self.conv1x1 = kv == 1 and (subm or math.prod(self.stride) == 1)
        if self.conv1x1 and not subm and any(self.padding):
            raise ValueError(f"padding must be zero for a 1x1 conv (kernel 1, stride 1), got {self.padding}")
        if subm and not self.conv1x1:
            if any(k % 2 == 0 for k in self.kernel_size) or max(self.kernel_size) > 7:
                raise ValueError(
                    "a submanifold conv's kernel_size must be odd and at most 7 per axis, "
                    f"got {self.kernel_size}"
                )
        self.subm, self.transposed, self.inverse = subm, transposed, inverse
        self.groups, self.indice_key, self.algo, self.fp32_accum = groups, indice_key, algo, fp32_accum
        self.record_voxel_count = record_voxel_count
        self.act_type, self.act_alpha, self.act_beta = act_type, act_alpha, act_beta
        self.weight_shape = [out_channels, *self.kernel_size, in_channels]
        factory = {"device": device, "dtype": dtype}
        if record_voxel_count and not subm and not inverse:
            self.register_buffer(
                _MAX_NUM_VOXELS_DURING_TRAINING, torch.zeros(1, dtype=torch.int32, device=device)
            )
        self.weight = nn.Parameter(torch.zeros(*self.weight_shape, **factory))
        self.bias = nn.Parameter(torch.zeros(out_channels, **factory)) if bias else None
        self._kernel_3d = tuple(as_3d(self.kernel_size, 1))
        self._dilation_3d = tuple(as_3d(self.dilation, 1))
        # The relconv view of the weight, kept between calls that record no gradient: (key, view).
        self._kernel_cache: tuple | None = None
        # The layer's prepared relconv calls: a submanifold layer's per site set, the others' per map.
        self._calls = PreparedCalls()
        self._map_calls = MapCalls()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # spconv's kaiming_uniform (a = sqrt(5)) over fan_in = C_in * K: bound 1 / sqrt(fan_in).
        fan_in = self.in_channels * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def get_max_num_voxels(self) -> Tensor | None:
        return self._buffers.get(_MAX_NUM_VOXELS_DURING_TRAINING)

    def is_inverseable(self) -> bool:
        return self.indice_key is not None and not self.subm

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if any(self.padding):
            s += f", padding={self.padding}"
        if self.dilation != [1] * self.ndim:
            s += f", dilation={self.dilation}"
        if any(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.bias is None:
            s += ", bias=False"
        if self.indice_key is not None:
            s += f", indice_key={self.indice_key!r}"
        return s

    # ------------------------------------------------------------------ weights
    def _kernel(self, weight: Tensor) -> Tensor:
        """spconv's `[C_out, *K, C_in]` as relconv's `[K, C_in, C_out]`."""
        if torch.is_grad_enabled() and weight.requires_grad:
            return _to_relconv(weight)
        # Inference-mode tensors cannot enter a graph later: a view made under inference_mode is
        # kept apart from one made outside it.
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device, weight.shape)
        key += (torch.is_inference_mode_enabled(),)
        cached = self._kernel_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        kernel = _to_relconv(weight)
        self._kernel_cache = (key, kernel)
        return kernel

    # ------------------------------------------------------------------ forward
    def forward(self, input: SparseConvTensor, add_input: SparseConvTensor | None = None) -> SparseConvTensor:
        if not isinstance(input, SparseConvTensor):
            raise TypeError(f"input must be a SparseConvTensor, got {type(input).__name__}")
        if len(input.spatial_shape) != self.ndim:
            raise ValueError(
                f"{type(self).__name__} takes a {self.ndim}-D tensor, got spatial_shape {input.spatial_shape}"
            )
        features = input.features
        if features.shape[1] != self.in_channels:
            raise ValueError(
                f"input has {features.shape[1]} channels but the layer expects {self.in_channels}"
            )
        weight, bias = registered(self, "weight"), registered(self, "bias")
        if self.conv1x1:
            out = self._conv1x1(input, weight, bias)
        else:
            out = self._run(input, self._kernel(weight), bias, None)
        if add_input is not None:
            out = out.replace_feature(out.features + add_input.features)
        return out

    def can_fold(self) -> bool:
        """Whether `folded` can run this layer (SparseSequential's eval-mode BatchNorm folding)."""
        return not self.conv1x1 and self.groups == 1

    def folded(
        self, input: SparseConvTensor, bn: nn.BatchNorm1d, relu: bool, cache: FoldCache
    ) -> SparseConvTensor:
        """`relu?(bn(self(input)))` for an eval-mode `bn`, as one relconv call: bn folded into the
        weight and bias (`relconv.voxel.fold`, cached in `cache`), the ReLU in the epilogue."""
        kernel, bias = cache.get_tensors(self._kernel(self.weight), self.bias, 1, bn, input.features)
        return self._run(input, kernel, bias, "relu" if relu else None)

    def _run(
        self, x: SparseConvTensor, kernel: Tensor, bias: Tensor | None, act: str | None
    ) -> SparseConvTensor:
        if self.subm:
            return self._submanifold(x, kernel, bias, act)
        if self.inverse:
            return self._inverse(x, kernel, bias, act)
        return self._regular(x, kernel, bias, act)

    def _conv1x1(self, x: SparseConvTensor, weight: Tensor, bias: Tensor | None) -> SparseConvTensor:
        # spconv 2.3 multiplies a 1x1 layer by its [C_out, 1.., C_in] weight *reshaped* to [C_in, C_out]
        # (not transposed); trained spconv checkpoints hold weights for that product, so it is kept.
        w = weight.reshape(self.in_channels, self.out_channels)
        features = x.features
        if w.dtype != features.dtype and not torch.is_autocast_enabled(features.device.type):
            w = w.to(features.dtype)
            bias = None if bias is None else bias.to(features.dtype)
        out = features @ w if bias is None else torch.addmm(bias, features, w)
        return SparseConvTensor._make(out, x._sites, x.spatial_shape, x.batch_size, x.indice_dict)

    def _submanifold(
        self, x: SparseConvTensor, kernel: Tensor, bias: Tensor | None, act: str | None
    ) -> SparseConvTensor:
        key = self.indice_key
        datas = x.find_indice_pair(key)
        if datas is not None:
            self._check_subm_reuse(x, datas)
            sites = datas.out_sites
        else:
            sites = x._sites
        cache = sites._cache
        out = None
        if cache is not None:
            # The stored call straight on the features: no VoxelTensor in or out.
            out = self._calls.run_features(x.features, cache, (1, 1, 1), kernel, bias, act)
        if out is None:
            voxel = sites.voxel(x.features)
            d = self._dilation_3d
            out = run_checked(voxel, kernel, self._kernel_3d, (1, 1, 1), d, bias, act, self._calls).feats
        indice_dict = x.indice_dict
        if key is not None and datas is None:
            indice_dict = dict(indice_dict)
            indice_dict[key] = IndiceData(
                sites.indices,
                sites.indices,
                x.spatial_shape,
                x.spatial_shape,
                True,
                self.kernel_size,
                self.stride,
                self.dilation,
                self.padding,
                self.algo,
                in_sites=sites,
                out_sites=sites,
            )
        return SparseConvTensor._make(out, sites, x.spatial_shape, x.batch_size, indice_dict)

    def _regular(
        self, x: SparseConvTensor, kernel: Tensor, bias: Tensor | None, act: str | None
    ) -> SparseConvTensor:
        key = self.indice_key
        if key is not None and key in x.indice_dict:
            raise ValueError(
                f"indice_key {key!r} already names a map in this tensor; only submanifold layers "
                "share a map, give this layer its own indice_key"
            )
        shape = x.spatial_shape
        if self.transposed:
            out_shape = deconv_output_size(
                shape, self.kernel_size, self.stride, self.padding, self.output_padding
            )
        else:
            out_shape = conv_output_size(shape, self.kernel_size, self.stride, self.padding, self.dilation)
        if min(out_shape) < 1:
            raise ValueError(
                f"the output spatial shape {out_shape} reaches zero (input spatial_shape {shape}, "
                f"kernel_size {self.kernel_size}, stride {self.stride}, padding {self.padding})"
            )
        rmap, out_sites = strided_sites(
            x,
            self.kernel_size,
            out_shape,
            self.stride,
            self.padding,
            self.dilation,
            self.transposed,
        )
        self._record_count(rmap.num_out)
        out = self._map_calls(x.features, kernel, rmap, bias, act)
        indice_dict = x.indice_dict
        if key is not None:
            indice_dict = dict(indice_dict)
            indice_dict[key] = IndiceData(
                out_sites.indices,
                x.indices,
                shape,
                out_shape,
                False,
                self.kernel_size,
                self.stride,
                self.dilation,
                self.padding,
                self.algo,
                rmap=rmap,
                in_sites=x._sites,
                out_sites=out_sites,
            )
        return SparseConvTensor._make(out, out_sites, out_shape, x.batch_size, indice_dict)

    def _inverse(
        self, x: SparseConvTensor, kernel: Tensor, bias: Tensor | None, act: str | None
    ) -> SparseConvTensor:
        datas = x.find_indice_pair(self.indice_key)
        if datas is None:
            raise ValueError(
                f"{type(self).__name__} needs the map of the strided layer with indice_key "
                f"{self.indice_key!r}, which this tensor does not hold; pass a tensor derived from "
                "that layer's output"
            )
        if datas.is_subm or datas.rmap is None:
            raise ValueError(
                f"indice_key {self.indice_key!r} names a submanifold map; an inverse conv inverts a "
                "strided conv or pool"
            )
        if datas.ksize != self.kernel_size:
            raise ValueError(
                f"an inverse conv must have the kernel_size of the layer it inverts: expected "
                f"{datas.ksize}, this layer has {self.kernel_size}"
            )
        if x.spatial_shape != datas.out_spatial_shape or x.indices.shape[0] != datas.out_indices.shape[0]:
            raise ValueError(
                f"the input (spatial_shape {x.spatial_shape}, {x.indices.shape[0]} sites) is not on the "
                f"output sites of indice_key {self.indice_key!r} (spatial_shape "
                f"{datas.out_spatial_shape}, {datas.out_indices.shape[0]} sites)"
            )
        out = self._map_calls(x.features, kernel, datas.rmap.transpose(), bias, act)
        return SparseConvTensor._make(out, datas.in_sites, datas.spatial_shape, x.batch_size, x.indice_dict)

    def _check_subm_reuse(self, x: SparseConvTensor, datas: IndiceData) -> None:
        key = self.indice_key
        if not datas.is_subm:
            raise ValueError(
                f"indice_key {key!r} names a strided map; a submanifold layer can share only a "
                "submanifold layer's map"
            )
        if datas.ksize != self.kernel_size or datas.dilation != self.dilation:
            raise ValueError(
                f"submanifold layers sharing indice_key {key!r} must have the same kernel_size and "
                f"dilation: expected {datas.ksize} / {datas.dilation}, this layer has "
                f"{self.kernel_size} / {self.dilation}"
            )
        if x.spatial_shape != datas.spatial_shape or x.indices.shape[0] != datas.indices.shape[0]:
            raise ValueError(
                f"submanifold layers sharing indice_key {key!r} must run on the same sites: expected "
                f"spatial_shape {datas.spatial_shape} with {datas.indices.shape[0]} sites, got "
                f"{x.spatial_shape} with {x.indices.shape[0]}"
            )

    def _record_count(self, num_out: int) -> None:
        count = self._buffers.get(_MAX_NUM_VOXELS_DURING_TRAINING)
        if count is not None:
            count.clamp_(min=num_out)


def strided_sites(
    x: SparseConvTensor,
    kernel_size: list[int],
    out_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
) -> tuple:
    """(map, output SiteSet) of a regular or transposed layer over x's sites, cached on the sites."""
    sites = x._sites
    key = (transposed, tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation), tuple(out_shape))
    key += (tuple(x.spatial_shape), x.batch_size)
    entry = sites.maps.get(key)
    if entry is None:
        ndim = len(x.spatial_shape)
        rmap, coords = build_map(
            sites.coords,
            x.batch_size,
            as_3d(x.spatial_shape, 1),
            as_3d(out_shape, 1),
            as_3d(kernel_size, 1),
            as_3d(stride, 1),
            as_3d(padding, 0),
            as_3d(dilation, 1),
            transposed,
        )
        out_sites = SiteSet(coords if ndim == 3 else coords[:, : ndim + 1].contiguous(), coords, built=True)
        entry = (rmap, out_sites)
        sites.maps[key] = entry
    return entry


def _to_relconv(weight: Tensor) -> Tensor:
    ndim = weight.dim() - 2
    c_out, c_in = weight.shape[0], weight.shape[-1]
    # One copy into relconv's order (the op reads [K, C_in, C_out] contiguously), then a free view.
    return torch.permute_copy(weight, (*range(1, ndim + 1), ndim + 1, 0)).view(-1, c_in, c_out)


def _conv_class(name: str, ndim: int, subm: bool = False, transposed: bool = False) -> type:
    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        bias=True,
        indice_key=None,
        algo=None,
        fp32_accum=None,
        record_voxel_count=False,
        large_kernel_fast_algo=False,
        name=None,
    ):
        SparseConvolution.__init__(
            self,
            ndim,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            subm=subm,
            transposed=transposed,
            indice_key=indice_key,
            algo=algo,
            fp32_accum=fp32_accum,
            record_voxel_count=record_voxel_count,
            large_kernel_fast_algo=large_kernel_fast_algo,
            name=name,
        )

    kind = "submanifold" if subm else ("transposed" if transposed else "regular")
    doc = f"spconv's {ndim}-D {kind} sparse convolution; weight [C_out, *kernel_size, C_in]."
    return type(name, (SparseConvolution,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


def _inverse_class(name: str, ndim: int) -> type:
    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        indice_key,
        bias=True,
        algo=None,
        fp32_accum=None,
        large_kernel_fast_algo=False,
        name=None,
    ):
        SparseConvolution.__init__(
            self,
            ndim,
            in_channels,
            out_channels,
            kernel_size,
            bias=bias,
            inverse=True,
            indice_key=indice_key,
            algo=algo,
            fp32_accum=fp32_accum,
            large_kernel_fast_algo=large_kernel_fast_algo,
            name=name,
        )

    doc = (
        f"spconv's {ndim}-D inverse conv: runs the map of the strided layer with the same indice_key "
        "transposed, back to that layer's input sites."
    )
    return type(name, (SparseConvolution,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


SubMConv1d = _conv_class("SubMConv1d", 1, subm=True)
SubMConv2d = _conv_class("SubMConv2d", 2, subm=True)
SubMConv3d = _conv_class("SubMConv3d", 3, subm=True)
SubMConv4d = _conv_class("SubMConv4d", 4, subm=True)
SparseConv1d = _conv_class("SparseConv1d", 1)
SparseConv2d = _conv_class("SparseConv2d", 2)
SparseConv3d = _conv_class("SparseConv3d", 3)
SparseConv4d = _conv_class("SparseConv4d", 4)
SparseConvTranspose1d = _conv_class("SparseConvTranspose1d", 1, transposed=True)
SparseConvTranspose2d = _conv_class("SparseConvTranspose2d", 2, transposed=True)
SparseConvTranspose3d = _conv_class("SparseConvTranspose3d", 3, transposed=True)
SparseConvTranspose4d = _conv_class("SparseConvTranspose4d", 4, transposed=True)
SparseInverseConv1d = _inverse_class("SparseInverseConv1d", 1)
SparseInverseConv2d = _inverse_class("SparseInverseConv2d", 2)
SparseInverseConv3d = _inverse_class("SparseInverseConv3d", 3)
SparseInverseConv4d = _inverse_class("SparseInverseConv4d", 4)


def __getattr__(name: str):
    raise missing("spconv.pytorch.conv", name)
