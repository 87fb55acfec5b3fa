"""Kernel maps of voxel layers, in one place: the map cache of a coordinate set (`MapCache`), the
map a layer applies (`layer_map`, which finds or builds it), and one builder per map kind
(`submanifold_map`, `strided_map`, `transposed_map`, `generative_map`).

Automatic reuse: maps are keyed by (kind, tensor stride, kernel size, conv stride, dilation), so every
layer with the same geometry on tensors derived from the same coordinates shares one map. Explicit
reuse: an `indice_key` names a map; a transposed conv with the name of an earlier strided conv runs
that map transposed and returns the strided conv's input coordinates (spconv's inverse conv).

CUDA coordinates go to the `relconv::coord_hash` / `kernel_map_table` / `strided_coords` ops
(relconv.ops.coord_ops; a map from a set with no hash yet runs them, and the check of the new set, as
one op call: `hashed_submanifold_table`, `hashed_strided_table`): a hash table over the coordinate
rows (kept per coordinate set in a `CoordIndex`) answers every kernel-offset query of every output
straight into the output-stationary neighbour table `[num_out, K]`, and the map is built from that
table with its pair lists left to materialise on first use. No coordinate bounds, no packing, no
copies from the host; host syncs: one to validate a new coordinate set (none for coordinates
relconv's strided builder made) and one per downsampling step to size its output (the validation
read rides along with it).

CPU coordinates (and generative maps) take the key path: each builder packs the coordinates into
int64 keys (`KeyPacking`, below) and sorts the input and output keys once; output o meets input i
through kernel offset k where key_in = key_out + delta_k, so each offset's queries ascend with the
sorted output keys and one walk over the input keys answers them (`relconv::sorted_key_pairs`, the
offsets across threads). The hits become the pairs of a `RelationalMap` whose relation is the
kernel offset index, grouped by offset and, within an offset, sorted by output row: the canonical
(relation, out, in) order of `RelationalMap.from_triples`, built without its extra sort.
Strided output coordinates come out sorted by (batch, x, y, z) on this path and in order of first
occurrence on the CUDA path; both are the same set.

Keys (also VoxelTensor.coalesce's and voxelize's): a key is `((b * Sx + x') * Sy + y') * Sz + z'`
with `x' = x - lo_x` etc., where `lo` is the per-call minimum minus a margin and `S` the per-axis
span plus the margin on both sides. Because every shifted field stays in `[0, S)` for all
coordinates a call can form (inputs, outputs and input + kernel offset), adding an offset's key
delta to a key is the key of the offset coordinate: no carries, no aliasing. Negative coordinates
are therefore accepted everywhere (the shift makes them non-negative); only scenes whose packed span
exceeds 62 bits are rejected, before any key is formed.

Offsets follow `relconv.voxel.conv`'s convention: x slowest, z fastest; per axis an odd kernel k
covers -(k-1)/2 .. (k-1)/2 and an even kernel covers 0 .. k-1, times dilation * tensor stride.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from relconv.core import RelationalMap, index_dtype_for
from relconv.ops import coord_ops
from relconv.voxel.utils import Triple, small_constant

# ---------------------------------------------------------------------------- coordinate keys

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
        return ((c - small_constant(self.lo, c.device)) * small_constant(self.mult, c.device)).sum(1)

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
        return (offsets.long() * small_constant(self.mult[1:], offsets.device)).sum(1)


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


# ---------------------------------------------------------------------------- the CUDA hash table


class CoordIndex:
    """CUDA hash table over one coordinate set's rows, built on first use, and its validation state.

    Shared through `MapCache` by every map built from the same coordinates. `trusted=True` marks
    coordinates that are valid by construction (outputs of `strided_map` and of the grid maps,
    `MapCache.add_built`), so they are never read back; otherwise the insert kernel's error word
    (duplicates, negative batch) is read once, the first time a map needs it.

    A set of `RELEASE_ROWS` rows or more gives its table back once a map has been built from it
    (`map_built`), and a later map with another geometry hashes the rows again. A network builds
    each level's maps once and reuses them, so this costs about one rebuild per level, while
    keeping the table would hold 8 to 16 bytes per row (32 MiB at 3.5M rows) through the layer's
    peak memory. On an H100 at 3.5M voxels (C64 fp16, fresh maps): a subm 3^3 layer's peak extra
    memory 837 -> 804 MiB (spconv: 818), a subm 3^3 + down 2^3 pair 4.83 -> 4.96 ms. On an H200
    (fp16, kept -> given back): the 937k-row aggregate's fresh subm 3^3 C64 layer 222.4 -> 214.4 MiB
    (spconv 215-218) at the same time, its MinkUNet 1.0 inference 26.4 -> 27.0 ms; the 310k-row
    room's layer 73.7 -> 69.7 MiB (spconv 72.5) but its MinkUNet inference 6-8% slower (latency
    10.2 -> 10.9 ms, queued 10.3 -> 10.9, medians of three alternating runs). Smaller sets keep it:
    there the rebuild's launches cost more than the memory.
    """

    RELEASE_ROWS = 1 << 19

    __slots__ = ("coords", "validated", "_slots", "_error", "_ticket")

    def __init__(self, coords: Tensor, trusted: bool = False) -> None:
        self.coords = coords
        self.validated = trusted
        self._slots: Tensor | None = None
        self._error: Tensor | None = None
        self._ticket = -1  # the host copy of _error published by hashed_submanifold_table, -1 none

    def slots(self) -> Tensor:
        """The hash table (int32 row per slot, -1 empty); no host synchronisation."""
        if self._slots is None:
            self._slots, error = coord_ops.coord_hash(self.coords)
            if not self.validated:
                self._error = error
        return self._slots

    def pending_error(self) -> Tensor | None:
        """The device error word while the coordinates are unchecked, else None."""
        if self.validated:
            return None
        if self._error is None:
            self.slots()
        return self._error

    @property
    def hashed(self) -> bool:
        """Whether the hash table is built (and not given back, see `map_built`)."""
        return self._slots is not None

    def adopt(self, slots: Tensor, error: Tensor | None, ticket: int = -1) -> None:
        """Keeps the hash table of these coordinates that an op built (`hashed_submanifold_table`,
        `hashed_strided_table`) and, while the set is unchecked, that hash's error word (None: the op
        checked it) with the ticket of its published host copy, if any."""
        self._slots = slots
        if error is None:
            self.validated, self._error, self._ticket = True, None, -1
        elif not self.validated:
            self._error, self._ticket = error, ticket

    def ensure_valid(self) -> None:
        """Raises ValueError for duplicate rows or negative batch indices (one host wait, first call
        only: for the word the map op published, else one sync).
        A downsampling step checks its input inside its op instead (`strided_coords`, ...)."""
        error = self.pending_error()
        if error is None:
            return
        coord_ops.check_coords(error, self._ticket)
        self.validated = True
        self._error, self._ticket = None, -1

    def map_built(self) -> None:
        """After a map's table kernel is queued: a large set gives its hash table back (see above)."""
        if self._slots is None or self.coords.shape[0] < self.RELEASE_ROWS:
            return
        # The word shares the table's buffer: an unchecked set keeps a copy of it.
        self._error = self._error.clone() if self._error is not None and not self.validated else None
        self._slots = None


# ---------------------------------------------------------------------------- the cache


@dataclass
class MapEntry:
    """One built kernel map and the coordinates on both of its sides."""

    rmap: RelationalMap
    in_coords: Tensor
    in_stride: Triple
    out_coords: Tensor
    out_stride: Triple
    transposed: RelationalMap | None = None


@dataclass
class MapCache:
    """Kernel maps shared by every tensor derived from one set of coordinates.

    `coords` holds the coordinates at each tensor stride reached so far (a transposed conv finds its
    output coordinates here), `maps` the maps keyed by (kind, tensor stride, kernel size, conv stride,
    dilation), `named` the maps registered under an `indice_key` and `indexes` the CUDA hash table
    and validation state of the coordinates at each tensor stride.
    """

    coords: dict[Triple, Tensor] = field(default_factory=dict)
    maps: dict[tuple, MapEntry] = field(default_factory=dict)
    named: dict[str, MapEntry] = field(default_factory=dict)
    indexes: dict[Triple, CoordIndex] = field(default_factory=dict)

    def add_built(self, coords: Tensor, stride: Triple) -> None:
        """Keeps `coords` at tensor stride `stride` as valid by construction: the output sites of a
        relconv map builder (unique, batch indices checked by the builder), so that no map built on
        them checks them again (on CUDA a wait for the check's error word)."""
        self.coords[stride] = coords
        if coords.is_cuda:
            self.indexes[stride] = CoordIndex(coords, trusted=True)

    def coord_index(self, coords: Tensor, stride: Triple) -> CoordIndex | None:
        """The `CoordIndex` of CUDA `coords` at tensor stride `stride` (created once); None on CPU."""
        if not coords.is_cuda:
            return None
        index = self.indexes.get(stride)
        if index is None or index.coords is not coords:
            index = CoordIndex(coords)
            self.indexes[stride] = index
        return index


# ---------------------------------------------------------------------------- a layer's map


class Voxels(Protocol):
    """What a layer's map reads of its input (a VoxelTensor)."""

    coords: Tensor
    stride: Triple
    cache: MapCache

    def __len__(self) -> int: ...


class LayerMap(NamedTuple):
    """What a layer runs: the map, the coordinates, stride and cache of its output, and (with
    `layer_map(defer_check=True)`) the input's coordinate index whose check is still to run."""

    rmap: RelationalMap
    out_coords: Tensor
    out_stride: Triple
    out_cache: MapCache
    unchecked: CoordIndex | None = None


def layer_map(
    x: Voxels,
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
    x: Voxels, k: Triple, s: Triple, d: Triple, generative: bool, defer_check: bool
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
        rmap, out = generative_map(x.coords, k, s, d, ts)
        entry = MapEntry(rmap, x.coords, ts, out, tuple(t // si for t, si in zip(ts, s, strict=True)))
    elif s == (1, 1, 1):
        index = x.cache.coord_index(x.coords, ts)
        # Checked inside the map op unless deferred (one op call less; see layer_map).
        rmap = submanifold_map(x.coords, k, d, ts, index=index, validate=not defer_check)
        entry = MapEntry(rmap, x.coords, ts, x.coords, ts)
    else:
        out_ts = tuple(t * si for t, si in zip(ts, s, strict=True))
        known = x.cache.coords.get(out_ts)
        index = x.cache.coord_index(x.coords, ts)
        rmap, out = strided_map(x.coords, k, s, d, ts, out_coords=known, index=index)
        if known is None:
            x.cache.add_built(out, out_ts)  # relconv's strided builder's sites: never read back
        entry = MapEntry(rmap, x.coords, ts, out, out_ts)
    x.cache.maps[key] = entry
    return entry


def _downsampling_entry_for_transpose(x: Voxels, k: Triple, s: Triple, d: Triple) -> MapEntry:
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
        entry = MapEntry(submanifold_map(fine, k, d, out_ts, index=index), fine, out_ts, fine, out_ts)
    else:
        rmap, out = strided_map(fine, k, s, d, out_ts, out_coords=x.coords, index=index)
        entry = MapEntry(rmap, fine, out_ts, out, ts)
    x.cache.maps[key] = entry
    return entry


def _transposed(entry: MapEntry) -> RelationalMap:
    if entry.transposed is None:
        entry.transposed = transposed_map(entry.rmap)
    return entry.transposed


def _reuse_named(x: Voxels, entry: MapEntry, name: str, transposed: bool) -> tuple:
    expected = entry.out_coords.shape[0] if transposed else entry.in_coords.shape[0]
    side = "output" if transposed else "input"
    if expected != x.feats.shape[0]:
        raise ValueError(
            f"indice_key {name!r} names a map whose {side} has {expected} voxels, but the input has "
            f"{len(x)}; a transposed conv reuses the map of the strided conv it inverts"
        )
    return (_transposed(entry) if transposed else entry.rmap), entry


# ---------------------------------------------------------------------------- builders


def _index_for(coords: Tensor, index: CoordIndex | None) -> CoordIndex:
    if index is not None and index.coords is not coords:
        raise ValueError("index must be the CoordIndex of these coords")
    return index if index is not None else CoordIndex(coords)


def _table_map(
    in_coords: Tensor,
    index: CoordIndex,
    out_coords: Tensor,
    kernel_size: Triple,
    step: Triple,
    validate: bool,
) -> RelationalMap:
    """Map given by the CUDA neighbour table of `out_coords` against the hashed `in_coords`; with
    `validate`, unchecked input coordinates are checked once the table kernel is queued (one sync,
    which then waits for the whole build)."""
    num_in, num_out = in_coords.shape[0], out_coords.shape[0]
    volume = kernel_size[0] * kernel_size[1] * kernel_size[2]
    dtype = index_dtype_for(num_in, num_out, num_out * volume)
    table = coord_ops.kernel_map_table(in_coords, index.slots(), out_coords, kernel_size, step, dtype)
    if validate:
        index.ensure_valid()
    return _from_table(table, index)


def _from_table(table: Tensor, index: CoordIndex) -> RelationalMap:
    index.map_built()
    # A kernel offset maps an input to at most one output and back (q = p - offset): injective.
    return RelationalMap.from_neighbor_table(table, index.coords.shape[0], validate=False, injective=True)


def axis_offsets(k: int) -> range:
    """Offsets of one axis of a size-`k` kernel: centred for odd k, 0..k-1 for even k."""
    return range(-(k // 2), k // 2 + 1) if k % 2 else range(0, k)


def kernel_offsets(kernel_size: Triple, device: torch.device | str | None = None) -> Tensor:
    """[K, 3] int64 unit offsets in weight order (x slowest, z fastest), K = kx * ky * kz."""
    axes = [torch.tensor(list(axis_offsets(k)), dtype=torch.int64, device=device) for k in kernel_size]
    grid = torch.meshgrid(*axes, indexing="ij")
    return torch.stack([g.reshape(-1) for g in grid], 1)


def _reach(kernel_size: Triple, step: Triple) -> tuple[int, int, int]:
    """Largest |offset| per axis, in coordinate units."""
    return tuple(max(abs(o) for o in axis_offsets(k)) * s for k, s in zip(kernel_size, step, strict=True))


def _scaled(offsets: Tensor, step: Triple) -> Tensor:
    return offsets * torch.tensor(step, dtype=torch.int64, device=offsets.device)


def _sorted_keys(packing: KeyPacking, coords: Tensor) -> tuple[Tensor, Tensor]:
    """Sorted keys and the permutation; raises on duplicate coordinates."""
    keys, perm = torch.sort(packing.pack(coords))
    if keys.numel() > 1 and bool((keys[1:] == keys[:-1]).any()):
        raise ValueError(
            "coords contain duplicate (batch, x, y, z) rows; merge them first with "
            "VoxelTensor.coalesce() or voxelize()"
        )
    return keys, perm


def _empty_map(num_relations: int, num_in: int, num_out: int, device: torch.device) -> RelationalMap:
    idt = index_dtype_for(num_in, num_out)
    empty = torch.empty(0, dtype=idt, device=device)
    ptr = torch.zeros(num_relations + 1, dtype=torch.int64, device=device)
    return RelationalMap(empty, empty, ptr, num_in, num_out, injective=True, validate=False)


def _search(
    sorted_keys: Tensor, perm: Tensor, out_keys: Tensor, out_perm: Tensor, deltas: Tensor
) -> RelationalMap:
    """Pairs (perm[i], out_perm[j], k) where sorted_keys[i] == out_keys[j] + deltas[k], both key lists
    sorted: one walk over the input keys per relation (`relconv::sorted_key_pairs`)."""
    num_rel, num_in, num_out = deltas.numel(), sorted_keys.numel(), out_keys.numel()
    if num_in == 0 or num_out == 0:
        return _empty_map(num_rel, num_in, num_out, sorted_keys.device)
    inp, out, ptr = _SORTED_KEY_PAIRS(sorted_keys, perm, out_keys, out_perm, deltas)
    idt = index_dtype_for(num_in, num_out, inp.numel())
    return RelationalMap(inp.to(idt), out.to(idt), ptr, num_in, num_out, injective=True, validate=False)


_SORTED_KEY_PAIRS = torch.ops.relconv.sorted_key_pairs.default


def submanifold_map(
    coords: Tensor,
    kernel_size: Triple,
    dilation: Triple,
    tensor_stride: Triple,
    index: CoordIndex | None = None,
    validate: bool = True,
) -> RelationalMap:
    """Map with output coordinates = input coordinates: pair (i, o, k) iff p_i = p_o + offset_k.

    Args:
        coords: [N, 4] int32 (batch, x, y, z), multiples of `tensor_stride`, no duplicates.
        index: CUDA only: the coordinates' cached `CoordIndex`; with a validated one the build does
            no host synchronisation.
        validate: CUDA only: read an unchecked index's error word before returning (a wait for
            the hash insert, or one sync when the index was hashed earlier).
            False leaves that to the caller (`index.ensure_valid()`), who may first queue work on
            the map: the table holds valid row indices even for bad coordinates, so that work is
            memory-safe, and its result must not escape before the check.
    Returns:
        RelationalMap with num_in = num_out = N, K = prod(kernel_size) relations.
    """
    step = tuple(d * t for d, t in zip(dilation, tensor_stride, strict=True))
    if coords.is_cuda:
        index = _index_for(coords, index)
        if not index.hashed:  # hash, table and (validate) check in one op call
            check, keeps_hash = validate and not index.validated, coords.shape[0] < index.RELEASE_ROWS
            # A set that keeps its hash gets table and hash in one allocation.
            # A check left to the caller reads the word's published host copy (its ticket).
            early = not validate and not index.validated
            slots, table, error, ticket = coord_ops.hashed_submanifold_table(
                coords, kernel_size, step, check, keeps_hash, early
            )
            index.adopt(slots, None if check else error, ticket)
            return _from_table(table, index)
        return _table_map(coords, index, coords, kernel_size, step, validate)
    lo, hi = bounds(coords)
    packing = make_packing(lo, hi, _reach(kernel_size, step))
    keys, perm = _sorted_keys(packing, coords)
    deltas = packing.delta(_scaled(kernel_offsets(kernel_size, coords.device), step))
    return _search(keys, perm, keys, perm, deltas)


def strided_output_coords(coords: Tensor, stride: Triple, tensor_stride: Triple) -> Tensor:
    """[M, 4] int32 unique `floor(p / (s * t)) * (s * t)` per axis, sorted by (batch, x, y, z)."""
    out_step = tuple(s * t for s, t in zip(stride, tensor_stride, strict=True))
    lo, hi = bounds(coords)
    packing = make_packing(lo, hi, out_step)
    return packing.unpack(_coarse_keys(coords, out_step, packing))


def _coarse_keys(coords: Tensor, out_step: Triple, packing: KeyPacking) -> Tensor:
    """The packed keys of the strided output sites, unique and ascending."""
    c = coords.long()
    step = small_constant((1, *out_step), c.device)
    coarse = torch.div(c, step, rounding_mode="floor") * step
    return torch.unique(packing.pack(coarse), sorted=True)


def strided_map(
    coords: Tensor,
    kernel_size: Triple,
    stride: Triple,
    dilation: Triple,
    tensor_stride: Triple,
    out_coords: Tensor | None = None,
    index: CoordIndex | None = None,
) -> tuple[RelationalMap, Tensor]:
    """Downsampling map: outputs q = unique(floor(p / (s*t)) * (s*t)); pair iff p_i = q_o + offset_k.

    Args:
        coords: [N, 4] int32 input coordinates at tensor stride `tensor_stride`.
        out_coords: the output coordinates when already known (e.g. cached on the tensor); they
            must be the same set as `strided_output_coords(coords, stride, tensor_stride)`.
        index: CUDA only: the input coordinates' cached `CoordIndex`.
    Returns:
        (map with num_in = N and num_out = M, out_coords [M, 4] int32 at tensor stride s * t;
        sorted by (batch, x, y, z) on CPU, in order of first occurrence on CUDA).
    """
    step = tuple(d * t for d, t in zip(dilation, tensor_stride, strict=True))
    out_step = tuple(s * t for s, t in zip(stride, tensor_stride, strict=True))
    if coords.is_cuda:
        index = _index_for(coords, index)
        if out_coords is None:
            # The one host sync of a downsampling step; it also reads the input's error word.
            if not index.hashed:  # hash, coarse sites, check and table in one op call
                check = not index.validated
                slots, out_coords, table = coord_ops.hashed_strided_table(
                    coords, kernel_size, step, out_step, check
                )
                index.adopt(slots, None)
                return _from_table(table, index), out_coords
            out_coords = coord_ops.strided_coords(coords, out_step, index.pending_error())
            index.validated = True
        return _table_map(coords, index, out_coords, kernel_size, step, validate=True), out_coords
    reach = _reach(kernel_size, step)
    lo, hi = bounds(coords)
    packing = make_packing(lo, hi, tuple(r + s for r, s in zip(reach, out_step, strict=True)))
    if out_coords is None:
        # Made in key order: the search takes them as they are.
        out_keys = _coarse_keys(coords, out_step, packing)
        out_coords, out_perm = packing.unpack(out_keys), torch.arange(out_keys.numel(), device=coords.device)
    else:
        out_keys, out_perm = torch.sort(packing.pack(out_coords))
    keys, perm = _sorted_keys(packing, coords)
    deltas = packing.delta(_scaled(kernel_offsets(kernel_size, coords.device), step))
    return _search(keys, perm, out_keys, out_perm, deltas), out_coords


def transposed_map(forward: RelationalMap) -> RelationalMap:
    """The strided map with inputs and outputs swapped, keeping `unique_slots` and `injective`.

    A voxel map is injective both ways for a fixed offset (q = p - offset), so the transposed map
    still has at most one input per (output, offset) slot. relconv's builders flag their maps
    `injective`, and `RelationalMap.transpose()` of such a map keeps the flag (a CUDA table map
    transposes its table on the device: no pairs, no sync). A map built elsewhere without the flag
    gets `unique_slots` only: an unchecked `injective` would let a transposed table drop pairs
    from an input gradient.
    """
    if forward.injective:
        return forward.transpose()
    return RelationalMap(
        forward.out_index,
        forward.in_index,
        forward.rel_ptr,
        forward.num_out,
        forward.num_in,
        unique_slots=True,
        validate=False,
    )


def generative_map(
    coords: Tensor, kernel_size: Triple, stride: Triple, dilation: Triple, tensor_stride: Triple
) -> tuple[RelationalMap, Tensor]:
    """Generative transposed map: outputs are all q + offset_k * dilation * (t / s), new coordinates.

    Output tensor stride is t / s per axis (`tensor_stride` must be divisible by `stride`). This is
    exactly the support of a dense `conv_transpose3d` with the same kernel, stride and dilation.
    Returns (map with num_in = N, out_coords [M, 4] int32 sorted by (batch, x, y, z)).
    """
    out_ts = tuple(t // s for t, s in zip(tensor_stride, stride, strict=True))
    step = tuple(d * t for d, t in zip(dilation, out_ts, strict=True))
    lo, hi = bounds(coords)
    packing = make_packing(lo, hi, _reach(kernel_size, step))
    in_keys, perm = _sorted_keys(packing, coords)
    deltas = packing.delta(_scaled(kernel_offsets(kernel_size, coords.device), step))
    # Iterating inputs in key order makes each offset's output keys ascending, so the pairs come out
    # grouped by offset and sorted by output row with no further sort.
    generated = deltas[:, None] + in_keys[None, :]
    out_keys = torch.unique(generated, sorted=True)
    out_coords = packing.unpack(out_keys)
    num_rel, num_in, num_out = deltas.numel(), coords.shape[0], out_keys.numel()
    if num_in == 0:
        return _empty_map(num_rel, 0, 0, coords.device), out_coords
    out = torch.searchsorted(out_keys, generated).reshape(-1)
    inp = perm.repeat(num_rel)
    ptr = torch.arange(num_rel + 1, dtype=torch.int64, device=coords.device) * num_in
    idt = index_dtype_for(num_in, num_out, inp.numel())
    rmap = RelationalMap(inp.to(idt), out.to(idt), ptr, num_in, num_out, injective=True, validate=False)
    return rmap, out_coords
