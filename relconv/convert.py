"""Convolution weight converters between relconv and the other sparse-convolution libraries.

Every layout stores, per kernel index, a `[C_in, C_out]` (or `[C_out, C_in]`) matrix; they differ in
the order the indices are flattened. The converters re-index: the matrix at per-axis kernel index
(i0, i1, i2) in `src` lands at the same index in `dst`. "Axis a" is coordinate column a + 1 of the
library's index tensor (column 0 is the batch): relconv's (x, y, z), spconv's columns 1..3
(OpenPCDet fills them with (z, y, x)); the converters keep columns and never reorder axes.

=============  ==================================  =================================================
layout         conv weight                         index order
=============  ==================================  =================================================
relconv        `Conv3d.weight` [K, C_in, C_out]    k = (i0 * k1 + i1) * k2 + i2 (axis 0 slowest)
warpconvnet    `weight` [K, C_in, C_out]           relconv's (a meshgrid with "ij" indexing)
spconv         `weight` [C_out, k0, k1, k2, C_in]  kernel axes = index columns 1..3 (KRSC); a
               (1x1x1 stride 1: its storage read   1x1x1 stride-1 conv multiplies by the storage
               as [C_in, C_out])                   viewed as [C_in, C_out], not transposed
torchsparse    `kernel` [K, C_in, C_out]           odd K: k = (i2 * k1 + i1) * k0 + i0 (axis 0
               ([C_in, C_out] for 1x1x1 stride 1)  fastest); even K: relconv's
minkowski      `kernel` [K, C_in, C_out]           k = (i2 * k1 + i1) * k0 + i0 for every K
               ([C_in, C_out] for 1x1x1 stride 1)  (RegionType.HYPER_CUBE)
=============  ==================================  =================================================

Transposed / inverse convolutions use the same layout as the strided convolution whose map they
reuse, in every library, so they convert the same way.

Where each library's layer reads kernel index i on an axis of size k (offset from the output site,
in units of dilation * tensor stride), and so when a converted relconv native `Conv3d` of the same
kernel size and stride computes the same feature at every output site the two layers share:

* relconv, WarpConvNet, MinkowskiEngine 0.5 (`kernel_region.hpp`, HYPER_CUBE): i - (k-1)/2 for odd
  k, i for even k; always the same.
* spconv 2.x: i - padding (regular and inverse convs); submanifold convs (odd kernels) centre it.
  The same where padding is (k-1)/2 on odd axes and 0 on even ones (OpenPCDet's and Pointcept's
  layers), though a strided spconv layer outputs more sites than relconv's native one.
* TorchSparse 2.1 (default map builder): at stride 1, i - (k-1)/2 on every axis when the kernel
  volume is odd, i on every axis when it is even; strided convs read i - padding (padding 0 by
  default). The same except for even-volume kernels with an odd axis longer than 1 (a (3, 1, 2)
  kernel) and strided kernels larger than their stride at padding 0 (3^3 stride 2), which
  `relconv.torchsparse` runs with TorchSparse's geometry.

MinkowskiEngine's HYPER_CROSS and custom-offset regions have no relconv counterpart (`region_type`
other than HYPER_CUBE raises `NotImplementedError`; their kernels also fail the kernel-size check),
nor do its channel-wise convolutions ([K, C] kernels: a shape error), other dimensions than 3,
spconv's 2-D convs, grouped relconv weights and spconv's legacy `SPCONV_SAVED_WEIGHT_LAYOUT`
(RSKC / RSCK) weights.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence

from torch import Tensor, nn

LAYOUTS = ("relconv", "warpconvnet", "spconv", "torchsparse", "minkowski")

# The parameter name of a conv weight in each library's modules.
WEIGHT_NAMES = {
    "relconv": "weight",
    "warpconvnet": "weight",
    "spconv": "weight",
    "torchsparse": "kernel",
    "minkowski": "kernel",
}

# Buffers only spconv's modules hold (a strided conv with record_voxel_count=True); other libraries'
# modules have no place for them.
_SPCONV_ONLY_BUFFERS = ("max_num_voxels_during_training",)

Size3 = tuple[int, int, int]


def _layout(name: str, arg: str) -> str:
    if not isinstance(name, str) or name.lower() not in LAYOUTS:
        raise ValueError(f"{arg} must be one of {LAYOUTS}, got {name!r}")
    return name.lower()


def _size3(value: int | Sequence[int], arg: str) -> Size3:
    if isinstance(value, (bool, str)):
        raise TypeError(f"{arg} must be an int or a sequence of 3 ints, got {value!r}")
    if isinstance(value, numbers.Integral):
        value = (value,) * 3
    try:
        size = tuple(operator.index(v) for v in value)
    except TypeError:
        raise TypeError(f"{arg} must be an int or a sequence of 3 ints, got {value!r}") from None
    if len(size) != 3:
        raise NotImplementedError(f"{arg} has {len(size)} axes; only 3-D convolutions convert, got {size}")
    if min(size) < 1:
        raise ValueError(f"{arg} must be positive per axis, got {size}")
    return size  # type: ignore[return-value]


def _reversed_order(layout: str, volume: int) -> bool:
    """True where the layout flattens offsets with axis 0 fastest (the reverse of relconv)."""
    return layout == "minkowski" or (layout == "torchsparse" and volume % 2 == 1)


def _spconv_matmul(ks: Size3, stride: Size3) -> bool:
    """spconv 2.3 runs a 1x1x1 stride-1 conv (submanifold or regular) as `features @
    weight.view(C_in, C_out)`: its `[C_out, 1, 1, 1, C_in]` storage read as `[C_in, C_out]`, not
    transposed (FILTER_HWIO off, spconv's default). Trained checkpoints hold weights for that product."""
    return math.prod(ks) == 1 and stride == (1, 1, 1)


def _to_canonical(w: Tensor, layout: str, ks: Size3, stride: Size3) -> Tensor:
    """Any layout -> [k0, k1, k2, C_in, C_out] indexed by per-axis kernel index."""
    volume = math.prod(ks)
    if layout == "spconv":
        if w.dim() != 5:
            raise ValueError(
                f"a spconv 3-D conv weight is [C_out, k0, k1, k2, C_in], got shape {tuple(w.shape)}"
                + ("; 2-D convs do not convert" if w.dim() == 4 else "")
            )
        if tuple(w.shape[1:4]) != ks:
            raise ValueError(f"spconv weight kernel axes {tuple(w.shape[1:4])} do not match kernel_size {ks}")
        if _spconv_matmul(ks, stride):
            return w.reshape(1, 1, 1, w.shape[4], w.shape[0])
        return w.permute(1, 2, 3, 4, 0)
    if w.dim() == 2 and layout in ("torchsparse", "minkowski"):
        if volume != 1:
            raise ValueError(f"a 2-D {layout} kernel [C_in, C_out] is a 1x1x1 conv, but kernel_size is {ks}")
        w = w.unsqueeze(0)
    if w.dim() == 4 and layout == "relconv":
        raise NotImplementedError("grouped relconv weights [K, groups, C_in/g, C_out/g] do not convert")
    if w.dim() != 3:
        raise ValueError(f"a {layout} conv weight is [K, C_in, C_out], got shape {tuple(w.shape)}")
    if w.shape[0] != volume:
        raise ValueError(f"{layout} weight has {w.shape[0]} offsets but kernel_size {ks} has {volume}")
    c_in, c_out = w.shape[1:]
    if _reversed_order(layout, volume):
        return w.reshape(ks[2], ks[1], ks[0], c_in, c_out).permute(2, 1, 0, 3, 4)
    return w.reshape(*ks, c_in, c_out)


def _from_canonical(c: Tensor, layout: str, ks: Size3, stride: Size3) -> Tensor:
    volume = math.prod(ks)
    c_in, c_out = c.shape[3:]
    if layout == "spconv":
        if _spconv_matmul(ks, stride):
            return c.contiguous().reshape(c_out, 1, 1, 1, c_in)
        return c.permute(4, 0, 1, 2, 3).contiguous()
    if _reversed_order(layout, volume):
        c = c.permute(2, 1, 0, 3, 4)
    w = c.reshape(volume, c_in, c_out).contiguous()
    if volume == 1 and stride == (1, 1, 1) and layout in ("torchsparse", "minkowski"):
        # Both libraries run a 1x1x1 stride-1 conv as a plain matmul over a [C_in, C_out] kernel.
        return w[0]
    return w


def convert_weight(
    weight: Tensor,
    src: str,
    dst: str,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    region_type: object = "HYPER_CUBE",
) -> Tensor:
    """One convolution weight from layout `src` to layout `dst` (see the module docstring).

    Args:
        weight: the weight as `src` stores it.
        src, dst: one of `LAYOUTS`.
        kernel_size: int or 3 ints, the conv's kernel size in coordinate-column order.
        stride: the conv's stride; only matters for 1x1x1 kernels: the shape of a TorchSparse or
            MinkowskiEngine one ([C_in, C_out] at stride 1, [1, C_in, C_out] otherwise), and how
            spconv reads one (at stride 1 its storage as [C_in, C_out], see below).
        region_type: MinkowskiEngine's kernel region (a name or its `RegionType` member); only
            HYPER_CUBE, its default, converts.
    Returns:
        A new contiguous tensor (never a view of `weight`), same dtype and device.
    """
    if not isinstance(weight, Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    src, dst = _layout(src, "src"), _layout(dst, "dst")
    region = str(getattr(region_type, "name", region_type)).rsplit(".", 1)[-1].upper()
    if region != "HYPER_CUBE":
        raise NotImplementedError(
            f"region_type {region_type!r}: only MinkowskiEngine's HYPER_CUBE kernels have a relconv "
            "counterpart (HYPER_CROSS and custom offsets are not a box of offsets)"
        )
    ks, st = _size3(kernel_size, "kernel_size"), _size3(stride, "stride")
    return _from_canonical(_to_canonical(weight, src, ks, st), dst, ks, st).clone()


def _is_conv_weight(name: str, value: Tensor, layout: str) -> bool:
    """The name/shape rule for a conv weight of `layout` in a state_dict."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf != WEIGHT_NAMES[layout] or not isinstance(value, Tensor):
        return False
    if layout == "spconv":
        return value.dim() == 5
    if layout in ("torchsparse", "minkowski"):
        return value.dim() in (2, 3)
    return value.dim() == 3


def _cube_root(volume: int) -> int | None:
    k = round(volume ** (1 / 3))
    return k if k**3 == volume else None


def kernel_sizes_of(model: nn.Module) -> dict[str, Size3]:
    """`{module name: kernel_size}` of every module of `model` that has a `kernel_size` (or, for
    MinkowskiEngine, `kernel_generator.kernel_size`) and a `weight` or `kernel` parameter: the
    `kernel_sizes` argument of `convert_state_dict` for a model whose kernels are not cubes."""
    sizes = {}
    for name, module in model.named_modules():
        ks = getattr(module, "kernel_size", None)
        if ks is None:
            ks = getattr(getattr(module, "kernel_generator", None), "kernel_size", None)
        has_weight = any(isinstance(getattr(module, p, None), Tensor) for p in ("weight", "kernel"))
        if ks is None or not has_weight:
            continue
        ks = tuple(int(k) for k in ks) if not isinstance(ks, int) else (ks,) * 3
        if len(ks) == 3:
            sizes[name] = ks
    return sizes


def _selector(keys: Iterable[str] | Callable[[str], bool] | None) -> Callable[[str], bool] | None:
    if keys is None or callable(keys):
        return keys
    if isinstance(keys, str):
        raise TypeError("keys must be an iterable of state_dict keys or a predicate, not one string")
    chosen = set(keys)
    return chosen.__contains__


def convert_state_dict(
    state_dict: Mapping[str, Tensor],
    src: str,
    dst: str,
    kernel_sizes: Mapping[str, int | Sequence[int]] | None = None,
    strides: Mapping[str, int | Sequence[int]] | None = None,
    keys: Iterable[str] | Callable[[str], bool] | None = None,
) -> dict[str, Tensor]:
    """A whole model's state_dict from layout `src` to layout `dst`.

    Conv weights are found by name and shape (unless `keys` names them): the parameter is called
    `WEIGHT_NAMES[src]` (`weight`, or `kernel` for TorchSparse and MinkowskiEngine) and is 5-D for
    spconv, 3-D for relconv and WarpConvNet, 2-D or 3-D for TorchSparse and MinkowskiEngine. Each is
    converted and renamed to `WEIGHT_NAMES[dst]`; a converted conv's `bias` becomes `[1, C_out]`
    for MinkowskiEngine and `[C_out]` otherwise. Everything else (BatchNorm, other biases, linear
    layers, buffers) passes through unchanged, except spconv-only buffers
    (`max_num_voxels_during_training`), which are dropped when `dst` is not spconv. Module names
    are kept: the destination model must name its modules as the source did.

    Args:
        state_dict: the source model's `state_dict()`.
        src, dst: one of `LAYOUTS`.
        kernel_sizes: `{module name: kernel size}` (e.g. `kernel_sizes_of(model)` of either model).
            Needed for a K-offset layout whose K is not a cube (a 3x1x1 kernel); spconv weights carry
            their kernel size, cubes are inferred.
        strides: `{module name: stride}`; only 1x1x1 kernels depend on it (see `convert_weight`).
            Missing modules count as stride 1.
        keys: the conv weight keys to convert (an iterable or a predicate on the key) when the
            name/shape rule would pick wrong tensors, e.g. a dense `torch.nn.Conv1d` weight that is
            3-D and called `weight` like relconv's.
    Returns:
        A new dict (tensors not converted are the same objects as in `state_dict`).
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    src, dst = _layout(src, "src"), _layout(dst, "dst")
    kernel_sizes, strides = dict(kernel_sizes or {}), dict(strides or {})
    select = _selector(keys)
    if select is not None:
        for key in state_dict:
            if select(key) and key.rsplit(".", 1)[-1] != WEIGHT_NAMES[src]:
                raise ValueError(
                    f"keys selects {key!r}, but {src} conv weights are named {WEIGHT_NAMES[src]!r}"
                )
    convs: dict[str, Tensor] = {}
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        chosen = select(key) if select is not None else _is_conv_weight(key, value, src)
        if chosen:
            module = key.rsplit(".", 1)[0] if "." in key else ""
            ks = _state_kernel_size(key, module, value, src, kernel_sizes)
            w = convert_weight(value, src, dst, ks, strides.get(module, 1))
            out[_join(module, WEIGHT_NAMES[dst])] = w
            convs[module] = w
        elif dst != "spconv" and key.rsplit(".", 1)[-1] in _SPCONV_ONLY_BUFFERS:
            continue
        else:
            out[key] = value
    for module in convs:
        bias_key = _join(module, "bias")
        bias = out.get(bias_key)
        if isinstance(bias, Tensor):
            out[bias_key] = bias.reshape(1, -1) if dst == "minkowski" else bias.reshape(-1)
    return out


def _join(module: str, leaf: str) -> str:
    return f"{module}.{leaf}" if module else leaf


def _state_kernel_size(
    key: str, module: str, value: Tensor, src: str, kernel_sizes: dict[str, int | Sequence[int]]
) -> int | Sequence[int]:
    if module in kernel_sizes:
        return kernel_sizes[module]
    if src == "spconv" and value.dim() == 5:
        return tuple(value.shape[1:4])
    volume = 1 if value.dim() == 2 else int(value.shape[0])
    k = _cube_root(volume)
    if k is None:
        raise ValueError(
            f"{key!r} has {volume} kernel offsets, not a cube: pass its kernel size in "
            f"kernel_sizes={{{module!r}: (k0, k1, k2)}} (kernel_sizes_of(model) lists a model's)"
        )
    return k


__all__ = ["LAYOUTS", "WEIGHT_NAMES", "convert_state_dict", "convert_weight", "kernel_sizes_of"]
