"""Finding or building the kernel map of a layer, through the tensor's shared `MapCache`.

Automatic reuse: maps are keyed by (kind, tensor stride, kernel size, conv stride, dilation), so every
layer with the same geometry on tensors derived from the same coordinates shares one map. Explicit
reuse: an `indice_key` names a map; a transposed conv with the name of an earlier strided conv runs
that map transposed and returns the strided conv's input coordinates (spconv's inverse conv).
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from relconv.core import RelationalMap
from relconv.voxel import kernel_map as km
from relconv.voxel.tensor import MapCache, MapEntry, VoxelTensor
from relconv.voxel.utils import Triple


class LayerMap(NamedTuple):
    """What a layer runs: the map, the coordinates, stride and cache of its output, and (with
    `layer_map(defer_check=True)`) the input's coordinate index whose check is still to run."""

    rmap: RelationalMap
    out_coords: Tensor
    out_stride: Triple
    out_cache: MapCache
    unchecked: km.CoordIndex | None = None


def layer_map(
    x: VoxelTensor,
    kernel_size: Triple,
    stride: Triple,
    dilation: Triple,
    transposed: bool = False,
    generative: bool = False,
    indice_key: str | None = None,
    defer_check: bool = False,
) -> LayerMap:
    """The map a conv/pool layer applies to `x`, from the cache or freshly built (then cached).

    A plain transposed conv outputs the coordinates the matching strided conv started from; a
    generative one outputs new coordinates and so starts a new cache for them.
    A new CUDA coordinate set is checked (duplicates, batch indices: one host sync) before this
    returns, so nothing computed over a bad set is ever queued; with `defer_check` a submanifold
    map's check is left to the caller instead (`LayerMap.unchecked.ensure_valid()`, before anything
    computed over the map leaves it: work queued over the map before the check is memory-safe,
    see `submanifold_map`, and the map's kernels run while the host queues it).
    """
    cache = x.cache
    named = cache.named.get(indice_key) if indice_key is not None else None
    if named is not None:
        rmap, entry = _reuse_named(x, named, indice_key, transposed and not generative)
    elif transposed and not generative:
        entry = _downsampling_entry_for_transpose(x, kernel_size, stride, dilation)
        rmap = _transposed(entry)
    else:
        entry = _forward_entry(x, kernel_size, stride, dilation, generative, defer_check)
        rmap = entry.rmap
    if indice_key is not None:
        cache.named.setdefault(indice_key, entry)
    # Only a submanifold build leaves its input unchecked (_forward_entry); a check that raised
    # leaves it so for the next layer too.
    index = cache.indexes.get(x.stride)
    unchecked = index if index is not None and not index.validated and index.coords is x.coords else None
    if unchecked is not None and not defer_check:
        unchecked.ensure_valid()
        unchecked = None
    if transposed and not generative:
        return LayerMap(rmap, entry.in_coords, entry.in_stride, cache, unchecked)
    if generative:
        fresh = MapCache()
        fresh.coords[entry.out_stride] = entry.out_coords
        return LayerMap(rmap, entry.out_coords, entry.out_stride, fresh, unchecked)
    return LayerMap(rmap, entry.out_coords, entry.out_stride, cache, unchecked)


def _forward_entry(
    x: VoxelTensor, k: Triple, s: Triple, d: Triple, generative: bool, defer_check: bool
) -> MapEntry:
    ts = x.stride
    if generative:
        if any(t % si for t, si in zip(ts, s, strict=True)):
            raise ValueError(f"stride {s} must divide the tensor stride {ts} of a generative conv's input")
        key = ("generative", ts, k, s, d)
    else:
        key = ("submanifold", ts, k, d) if s == (1, 1, 1) else ("strided", ts, k, s, d)
    entry = x.cache.maps.get(key)
    if entry is not None and entry.in_coords.shape[0] == x.feats.shape[0]:
        return entry
    if generative:  # the torch path: no CUDA hash table to share
        rmap, out = km.generative_map(x.coords, k, s, d, ts)
        entry = MapEntry(rmap, x.coords, ts, out, tuple(t // si for t, si in zip(ts, s, strict=True)))
    elif s == (1, 1, 1):
        index = x.cache.coord_index(x.coords, ts)
        # Checked inside the map op unless deferred (one op call less; see layer_map).
        rmap = km.submanifold_map(x.coords, k, d, ts, index=index, validate=not defer_check)
        entry = MapEntry(rmap, x.coords, ts, x.coords, ts)
    else:
        out_ts = tuple(t * si for t, si in zip(ts, s, strict=True))
        known = x.cache.coords.get(out_ts)
        index = x.cache.coord_index(x.coords, ts)
        rmap, out = km.strided_map(x.coords, k, s, d, ts, out_coords=known, index=index)
        if known is None:
            x.cache.coords[out_ts] = out
            if out.is_cuda:
                # Made by relconv's strided builder: unique by construction, never read back.
                x.cache.indexes[out_ts] = km.CoordIndex(out, trusted=True)
        entry = MapEntry(rmap, x.coords, ts, out, out_ts)
    x.cache.maps[key] = entry
    return entry


def _downsampling_entry_for_transpose(x: VoxelTensor, k: Triple, s: Triple, d: Triple) -> MapEntry:
    ts = x.stride
    if any(t % si for t, si in zip(ts, s, strict=True)):
        raise ValueError(f"stride {s} must divide the tensor stride {ts} of a transposed conv's input")
    out_ts = tuple(t // si for t, si in zip(ts, s, strict=True))
    key = ("strided", out_ts, k, s, d) if s != (1, 1, 1) else ("submanifold", out_ts, k, d)
    entry = x.cache.maps.get(key)
    if entry is not None and entry.out_coords.shape[0] == x.feats.shape[0]:
        return entry
    fine = x.cache.coords.get(out_ts)
    if fine is None:
        raise ValueError(
            f"transposed conv needs the coordinates at tensor stride {out_ts}, which this tensor's "
            "cache has not seen; downsample from them first, pass the indice_key of that strided "
            "conv, or use generative=True to create new coordinates"
        )
    index = x.cache.coord_index(fine, out_ts)
    if s == (1, 1, 1):
        entry = MapEntry(km.submanifold_map(fine, k, d, out_ts, index=index), fine, out_ts, fine, out_ts)
    else:
        rmap, out = km.strided_map(fine, k, s, d, out_ts, out_coords=x.coords, index=index)
        entry = MapEntry(rmap, fine, out_ts, out, ts)
    x.cache.maps[key] = entry
    return entry


def _transposed(entry: MapEntry) -> RelationalMap:
    if entry.transposed is None:
        entry.transposed = km.transposed_map(entry.rmap)
    return entry.transposed


def _reuse_named(x: VoxelTensor, entry: MapEntry, name: str, transposed: bool) -> tuple:
    expected = entry.out_coords.shape[0] if transposed else entry.in_coords.shape[0]
    side = "output" if transposed else "input"
    if expected != x.feats.shape[0]:
        raise ValueError(
            f"indice_key {name!r} names a map whose {side} has {expected} voxels, but the input has "
            f"{len(x)}; a transposed conv reuses the map of the strided conv it inverts"
        )
    return (_transposed(entry) if transposed else entry.rmap), entry
