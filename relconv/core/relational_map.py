"""RelationalMap: the (input, output, relation) pairs that every relconv op consumes."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

_INT32_MAX = 2**31 - 1


def index_dtype_for(*sizes: int) -> torch.dtype:
    """int32 while every index and pair count fits, int64 beyond 2^31 - 1."""
    return torch.int32 if max(sizes, default=0) <= _INT32_MAX else torch.int64


# The builders of the views that the conv kernels read (padded pairs, table orders, the transposed
# table): ops that relconv.ops.map_views installs when relconv.ops is imported (`import relconv` does).
# The map holds their results in its cache; the core itself launches no op.
_VIEWS: dict[str, Callable] = {}


def install_view_builders(**builders: Callable) -> None:
    """Sets the functions the map's view methods hand over to (relconv.ops.map_views)."""
    _VIEWS.update(builders)


def _view(name: str) -> Callable:
    builder = _VIEWS.get(name)
    if builder is None:
        raise RuntimeError(f"RelationalMap.{name} is built by relconv.ops; import relconv first")
    return builder


class RelationalMap:
    """Pairs `(in_index[p], out_index[p])` grouped by relation.

    Pairs of relation `r` are `p in [rel_ptr[r], rel_ptr[r+1])`. The sizes a kernel launch needs are
    plain ints, so a forward pass over a built map never reads device memory on the host.

    A map with at most one input per slot can also be built from its output-stationary neighbour
    table alone (`from_neighbor_table`, what the CUDA voxel builders produce); its pair lists are then
    materialised on first use (one host synchronisation, cached), so a forward that runs over the
    table never needs them, and the kernels that do read pairs (weight gradient, fp32 forward) take
    them padded, built on the device without a sync (`kernel_pairs`).

    Attributes:
        in_index:  [P] int32/int64, row of the input features.
        out_index: [P] same dtype, row of the output.
        rel_ptr:   [R + 1] int64, CSR offsets over relations (monotone, rel_ptr[-1] == P).
        scale:     optional [P] float per-pair factor (e.g. 1/deg for mean aggregation).
        num_in, num_out, num_relations: plain ints.
        unique_slots: True when every (out, relation) slot has at most one input (voxel maps);
            enables the output-stationary neighbour table. Checked when the map is validated.
        injective: True when the map is injective per relation both ways: unique slots AND every
            input feeds at most one output per relation (voxel kernel maps, q = p - offset). Then
            the transposed map has a neighbour table too (`transposed_neighbor_table`), and the CUDA
            input gradient of a table forward runs the table kernel over it. Implies unique_slots;
            checked when the map is validated. A graph map with unique slots usually repeats an
            input within a relation and is not injective.
    """

    __slots__ = (
        "_in_index",
        "_out_index",
        "_rel_ptr",
        "scale",
        "num_in",
        "num_out",
        "num_relations",
        "unique_slots",
        "injective",
        "index_dtype",
        "device",
        "_cache",
        "__weakref__",  # layers keep prepared calls per map, weakly (relconv.ops.MapCalls)
    )

    def __init__(
        self,
        in_index: Tensor,
        out_index: Tensor,
        rel_ptr: Tensor,
        num_in: int,
        num_out: int,
        scale: Tensor | None = None,
        unique_slots: bool = False,
        validate: bool = True,
        injective: bool = False,
    ) -> None:
        """Wraps pair lists. `validate=True` checks every invariant the kernels trust against the data
        (index ranges, rel_ptr, the `unique_slots` and `injective` claims) with one host
        synchronisation; `False` means the caller vouches for them (relconv's own builders do, by
        construction). `injective=True` implies `unique_slots=True`."""
        self._in_index: Tensor | None = in_index
        self._out_index: Tensor | None = out_index
        self._rel_ptr: Tensor | None = rel_ptr
        self.scale = scale
        self.num_in = int(num_in)
        self.num_out = int(num_out)
        self.injective = bool(injective)
        self.unique_slots = bool(unique_slots) or self.injective
        self._cache: dict[str, object] = {}
        self._check_metadata()
        self.num_relations = int(rel_ptr.numel()) - 1
        self.index_dtype = in_index.dtype
        self.device = in_index.device
        if validate:
            self.validate()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_triples(
        cls,
        in_index: Tensor,
        out_index: Tensor,
        relation: Tensor,
        num_in: int,
        num_out: int,
        num_relations: int,
        scale: Tensor | None = None,
        index_dtype: torch.dtype | None = None,
        return_perm: bool = False,
    ) -> RelationalMap | tuple[RelationalMap, Tensor]:
        """Builds a map from unsorted triples `(in_index[e], out_index[e], relation[e])`.

        Pairs are sorted by (relation, out_index, in_index): grouped by relation for the kernels, and
        in a canonical order so that maps built on CPU and CUDA compare equal. Validates ranges
        (host synchronisations at build time only).

        With `return_perm=True` also returns the [P] int64 permutation `perm` with pair p = triple
        perm[p], so callers can reorder per-edge data without sorting again; runs of equal
        (relation, out) are contiguous in that order.
        """
        for name, t in (("in_index", in_index), ("out_index", out_index), ("relation", relation)):
            if not isinstance(t, Tensor) or t.dim() != 1:
                raise ValueError(f"{name} must be a 1-D tensor, got {_describe(t)}")
            if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
            if t.numel() != in_index.numel():
                raise ValueError(
                    f"{name} has {t.numel()} entries but in_index has {in_index.numel()}; "
                    "triples must have equal lengths"
                )
            if t.device != in_index.device:
                raise ValueError(f"{name} is on {t.device} but in_index is on {in_index.device}")
        if num_relations < 1:
            raise ValueError(f"num_relations must be positive, got {num_relations}")
        for name, n in (("num_in", num_in), ("num_out", num_out)):
            if n < 0:
                raise ValueError(f"{name} must be non-negative, got {n}")
        relation = relation.long()
        check_index_range(
            ("relation", relation, num_relations),
            ("in_index", in_index, num_in),
            ("out_index", out_index, num_out),
        )
        # Composite key (relation, out, in) fits int64 whenever R * num_out * num_in < 2^63; otherwise
        # fall back to two stable sorts.
        key_space = max(num_relations, 1) * max(num_out, 1) * max(num_in, 1)
        if key_space < 2**62:
            key = (relation * max(num_out, 1) + out_index.long()) * max(num_in, 1) + in_index.long()
            order = torch.sort(key, stable=True).indices
        else:
            order = torch.sort(in_index.long(), stable=True).indices
            order = order[torch.sort(out_index.long()[order], stable=True).indices]
            order = order[torch.sort(relation[order], stable=True).indices]
        counts = torch.bincount(relation, minlength=num_relations)
        rel_ptr = torch.zeros(num_relations + 1, dtype=torch.int64, device=relation.device)
        torch.cumsum(counts, 0, out=rel_ptr[1:])
        idt = index_dtype or index_dtype_for(num_in, num_out, in_index.numel())
        if scale is not None:
            scale = _check_scale(scale, in_index.numel(), in_index.device)[order]
        rmap = cls(
            in_index[order].to(idt),
            out_index[order].to(idt),
            rel_ptr,
            num_in,
            num_out,
            scale=scale,
            unique_slots=False,
            validate=False,
        )
        return (rmap, order) if return_perm else rmap

    @classmethod
    def from_neighbor_table(
        cls, table: Tensor, num_in: int, validate: bool = True, injective: bool = False
    ) -> RelationalMap:
        """A map given by its output-stationary table `[num_out, R]` (input row or -1 per slot).

        The pair lists are materialised on first use, in the canonical (relation, out) order, with
        the table's index dtype. `injective=True` claims that no input appears twice in a column
        (each input feeds at most one output per relation, as in voxel kernel maps); see the class
        attribute. `validate=True` checks the entries lie in [-1, num_in), and the injective claim
        when made (one host synchronisation); relconv's CUDA voxel builders pass False (valid by
        construction).
        """
        if not isinstance(table, Tensor) or table.dim() != 2:
            raise ValueError(f"table must be a 2-D tensor [num_out, R], got {_describe(table)}")
        if table.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"table must be int32 or int64, got {table.dtype}")
        if table.shape[1] < 1:
            raise ValueError(f"table needs at least one relation column, got shape {tuple(table.shape)}")
        if num_in < 0:
            raise ValueError(f"num_in must be non-negative, got {num_in}")
        if table.dtype == torch.int32 and max(num_in, table.shape[0]) > _INT32_MAX:
            raise ValueError("int32 indices cannot address more than 2^31 - 1 rows; use int64")
        if validate and table.numel():
            stats = [*torch.aminmax(table.long())]
            if injective:
                stats.append(_repeated_column_entries(table, num_in))
            got = torch.stack([v.reshape(()).long() for v in stats]).tolist()
            if got[0] < -1 or got[1] >= num_in:
                raise ValueError(f"table values must lie in [-1, {num_in}), got [{got[0]}, {got[1]}]")
            if injective and got[2]:
                raise ValueError(
                    "injective=True claims every input feeds at most one output per relation, but "
                    "some table column repeats an input; build the map without injective"
                )
        rmap = cls.__new__(cls)
        rmap._in_index = rmap._out_index = rmap._rel_ptr = None
        rmap.scale = None
        rmap.num_in = int(num_in)
        rmap.num_out = int(table.shape[0])
        rmap.num_relations = int(table.shape[1])
        rmap.unique_slots = True
        rmap.injective = bool(injective)
        rmap.index_dtype = table.dtype
        rmap.device = table.device
        rmap._cache = {"neighbor_table": table}
        return rmap

    # ------------------------------------------------------------------ properties
    @property
    def in_index(self) -> Tensor:
        return self._pairs()[0]

    @property
    def out_index(self) -> Tensor:
        return self._pairs()[1]

    @property
    def rel_ptr(self) -> Tensor:
        return self._pairs()[2]

    @property
    def has_pairs(self) -> bool:
        """False while a map built from a neighbour table has not materialised its pair lists."""
        return self._in_index is not None

    @property
    def num_pairs(self) -> int:
        return self.in_index.numel()

    def absent_pairs(self) -> tuple[Tensor, Tensor, Tensor]:
        """Empty (in_index, out_index, rel_ptr): tells the CUDA table forward "pairs not given"
        (relconv.ops.map_views.absent_pairs)."""
        return _view("absent_pairs")(self)

    def kernel_pairs(self) -> tuple[Tensor, Tensor, Tensor]:
        """(in_index, out_index, rel_ptr) as the op kernels take them: padded on the device for a
        CUDA map built from its table (relconv.ops.map_views.kernel_pairs). Use `in_index` & co.
        for the exact lists."""
        return _view("kernel_pairs")(self)

    def pair_lists(self) -> tuple[Tensor, Tensor, Tensor]:
        """(in_index, out_index, rel_ptr), materialised from the table first if need be."""
        if self._in_index is None:
            self._pairs()
        return self._in_index, self._out_index, self._rel_ptr

    def _pairs(self) -> tuple[Tensor, Tensor, Tensor]:
        if self._in_index is None:
            self._in_index, self._out_index, self._rel_ptr = pairs_from_table(self._cache["neighbor_table"])
        return self._in_index, self._out_index, self._rel_ptr

    def __repr__(self) -> str:
        pairs = self.num_pairs if self.has_pairs else "not materialised"
        return (
            f"RelationalMap(num_in={self.num_in}, num_out={self.num_out}, "
            f"num_relations={self.num_relations}, num_pairs={pairs}, "
            f"index_dtype={self.index_dtype}, scale={self.scale is not None}, device={self.device})"
        )

    def __getstate__(self) -> dict:
        # Pickles and deep copies carry the cached views but not a transpose's weak link back to its
        # map (see `transpose`): a map restores the link to its transpose, while a transpose restored
        # alone builds its map again when asked.
        state = {n: getattr(self, n) for n in self.__slots__ if n not in ("_cache", "__weakref__")}
        state["_cache"] = {k: v for k, v in self._cache.items() if not isinstance(v, weakref.ref)}
        return state

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        t = self._cache.get("transpose")
        if isinstance(t, RelationalMap):  # this map's own transpose, restored with it: link it back
            t._cache["transpose"] = weakref.ref(self)

    # ------------------------------------------------------------------ derived maps
    def transpose(self) -> RelationalMap:
        """The map with inputs and outputs swapped (transposed conv, input gradient). Cached.

        The transpose of an injective map is injective (so it has unique slots too) and shares
        this map's tables and their orders: its neighbour table is this map's transposed table and
        back. A CUDA
        injective map whose pairs are not materialised transposes its table on the device (no
        pairs, no host sync). Other maps' transposes lose `unique_slots`: an input repeated within
        a relation becomes a slot with several inputs.
        """
        t = self._cache.get("transpose")
        if isinstance(t, weakref.ref):
            t = t()
        if t is None:
            if self.injective and not self.has_pairs and self.device.type == "cuda":
                t = RelationalMap.from_neighbor_table(
                    self.transposed_neighbor_table(), self.num_out, validate=False, injective=True
                )
            else:
                t = RelationalMap(
                    self.out_index,
                    self.in_index,
                    self.rel_ptr,
                    self.num_out,
                    self.num_in,
                    scale=self.scale,
                    injective=self.injective,
                    validate=False,
                )
            if self.injective:
                swapped = (
                    ("neighbor_table", "transposed_neighbor_table"),
                    ("transposed_neighbor_table", "neighbor_table"),
                    ("table_order", "transposed_table_order"),
                    ("transposed_table_order", "table_order"),
                    ("table_in_order", "transposed_table_in_order"),
                    ("transposed_table_in_order", "table_in_order"),
                )
                for mine, theirs in swapped:
                    if mine in self._cache:
                        t._cache.setdefault(theirs, self._cache[mine])
            # The transpose links back weakly: two strong links would make a reference cycle, and
            # both maps' tables would stay on the device until Python's cycle collector ran.
            t._cache["transpose"] = weakref.ref(self)
            self._cache["transpose"] = t
        return t

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RelationalMap:
        device = torch.device(device)
        if device == self.device:
            return self
        if not self.has_pairs:
            table = self.neighbor_table().to(device, non_blocking=non_blocking)
            return RelationalMap.from_neighbor_table(
                table, self.num_in, validate=False, injective=self.injective
            )
        return RelationalMap(
            self.in_index.to(device, non_blocking=non_blocking),
            self.out_index.to(device, non_blocking=non_blocking),
            self.rel_ptr.to(device, non_blocking=non_blocking),
            self.num_in,
            self.num_out,
            scale=None if self.scale is None else self.scale.to(device, non_blocking=non_blocking),
            unique_slots=self.unique_slots,
            injective=self.injective,
            validate=False,
        )

    def with_scale(self, scale: Tensor | None) -> RelationalMap:
        """The same pairs with another per-pair scale (given in this map's pair order)."""
        if scale is not None:
            scale = _check_scale(scale, self.num_pairs, self.device)
        m = RelationalMap(
            self.in_index,
            self.out_index,
            self.rel_ptr,
            self.num_in,
            self.num_out,
            scale=scale,
            unique_slots=self.unique_slots,
            injective=self.injective,
            validate=False,
        )
        return m

    def relation_of_pairs(self) -> Tensor:
        """[P] int64 relation of each pair (cached)."""
        rel = self._cache.get("relation")
        if rel is None:
            counts = self.rel_ptr.diff()
            rel = torch.repeat_interleave(
                torch.arange(self.num_relations, device=self.device), counts, output_size=self.num_pairs
            )
            self._cache["relation"] = rel
        return rel

    def neighbor_table(self) -> Tensor:
        """Output-stationary table `[num_out, R]`: input row feeding (out, relation), or -1. Cached.

        Only defined when every slot has at most one input (`unique_slots`), as in voxel maps.
        """
        if not self.unique_slots:
            raise ValueError(
                "neighbor_table needs a map with at most one input per (output, relation) slot "
                "(unique_slots=True); graph maps use the pair lists instead"
            )
        table = self._cache.get("neighbor_table")
        if table is None:
            table = self.table_from_pairs(self.num_out, self.out_index, self.in_index)
            self._cache["neighbor_table"] = table
        return table

    def table_from_pairs(self, num_rows: int, rows: Tensor, values: Tensor) -> Tensor:
        """`[num_rows, R]` table holding values[p] at (rows[p], relation of p), -1 elsewhere."""
        table = torch.full((num_rows, self.num_relations), -1, dtype=self.index_dtype, device=self.device)
        table[rows.long(), self.relation_of_pairs()] = values
        return table

    def table_order(self) -> Tensor:
        """The outputs sorted by the relations they use, the CUDA table kernel's schedule
        (relconv.ops.map_views.table_order). CUDA maps only; cached."""
        return _view("table_order")(self)

    def reused_table_order(self, work: float = 1.0, threshold: float = 2.0) -> Tensor | None:
        """`table_order()` once the table forwards over this map have done `threshold` work in all
        (`work` per call), None before (relconv.ops.map_views.reused_table_order)."""
        return _view("reused_table_order")(self, work, threshold)

    def relabeled(self, order: Sequence[int]) -> RelationalMap:
        """The map whose relation j is this map's relation `order[j]`: a conv over it with weight W
        equals the conv over this map with W's rows in this map's order (relconv.ops.map_views)."""
        # A front end passes a tuple of ints in every training call, checked here without a
        # Python frame per relation; anything else is normalised (the views are cached by the order).
        if type(order) is not tuple or set(map(type, order)) - {int}:
            order = tuple(int(r) for r in order)
        return _view("relabeled")(self, order)

    def transposed_neighbor_table(self) -> Tensor:
        """Neighbour table of the transposed map `[num_in, R]`: the output row each input feeds in
        each relation, or -1. Injective maps only; cached (relconv.ops.map_views)."""
        return _view("transposed_neighbor_table")(self)

    def transposed_table_order(self, work: float = 1.0, threshold: float = 2.0) -> Tensor | None:
        """Schedule order of `transposed_neighbor_table()` once the input gradients over it have done
        `threshold` work, None before (relconv.ops.map_views.transposed_table_order)."""
        return _view("transposed_table_order")(self, work, threshold)

    # ------------------------------------------------------------------ validation
    def _check_metadata(self) -> None:
        """Checks shapes, dtypes and devices (no device reads)."""
        ii, oi, rp = self._in_index, self._out_index, self._rel_ptr
        for name, t in (("in_index", ii), ("out_index", oi), ("rel_ptr", rp)):
            if not isinstance(t, Tensor) or t.dim() != 1:
                raise ValueError(f"{name} must be a 1-D tensor, got {_describe(t)}")
        if ii.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"in_index must be int32 or int64, got {ii.dtype}")
        if oi.dtype != ii.dtype:
            raise ValueError(f"out_index dtype {oi.dtype} must match in_index dtype {ii.dtype}")
        if rp.dtype != torch.int64:
            raise ValueError(f"rel_ptr must be int64, got {rp.dtype}")
        if ii.numel() != oi.numel():
            raise ValueError(
                f"in_index ({ii.numel()} pairs) and out_index ({oi.numel()} pairs) differ in length"
            )
        if rp.numel() < 2:
            raise ValueError(f"rel_ptr needs num_relations + 1 >= 2 entries, got {rp.numel()}")
        for name, t in (("out_index", oi), ("rel_ptr", rp)):
            if t.device != ii.device:
                raise ValueError(f"{name} is on {t.device} but in_index is on {ii.device}")
        if self.scale is not None:
            self.scale = _check_scale(self.scale, ii.numel(), ii.device)
        for name, n in (("num_in", self.num_in), ("num_out", self.num_out)):
            if n < 0:
                raise ValueError(f"{name} must be non-negative, got {n}")
        if ii.dtype == torch.int32 and max(self.num_in, self.num_out) > _INT32_MAX:
            raise ValueError("int32 indices cannot address more than 2^31 - 1 rows; use int64")

    def validate(self) -> RelationalMap:
        """Checks rel_ptr, index ranges and the `unique_slots` claim against the data.

        All checks are computed on the device and read back together: one host synchronisation.
        """
        if not self.has_pairs:
            return self  # a table map's pairs come from its table: one input per slot by construction
        ii, oi, rp = self._in_index, self._out_index, self._rel_ptr
        stats = [rp[0], rp[-1], (rp.diff() < 0).any().long()]
        if ii.numel():
            stats += [*torch.aminmax(ii.long()), *torch.aminmax(oi.long())]
        if self.unique_slots and ii.numel() > 1:
            stats.append(_repeated_slots(self.relation_of_pairs(), oi, self.num_out))
        if self.injective and ii.numel() > 1:
            stats.append(_repeated_slots(self.relation_of_pairs(), ii, self.num_in))
        got = torch.stack([v.reshape(()).long() for v in stats]).tolist()
        if got[0] != 0:
            raise ValueError(f"rel_ptr must start at 0, got {got[0]}")
        if got[1] != self.num_pairs:
            raise ValueError(f"rel_ptr[-1] = {got[1]} must equal the number of pairs ({self.num_pairs})")
        if got[2]:
            raise ValueError("rel_ptr must be monotone non-decreasing")
        if ii.numel():
            _raise_out_of_range("in_index", got[3], got[4], self.num_in)
            _raise_out_of_range("out_index", got[5], got[6], self.num_out)
        if self.unique_slots and ii.numel() > 1 and got[7]:
            raise ValueError(
                "unique_slots=True claims at most one input per (output, relation) slot, but some slot "
                "has several; build the map without unique_slots (graph maps) or drop the duplicates"
            )
        if self.injective and ii.numel() > 1 and got[8]:
            raise ValueError(
                "injective=True claims every input feeds at most one output per relation, but some "
                "input feeds several; build the map with unique_slots=True alone"
            )
        return self


def pairs_from_table(table: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(in_index, out_index, rel_ptr) of the pairs in a neighbour table `[num_out, R]`.

    Sorted by (relation, out), in the table's index dtype. One host synchronisation (`nonzero`).
    """
    hit = table.t() >= 0
    rel, out = hit.nonzero(as_tuple=True)
    inp = table[out, rel]
    rel_ptr = torch.zeros(table.shape[1] + 1, dtype=torch.int64, device=table.device)
    torch.cumsum(hit.sum(1), 0, out=rel_ptr[1:])
    return inp, out.to(table.dtype), rel_ptr


def check_index_range(*checks: tuple[str, Tensor, int]) -> None:
    """Raises ValueError naming the first `(name, index, size)` whose values leave [0, size).

    The one home for index range checks: all bounds are computed on the device and read back
    together, one host synchronisation for any number of checks.
    """
    live = [(name, index, size) for name, index, size in checks if index.numel()]
    if not live:
        return
    # One reduction per index in its own dtype (int32 needs no widened copy) and one stack of the
    # bounds, which promotes them to int64: on CUDA four launches for three indices, not seven to ten.
    reduced = [index if index.dtype in _REDUCIBLE else index.long() for _, index, _ in live]
    bounds = torch.stack([b for index in reduced for b in torch.aminmax(index)]).tolist()
    for (name, _, size), lo, hi in zip(live, bounds[0::2], bounds[1::2], strict=True):
        _raise_out_of_range(name, lo, hi, size)


# Index dtypes reduced as they are; others (uint8, int16, ...) are widened first.
_REDUCIBLE = (torch.int32, torch.int64)


def _raise_out_of_range(name: str, lo: int, hi: int, size: int) -> None:
    if lo < 0 or hi >= size:
        raise ValueError(f"{name} values must lie in [0, {size}), got [{lo}, {hi}]")


def _repeated_slots(relation: Tensor, out_index: Tensor, num_out: int) -> Tensor:
    """0-d bool tensor: does any (relation, out) slot hold more than one pair? (no host sync)"""
    key = torch.sort(relation * max(num_out, 1) + out_index.long()).values
    return (key[1:] == key[:-1]).any()


def _repeated_column_entries(table: Tensor, num_in: int) -> Tensor:
    """0-d bool tensor: does any column of a neighbour table hold an input twice? (no host sync)

    Empty slots (-1) get distinct negative keys so that only real inputs can collide."""
    t = table.long()
    rel = torch.arange(t.shape[1], device=t.device)
    empty = -1 - torch.arange(t.numel(), device=t.device).view(t.shape)
    key = torch.sort(torch.where(t >= 0, rel * max(num_in, 1) + t, empty).reshape(-1)).values
    return (key[1:] == key[:-1]).any()


def _describe(t: object) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__


def _check_scale(scale: Tensor, num_pairs: int, device: torch.device) -> Tensor:
    if not isinstance(scale, Tensor) or not scale.dtype.is_floating_point:
        raise ValueError(f"scale must be a floating-point tensor, got {_describe(scale)}")
    if scale.dim() != 1 or scale.numel() != num_pairs:
        raise ValueError(f"scale must have shape [{num_pairs}] (one per pair), got {tuple(scale.shape)}")
    if scale.device != device:
        raise ValueError(f"scale is on {scale.device} but the pairs are on {device}")
    return scale
