"""TorchSparse 2.1's sparse convolution (`conv3d`) on relconv's voxel layers.

Geometry, as TorchSparse 2.1 computes it in its default configuration:
- 1x1x1 kernel, stride 1: a matmul on the features.
- stride 1: submanifold; output sites = input sites.
- stride s: output sites `o` (in output-grid units) are every `(p + padding - d) / s` that divides,
  for input sites p and kernel digits d, bounded per axis to `[0, hi]`, with
  `hi = (max(p) + 2 * padding - (k - 1)) // s`, or `spatial_range` - 1 of the output grid when the
  tensor has one (`_downsample`); they come sorted by (batch, x, y, z). With kernel = stride and no
  padding that is `unique(floor(p / s))` less the top sites TorchSparse's bound drops.
- transposed: back onto the sites the strided conv of the same kernel size and stride started
  from, through that conv's map (so that conv's padding), with the same offset indices.
A strided conv on those bounded sites (and its transposed conv) runs over the grid map of
`relconv.voxel.grid_map` (on CUDA one op with one host read; the coordinate bounds are another),
in TorchSparse's own offsets; relconv's native strided map would need a larger kernel wherever the
padding does not centre it (`_layout`).
- dilation: TorchSparse 2.1's map builders take none, so maps here ignore it as well.
The weight is TorchSparse's `kernel` `[K, C_in, C_out]` in its offset order (odd sizes list the
offsets x fastest, relconv z fastest). `_layout` turns it into relconv's order inside the autograd
graph (one gather, skipped where the orders agree; kept across calls while autograd is off), except
in training where relconv's kernel has the same offsets: the conv then runs over the map with its
relations relabelled to TorchSparse's order (`RelationalMap.relabeled`, once per map) and takes the
kernel as it is (`relabels`).
"""

from __future__ import annotations

import functools
import math
import warnings
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from relconv.core import RelationalMap
from relconv.ops import MapCalls, relational_conv
from relconv.torchsparse._layout import Geometry, grid_geometry, offset_order, relconv_geometry, to_relconv
from relconv.torchsparse._layout import torchsparse_lows_cached as torchsparse_lows
from relconv.torchsparse.nn.functional.conv_config import map_modes
from relconv.torchsparse.nn.functional.pending import PendingConv
from relconv.torchsparse.tensor import SparseTensor, TensorCache, get_allow_negative_coordinates, make_ntuple
from relconv.voxel import MapCache, PreparedCalls, VoxelTensor
from relconv.voxel.conv import run_checked
from relconv.voxel.grid_map import build_map
from relconv.voxel.kernel_map import bounds
from relconv.voxel.nn import inference_folding_enabled
from relconv.voxel.utils import small_constant

__all__ = ["conv3d"]

Triple = tuple[int, int, int]

GENERATIVE_MESSAGE = (
    "generative=True is not provided by relconv.torchsparse: TorchSparse 2.1 itself rejects it in "
    "its default kernel-map mode ('hashmap_on_the_fly'); relconv.voxel.Conv3d(transposed=True, "
    "generative=True) creates upsampled coordinates natively"
)


class GridSource(NamedTuple):
    """The input sites of a strided conv run over a grid map: where its transposed conv returns."""

    coords: Tensor  # TorchSparse units
    fine: Tensor  # relconv's coordinates of the same rows
    cache: MapCache


class DownsampleRecord(NamedTuple):
    """One strided conv geometry over one coordinate set (kept in `TensorCache.kmaps`)."""

    coords: Tensor  # output sites, TorchSparse units
    spatial_range: tuple | None
    lows: Triple  # per-axis lowest offset of the map (the transposed conv reuses it)
    voxel: MapCache | None  # relconv's cache for this geometry when its sites differ from the shared ones
    fine: Tensor  # relconv's coordinates of the output sites
    grid: RelationalMap | None  # the grid map of bounded sites, None for floor(p / s) sites
    source: GridSource | None  # the input sites of `grid`


def conv3d(
    input: SparseTensor,
    weight: Tensor,
    kernel_size: int | Sequence[int],
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    config: dict | None = None,
    transposed: bool = False,
    generative: bool = False,
    training: bool = False,
) -> SparseTensor:
    """TorchSparse's functional conv: `weight` `[K, C_in, C_out]` in TorchSparse's offset order
    (`[C_in, C_out]` for a 1x1x1 stride-1 kernel). Of `config` (default: the global, else the
    default conv config) the map fields are read (see `conv_config`); `training` is ignored."""
    if not isinstance(input, SparseTensor):
        raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
    if not isinstance(weight, Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    k = make_ntuple(kernel_size, 3, "kernel_size")
    s = make_ntuple(stride, 3, "stride")
    p = make_ntuple(padding, 3, "padding")
    d = make_ntuple(dilation, 3, "dilation")
    _check_geometry(k, s, p, d)
    if generative:
        raise NotImplementedError(GENERATIVE_MESSAGE)
    if k != (1, 1, 1) or s != (1, 1, 1):
        _check_weight(weight, k, input)
    return run_conv(input, weight, bias, k, s, p, d, transposed, map_modes(config), None)


def _check_geometry(k: Triple, s: Triple, p: Triple, d: Triple) -> None:
    if min(k) < 1 or max(k) > 7:
        raise ValueError(f"kernel_size must lie in 1..7 per axis, got {k}")
    if min(s) < 1:
        raise ValueError(f"stride must be >= 1 per axis, got {s}")
    if min(p) < 0:
        raise ValueError(f"padding must be >= 0 per axis, got {p}")
    if min(d) < 1:
        raise ValueError(f"dilation must be >= 1 per axis, got {d}")


class Runs:
    """A module's relconv calls, one set of prepared calls (`relconv.voxel.PreparedCalls`) per map
    geometry it meets (not registered state), and the gather index of the weight conversion per
    device. With autograd off, the converted weight is kept until the kernel changes (tracked by
    its version counter).
    """

    def __init__(self, owner: nn.Module):
        # The module these calls serve: a copy of it (DataParallel's replicas share its __dict__)
        # makes its own, as the kept weights are the module's.
        self.owner = weakref.ref(owner)
        self.layers: dict[tuple[Triple, bool], PreparedCalls] = {}
        self.grid_calls = MapCalls()
        self.index: dict[tuple, Tensor] = {}
        self.weights: dict[tuple, tuple] = {}

    def __getstate__(self) -> dict:
        # Copies and pickles start without calls or kept weights (they are rebuilt on use).
        return {"owner": None, "layers": {}, "grid_calls": MapCalls(), "index": {}, "weights": {}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.owner = lambda: None

    def calls(self, lows: Triple, relabelled: bool) -> PreparedCalls:
        """The prepared calls over the map `lows`, apart for calls over its relabelled form, whose
        prepared calls take the kernel unconverted."""
        calls = self.layers.get((lows, relabelled))
        if calls is None:
            calls = self.layers[(lows, relabelled)] = PreparedCalls()
        return calls

    def submanifold(
        self,
        x: SparseTensor,
        kernel: Tensor,
        bias: Tensor | None,
        k: Triple,
        padding: Triple,
        hashmap: bool,
        activation: str | None,
    ) -> SparseTensor | None:
        """A submanifold conv's stored call run straight on x's features (no relconv tensor in or
        out), or None where there is none yet or it steps aside: `run_conv`'s full path then runs,
        and stores the call."""
        base = x._base  # x's sites in relconv's units; None until a layer has run on them
        if base is None or not isinstance(x.feats, Tensor):
            return None
        lows = torchsparse_lows(k, (1, 1, 1), padding, hashmap)
        relabelled = relabels(kernel)
        calls = self.layers.get((lows, relabelled))
        # A network over new coordinates has no plan for them: the full path runs without the
        # weight lookup and the checks of a stored call.
        if calls is None or calls.get((id(base.cache), activation)) is None:
            return None
        weight = kernel if relabelled else self.weight(kernel, lows, relconv_geometry(k, lows))
        feats = calls.run_features(x.feats, base.cache, base.stride, weight, bias, activation)
        if feats is None:
            return None
        out = x._like(feats)
        out.spatial_range = _subm_range(x.spatial_range, k, padding)
        return out

    def weight(self, kernel: Tensor, layout: tuple, geometry: Geometry) -> Tensor:
        """`kernel` in `geometry`'s order, kept per `layout` (the map's lows, or "grid") while
        autograd is off."""
        if geometry.index is None:
            return kernel
        if torch.is_grad_enabled() and kernel.requires_grad:
            return to_relconv(kernel, geometry, self._index(geometry, kernel.device))
        key = (kernel._version, kernel.data_ptr(), kernel.dtype, kernel.device)
        kept = self.weights.get(layout)
        if kept is None or kept[0] != key:
            w = to_relconv(kernel, geometry, self._index(geometry, kernel.device))
            kept = self.weights[layout] = (key, w)
        return kept[1]

    def _index(self, geometry: Geometry, device: torch.device) -> Tensor:
        key = (geometry.index, device)
        t = self.index.get(key)
        if t is None:
            t = self.index[key] = torch.tensor(geometry.index, dtype=torch.int64, device=device)
        return t


def run_conv(
    x: SparseTensor,
    weight: Tensor,
    bias: Tensor | None,
    k: Triple,
    s: Triple,
    padding: Triple,
    dilation: Triple,
    transposed: bool,
    modes: tuple[bool, bool],
    runs: Runs | None,
    activation: str | None = None,
) -> SparseTensor:
    """One conv on validated, normalised arguments (`modes`: `conv_config.map_modes`; `runs`: the
    calling module's layers; `activation`: None or "relu", after the bias)."""
    if k == (1, 1, 1) and s == (1, 1, 1):
        w = weight if weight.dim() == 2 else _single_offset(weight)
        feats = x.feats @ w if bias is None else torch.addmm(bias, x.feats, w)
        out = x._like(feats.relu_() if activation == "relu" else feats)
        if out.stride not in x._caches.cmaps:
            x._caches.cmaps[out.stride] = (out.coords, out.spatial_range)
        return out
    if s == (1, 1, 1) and not transposed and runs is not None:
        out = runs.submanifold(x, weight, bias, k, padding, modes[0], activation)
        if out is not None:
            return out
    vt = x._voxel()
    caches = x._caches  # after _voxel, which may give new coordinates a cache of their own
    hint = None
    if transposed:
        lows, out_ts, out_range, record = _transposed_geometry(x, caches, k, s, dilation, modes[0])
        # Over the strided conv's grid map when the input is on that conv's output sites.
        if record is not None and record.grid is not None and vt.coords is record.fine:
            src = record.source
            feats = _grid_conv(vt.feats, weight, bias, activation, k, record.grid.transpose(), runs)
            out = VoxelTensor._trusted(feats, src.fine, out_ts, src.cache)
            return _wrap(out, out_ts, out_range, caches, src.coords)
    elif s == (1, 1, 1):
        lows = torchsparse_lows(k, s, padding, modes[0])
        out_ts, out_range = x.stride, _subm_range(x.spatial_range, k, padding)
    else:
        record = _downsample(x, vt, caches, k, s, padding, dilation, modes)
        lows, out_range, hint = record.lows, record.spatial_range, record.coords
        out_ts = tuple(t * si for t, si in zip(x.stride, s, strict=True))
        if record.grid is not None:
            feats = _grid_conv(vt.feats, weight, bias, activation, k, record.grid, runs)
            out = VoxelTensor._trusted(feats, record.fine, out_ts, record.voxel or vt.cache)
            return _wrap(out, out_ts, out_range, caches, hint)
        if record.voxel is not None:
            vt = VoxelTensor(vt.feats, vt.coords, vt.stride, cache=record.voxel)
    geometry = relconv_geometry(k, lows)
    order = offset_order(geometry) if relabels(weight) else None
    calls = None if runs is None else runs.calls(lows, order is not None)
    if order is None:
        weight = _converted(weight, lows, geometry, runs)
    out = run_checked(vt, weight, geometry.size, s, (1, 1, 1), bias, activation, calls, transposed, order)
    return _wrap(out, out_ts, out_range, caches, hint)


def _grid_conv(
    feats: Tensor,
    kernel: Tensor,
    bias: Tensor | None,
    activation: str | None,
    k: Triple,
    rmap: RelationalMap,
    runs: Runs | None,
) -> Tensor:
    """The conv of `feats` over a grid map (relation = kernel digits, first axis slowest) with
    TorchSparse's `kernel` (`grid_geometry`): reordered, or as it is over the relabelled map
    (`relabels`)."""
    geometry = grid_geometry(k)
    order = offset_order(geometry) if relabels(kernel) else None
    if order is not None:
        rmap, weight = rmap.relabeled(order), kernel
    else:
        weight = _converted(kernel, ("grid", k), geometry, runs)
    if runs is not None:
        return runs.grid_calls(feats, weight, rmap, bias, activation)
    return relational_conv(feats, weight, rmap, bias=bias, activation=activation)


def relabels(kernel: Tensor) -> bool:
    """Whether a conv takes TorchSparse's kernel as it is, over its map relabelled to TorchSparse's
    offset order (`_layout.offset_order`): in training. There the relabelling costs one gather of
    the map (its table's columns on CUDA), once per map, where converting the kernel costs a gather
    per call and two ops per backward (CPU, two tiny scans, median training step:
    `SparseResUNet42` 360 -> 312 ms, `SparseResNet21D` 258 -> 255 ms). Inference keeps the
    converted kernel across calls (`Runs.weight`), which costs nothing per call."""
    return kernel.requires_grad and torch.is_grad_enabled()


def _converted(kernel: Tensor, layout: tuple, geometry: Geometry, runs: Runs | None) -> Tensor:
    """`kernel` in `geometry`'s order: kept by the module's `runs`, or converted for this call."""
    if runs is not None:
        return runs.weight(kernel, layout, geometry)
    index = None if geometry.index is None else torch.tensor(geometry.index, device=kernel.device)
    return to_relconv(kernel, geometry, index)


def _single_offset(weight: Tensor) -> Tensor:
    if weight.dim() != 3 or weight.shape[0] != 1:
        raise ValueError(
            f"weight of a 1x1x1 conv must be [C_in, C_out] or [1, C_in, C_out], got {tuple(weight.shape)}"
        )
    return weight[0]


def _check_weight(weight: Tensor, k: Triple, x: SparseTensor) -> None:
    volume = math.prod(k)
    if weight.dim() != 3 or weight.shape[0] != volume:
        raise ValueError(
            f"weight must have shape [{volume}, C_in, C_out] for kernel_size {k}, got {tuple(weight.shape)}"
        )
    feats = x.feats
    if isinstance(feats, Tensor) and feats.dim() == 2 and feats.shape[1] != weight.shape[1]:
        raise ValueError(f"input has {feats.shape[1]} channels but weight expects C_in = {weight.shape[1]}")


def _wrap(
    out: VoxelTensor, out_ts: Triple, out_range: tuple | None, caches: TensorCache, hint: Tensor | None
) -> SparseTensor:
    """The SparseTensor of a relconv output; its TorchSparse coordinates are `hint` (a strided
    conv's sites), else those paired with relconv's in the cache, else derived on first read."""
    coords = hint
    if coords is None:
        known = caches.pairs.get(out_ts)
        coords = known[0] if known is not None and known[1] is out.coords else None
    result = SparseTensor._from_voxel(out, coords, out_range, caches)
    if out_ts not in caches.cmaps:
        caches.cmaps[out_ts] = (result.coords, out_range)
    return result


def _subm_range(spatial_range: tuple | None, k: Triple, padding: Triple) -> tuple | None:
    if spatial_range is None:
        return None
    return _next_range(spatial_range, k, (1, 1, 1), padding)


def _next_range(spatial_range: Sequence[int], k: Triple, s: Triple, padding: Triple) -> tuple:
    return _range_after(tuple(spatial_range), k, s, padding)


# Every conv call asks for its output range; a network's are few and repeat.
@functools.lru_cache(maxsize=1024)
def _range_after(spatial_range: tuple, k: Triple, s: Triple, padding: Triple) -> tuple:
    if len(spatial_range) != 4:
        raise ValueError(f"spatial_range must be (batch, X, Y, Z) for a conv, got {spatial_range}")
    grid = tuple((spatial_range[i + 1] + 2 * padding[i] - (k[i] - 1) - 1) // s[i] + 1 for i in range(3))
    return (spatial_range[0], *grid)


def _transposed_geometry(
    x: SparseTensor, caches: TensorCache, k: Triple, s: Triple, dilation: Triple, hashmap: bool
):
    if any(t % si for t, si in zip(x.stride, s, strict=True)):
        raise ValueError(f"stride {s} must divide the tensor stride {x.stride} of a transposed conv's input")
    out_ts = tuple(t // si for t, si in zip(x.stride, s, strict=True))
    record = None
    if s == (1, 1, 1):
        lows = torchsparse_lows(k, s, (0, 0, 0), hashmap)
    else:
        record = caches.kmaps.get((out_ts, k, s, dilation))
        if record is None:
            raise ValueError(
                f"a transposed conv (kernel_size {k}, stride {s}) at tensor stride {x.stride} needs the "
                f"map of the strided conv with the same kernel_size and stride from tensor stride {out_ts}, "
                "which this tensor's cache has not seen (TorchSparse reuses that map)"
            )
        lows = record.lows
    fine = caches.cmaps.get(out_ts)
    return lows, out_ts, None if fine is None else fine[1], record


def _downsample(
    x: SparseTensor,
    vt: VoxelTensor,
    caches: TensorCache,
    k: Triple,
    s: Triple,
    padding: Triple,
    dilation: Triple,
    modes: tuple[bool, bool],
) -> DownsampleRecord:
    """TorchSparse's output sites of a strided conv (computed once per geometry and cached), and
    relconv's cache seeded with them so that relconv's strided map runs onto exactly these sites."""
    key = (x.stride, k, s, dilation)
    record = caches.kmaps.get(key)
    if record is not None:
        return record
    hashmap, minkowski = modes
    lows = torchsparse_lows(k, s, padding, hashmap)
    out_ts = tuple(t * si for t, si in zip(x.stride, s, strict=True))
    out_range = None if x.spatial_range is None else _next_range(x.spatial_range, k, s, padding)
    # TorchSparse's "hashmap" mode takes unbounded floor(p / s) sites when kernel = stride (or 1)
    # per axis or in "minkowski" downsampling, else the same bounded sites as the default mode.
    floor = hashmap and (minkowski or all(si in (1, ki) for si, ki in zip(s, k, strict=True)))
    # The default mode's map reads o * s - padding + d, the grid map's; the "hashmap" mode centres
    # its offsets whatever the padding, so it keeps relconv's native map.
    grid = None if hashmap else _grid_map(x.coords, k, s, padding, x.spatial_range, out_range)
    if grid is not None:
        rmap, coords = grid
    else:
        rmap, coords = None, downsample_coords(x.coords, k, s, padding, out_range, floor)
    known = caches.pairs.get(out_ts)
    own = None
    if known is not None and known[0].shape == coords.shape and bool(torch.equal(known[0], coords)):
        coords, fine = known
    else:
        # The sites are unique by construction (the grid map's, or torch.unique's), so the
        # submanifold maps built on them skip the coordinate check and its host wait.
        fine = coords * small_constant((1, *out_ts), coords.device, torch.int32)
        if known is None:
            caches.pairs[out_ts] = (coords, fine)
            vt.cache.add_built(fine, out_ts)
        else:
            # Another geometry reached this stride with other sites: relconv keeps one coordinate
            # set per stride in a cache, so this geometry's maps live in a cache of their own.
            own = MapCache()
            own.coords[x.stride] = vt.coords
            own.add_built(fine, out_ts)
    source = None if rmap is None else GridSource(x.coords, vt.coords, vt.cache)
    record = caches.kmaps[key] = DownsampleRecord(coords, out_range, lows, own, fine, rmap, source)
    return record


def _grid_map(
    coords: Tensor, k: Triple, s: Triple, padding: Triple, in_range: tuple | None, out_range: tuple | None
) -> tuple[RelationalMap, Tensor] | None:
    """(grid map, output sites) of the default mode's strided conv: the sites of `downsample_coords`
    in the same order, and the map onto them in TorchSparse's offsets. None where coordinates may
    be negative (`set_allow_negative_coordinates`), none are given, or no site fits the bound.

    A tensor with a `spatial_range` gives the grid: its coordinates must lie inside it (the map
    builder checks, as TorchSparse's grid kernels index by it), and no host read is needed.
    Otherwise one host read of the coordinates' extent gives it."""
    if get_allow_negative_coordinates() or coords.shape[0] == 0:
        return None
    c = coords if coords.dtype == torch.int32 else coords.int()
    if in_range is not None and out_range is not None:
        batch_size, in_shape, out_shape = in_range[0], list(in_range[1:]), list(out_range[1:])
    else:
        low, top = bounds(c)
        if min(low) < 0:
            return None
        batch_size, in_shape = top[0] + 1, [t + 1 for t in top[1:]]
        out_shape = [(top[a + 1] + 2 * padding[a] - (k[a] - 1)) // s[a] + 1 for a in range(3)]
    if min(out_shape) < 1:
        return None
    return build_map(c, batch_size, in_shape, out_shape, list(k), list(s), list(padding), [1, 1, 1], False)


def downsample_coords(
    coords: Tensor,
    k: Triple,
    s: Triple,
    padding: Triple,
    out_range: tuple | None,
    floor: bool = False,
) -> Tensor:
    """[M, 4] int32 output sites of TorchSparse 2.1's strided conv, sorted by (batch, x, y, z);
    `floor`: the unbounded `unique(floor(p / s))` instead."""
    c = coords.long()
    device = c.device
    if c.shape[0] == 0:
        return coords.new_zeros(0, 4, dtype=torch.int32)
    if floor:
        step = small_constant((1, *s), device)
        return torch.unique(torch.div(c, step, rounding_mode="floor"), dim=0).to(torch.int32)
    kt, st, pt = small_constant(k, device), small_constant(s, device), small_constant(padding, device)
    if out_range is not None:
        hi = small_constant([r - 1 for r in out_range[1:]], device)
    else:
        hi = torch.div(c[:, 1:].amax(0) + 2 * pt - (kt - 1), st, rounding_mode="floor")
    if get_allow_negative_coordinates():
        lo = torch.div(c[:, 1:].amin(0) - 2 * pt + (kt - 1), st, rounding_mode="trunc")
    else:
        lo = torch.zeros(3, dtype=torch.int64, device=device)
    size = (hi - lo + 1).clamp_(min=0)
    batch = c[:, 0]
    key = batch
    valid = torch.ones_like(batch, dtype=torch.bool)
    for a in range(3):
        # o * s = p + padding - d for a digit d in 0..k-1: the ceil(k / s) values of o at and below
        # floor((p + padding) / s) whose digit p + padding - o * s stays below k.
        m = -(-k[a] // s[a])
        top = torch.div(c[:, a + 1] + padding[a], s[a], rounding_mode="floor")
        o = top[:, None] - torch.arange(m, device=device)  # [N, m]
        ok = (c[:, a + 1, None] + padding[a] - o * s[a] < k[a]) & (o >= lo[a]) & (o <= hi[a])
        key = key.unsqueeze(-1) * size[a] + (o - lo[a]).view((-1,) + (1,) * a + (m,))
        valid = valid.unsqueeze(-1) & ok.view((-1,) + (1,) * a + (m,))
    keys = torch.unique(key[valid], sorted=True)
    out = torch.empty(keys.shape[0], 4, dtype=torch.int64, device=device)
    for a in (2, 1, 0):
        out[:, a + 1] = keys % size[a] + lo[a]
        keys = torch.div(keys, size[a], rounding_mode="floor")
    out[:, 0] = keys
    return out.to(torch.int32)


class Conv3d(nn.Module):
    """TorchSparse 2.1's `torchsparse.nn.Conv3d` (see the module docstring for the geometry).

    Parameters as TorchSparse's: `kernel` `[K, C_in, C_out]` in TorchSparse's offset order
    (`[C_in, C_out]` for a 1x1x1 stride-1 kernel) and `bias` `[C_out]` or None, so its
    state_dicts load unchanged. Of `config`, the map fields are read (see `conv_config`).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int] = 3,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int = 1,
        bias: bool = False,
        transposed: bool = False,
        generative: bool = False,
        config: dict | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = make_ntuple(kernel_size, 3, "kernel_size")
        self.stride = make_ntuple(stride, 3, "stride")
        self.dilation = dilation
        given = make_ntuple(padding, 3, "padding")
        _check_geometry(self.kernel_size, self.stride, given, make_ntuple(dilation, 3, "dilation"))
        # TorchSparse's rule: an odd-sized stride-1 axis is always centred.
        self.padding = tuple(
            (k - 1) // 2 if k % 2 == 1 and s == 1 else p
            for k, s, p in zip(self.kernel_size, self.stride, given, strict=True)
        )
        if generative and not transposed:
            raise ValueError("generative=True needs transposed=True")
        self.transposed, self.generative = transposed, generative
        self._config = config
        if make_ntuple(dilation, 3, "dilation") != (1, 1, 1):
            warnings.warn(
                "TorchSparse 2.1 builds kernel maps without dilation; relconv.torchsparse does the same, "
                f"so dilation={dilation!r} has no effect (use relconv.voxel.Conv3d for dilated convs)",
                stacklevel=2,
            )
        self.kernel_volume = math.prod(self.kernel_size)
        if self.kernel_volume > 1 or self.stride != (1, 1, 1):
            self.kernel = nn.Parameter(torch.zeros(self.kernel_volume, in_channels, out_channels))
        else:
            self.kernel = nn.Parameter(torch.zeros(in_channels, out_channels))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)
        self._runs = Runs(self)
        self._dilation3 = make_ntuple(dilation, 3, "dilation")
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # TorchSparse's initialisation: uniform(+-1/sqrt(fan)), fan over the input channels (output
        # channels for a transposed conv) times the kernel volume.
        std = 1 / math.sqrt((self.out_channels if self.transposed else self.in_channels) * self.kernel_volume)
        with torch.no_grad():
            self.kernel.uniform_(-std, std)
            if self.bias is not None:
                self.bias.uniform_(-std, std)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        if self.stride != (1, 1, 1):
            s += f", stride={self.stride}"
        if self.dilation != 1:
            s += f", dilation={self.dilation}"
        if self.bias is None:
            s += ", bias=False"
        if self.transposed:
            s += ", transposed=True"
        if self.generative:
            s += ", generative=True"
        return s

    def forward(self, input: SparseTensor) -> SparseTensor:
        if not isinstance(input, SparseTensor):
            raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
        if self.generative:
            raise NotImplementedError(GENERATIVE_MESSAGE)
        if not torch.is_grad_enabled() and inference_folding_enabled():
            return PendingConv(self, input)  # a following eval BatchNorm and ReLU join the conv
        params = self._parameters
        return self.run(input, params["kernel"], params["bias"])

    def run(self, input: SparseTensor, kernel: Tensor, bias: Tensor | None, activation: str | None = None):
        """This layer's conv of `input` with `kernel` and `bias` in its own layout (its parameters,
        or their BatchNorm-folded form) and an optional "relu" epilogue."""
        runs = self._runs
        if runs.owner() is not self:
            runs = self._runs = Runs(self)
        modes = map_modes(self._config)
        return run_conv(
            input,
            kernel,
            bias,
            self.kernel_size,
            self.stride,
            self.padding,
            self._dilation3,
            self.transposed,
            modes,
            runs,
            activation,
        )
