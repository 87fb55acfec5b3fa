"""The views of a RelationalMap that the conv kernels read and ops build: pair lists padded on the
device, the table's schedule order, the transposed neighbour table and its order, and the map with
its relations relabelled to another order.

Each is cached on the map (`RelationalMap._cache`), so that every layer over one map shares it;
relconv.core keeps the map's data and its validation, and its methods of the same names hand over
to these (`install_view_builders` below), so the core launches no op of its own.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relconv._ext import _C  # noqa: F401  (registers torch.ops.relconv)
from relconv.core import relational_map as core
from relconv.core.relational_map import RelationalMap

_TABLE_PAIRS = torch.ops.relconv.table_pairs.default
_TABLE_ORDER = torch.ops.relconv.neighbor_table_order.default
_TRANSPOSE_TABLE = torch.ops.relconv.transpose_neighbor_table.default

# Empty tensors own no storage, so one triple per (device, index dtype) serves every map: a fresh map
# (a new scan's layer) then allocates none of its own on the host path.
_ABSENT_PAIRS: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor, Tensor]] = {}


# Multiply-adds per relation slot (rows * C_in * C_out), summed over the table forwards of a map,
# from which the map's table is sorted (`table_order`, `reused_table_order`). The sort costs ~55 us
# plus ~0.1 us per thousand rows of GPU time and ~15 CUDA API calls of host time; it saves kernel
# time in proportion to the work. H100, subm 3^3 fp16 (kernel us, natural -> sorted order, sort us):
# 75k rows C128 176 -> 119 (58), 130k C64 125 -> 94 (63), 171k C64 155 -> 115 (66) and C128 399 ->
# 218, 3.5M C64 3422 -> 2187 (386): one layer's sort pays from about 350k rows at C64 and 90k at
# C128, i.e. this much work; a map's uses add up to it (python -m benchmarks.run --suite voxel).
# Re-measured on an H200 layer by layer (python -m benchmarks.sort_rule; docs/performance.md, "The
# table sort of a fresh map"), with a rule on rows * sqrt(C_in * C_out) beside it, which fitted
# the single layers better and made MinkUNet's GPU time 2-4% longer on the smaller scenes.
SORT_WORK = 1.5e9
# Exact fp32 multiply-adds run on CUDA cores, so a sorted table saves more time per unit of work:
# H200, fp32 subm 3^3 kernel us natural -> sorted, 273k rows C32 (2.8e8) 428 -> 278, 937k C16
# (2.4e8) 852 -> 706, 398k C16 (1.0e8) 365 -> 340, 273k C16 (7.0e7) 185 -> 190; SparseResNet21D
# fp32 through relconv.torchsparse, GPU ms per call with weight 1 -> 8: inference 12.15 -> 11.09,
# training 38.28 -> 36.17 (python -m benchmarks.sort_rule --dtype fp32; benchmarks.compat.speed).
EXACT_SORT_WEIGHT = 8.0


def sort_weight(dtype: torch.dtype) -> float:
    """How much a multiply-add of a call computing in `dtype` counts towards SORT_WORK."""
    exact = dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32
    return EXACT_SORT_WEIGHT if exact else 1.0


def table_work(rows: int, weight: Tensor) -> float:
    """Multiply-adds of a table forward of `rows` rows through `weight` ([R, C_in, C_out] or
    [R, G, C_in_g, C_out_g]), per relation slot."""
    # A relation's weight holds the multiply-adds per row in either layout (G * C_in_g * C_out_g).
    return float(rows * math.prod(weight.shape[1:]))


def absent_pairs(rmap: RelationalMap) -> tuple[Tensor, Tensor, Tensor]:
    """Empty (in_index, out_index, rel_ptr): tells the CUDA table forward "pairs not given"."""
    key = (rmap.device, rmap.index_dtype)
    empty = _ABSENT_PAIRS.get(key)
    if empty is None:
        idx = torch.empty(0, dtype=rmap.index_dtype, device=rmap.device)
        empty = _ABSENT_PAIRS[key] = (idx, idx, torch.empty(0, dtype=torch.int64, device=rmap.device))
    return empty


def kernel_pairs(rmap: RelationalMap) -> tuple[Tensor, Tensor, Tensor]:
    """(in_index, out_index, rel_ptr) as the op kernels take them. The pairs themselves when
    materialised or on the CPU; for a CUDA map built from its table, the table's pairs padded with
    -1 to `num_out * R` entries (`relconv::table_pairs`, cached): the kernels read pairs only
    through rel_ptr, so no host sync is needed to size them."""
    if rmap.has_pairs or rmap.device.type != "cuda":
        return rmap.pair_lists()
    return _padded_pairs(rmap, rmap.neighbor_table())


def _padded_pairs(rmap: RelationalMap, table: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    padded = rmap._cache.get("padded_pairs")
    if padded is None:
        padded = rmap._cache["padded_pairs"] = _TABLE_PAIRS(table)
    return padded


def _sorted_rows(rmap: RelationalMap, order_key: str, table) -> Tensor:
    """`neighbor_table_order` of `table()`, cached under `order_key`."""
    order = rmap._cache.get(order_key)
    if order is None:
        order = rmap._cache[order_key] = _TABLE_ORDER(table())
    return order


def _order_once_worth(
    rmap: RelationalMap, order_key: str, work_key: str, table, work: float, threshold: float
):
    """The cached sort of `table()` once the work of the forwards that asked for it, this one
    included, reaches `threshold`; None before."""
    order = rmap._cache.get(order_key)
    if order is None:
        done = rmap._cache.get(work_key, 0.0) + work
        rmap._cache[work_key] = done
        if done >= threshold:
            order = _sorted_rows(rmap, order_key, table)
    return order


def table_order(rmap: RelationalMap) -> Tensor:
    """The outputs sorted by the relations they use (`[num_out]`, the table's index dtype): the order
    in which the CUDA output-stationary kernel takes them, so that the rows of one tile share
    relations and the kernel computes fewer empty (tile, relation) blocks. A schedule only: each
    output is computed alone, the result does not depend on it. CUDA maps only; cached."""
    return _sorted_rows(rmap, "table_order", rmap.neighbor_table)


def reused_table_order(rmap: RelationalMap, work: float = 1.0, threshold: float = 2.0) -> Tensor | None:
    """`table_order` once the table forwards over the map have done `threshold` work in all (`work`
    per call, this one included), None before; with the defaults, from the second call on. The sort
    costs host time (about 15 CUDA API calls) and ~55 us of GPU time and saves kernel time in
    proportion to the work it orders: a map that a few small layers use once, as in a network over
    a new scan, runs unsorted, while a cached map or a large layer is sorted (relational_conv
    passes multiply-adds, `table_work`, against `SORT_WORK`)."""
    return _order_once_worth(rmap, "table_order", "table_work", rmap.neighbor_table, work, threshold)


def transposed_neighbor_table(rmap: RelationalMap) -> Tensor:
    """Neighbour table of the transposed map `[num_in, R]`: the output row each input feeds in each
    relation, or -1. Injective maps only; cached. On CUDA the `transpose_neighbor_table` kernel over
    the neighbour table (no pairs, no host sync); on the CPU, whose kernel never reads it, built
    from the pairs."""
    if not rmap.injective:
        raise ValueError(
            "transposed_neighbor_table needs a map injective per relation both ways "
            "(injective=True, as voxel kernel maps are); a map that repeats an input within a "
            "relation has no transposed table"
        )
    return _transposed_table(rmap, rmap.neighbor_table())


def _transposed_table(rmap: RelationalMap, table: Tensor) -> Tensor:
    transposed = rmap._cache.get("transposed_neighbor_table")
    if transposed is None:
        if rmap.device.type == "cuda":
            transposed = _TRANSPOSE_TABLE(table, rmap.num_in)
        else:
            transposed = rmap.table_from_pairs(rmap.num_in, rmap.in_index, rmap.out_index)
        rmap._cache["transposed_neighbor_table"] = transposed
    return transposed


def transposed_table_order(rmap: RelationalMap, work: float = 1.0, threshold: float = 2.0) -> Tensor | None:
    """Schedule order `[num_in]` of `transposed_neighbor_table`, once the input gradients over it
    have done `threshold` work (`work` per call), None before; cached. The same trade as
    `reused_table_order`. CUDA maps only."""
    return _order_once_worth(
        rmap,
        "transposed_table_order",
        "transposed_table_work",
        lambda: transposed_neighbor_table(rmap),
        work,
        threshold,
    )


# Relation orders as index tensors, per (order, device): made once per process, so every later map
# relabels without a copy from the host.
_ORDER_INDEX: dict[tuple[tuple[int, ...], torch.device], Tensor] = {}


def _order_index(order: tuple[int, ...], device: torch.device) -> Tensor:
    index = _ORDER_INDEX.get((order, device))
    if index is None:
        index = _ORDER_INDEX[(order, device)] = torch.tensor(order, dtype=torch.int64, device=device)
    return index


def relabeled(rmap: RelationalMap, order: tuple[int, ...]) -> RelationalMap:
    """The map whose relation j is relation `order[j]` of `rmap` (`order` a permutation of its
    relations). A conv over it with weight W is the conv over `rmap` with W's rows put in `rmap`'s
    order, so a front end whose weights list kernel offsets in an order of its own runs them as
    they are: one gather of the map (its table's columns, else its pair segments) per map and
    order, where converting the weight costs a gather per call and two more ops per backward.
    Cached; the new map builds its own views."""
    key = ("relabeled", order)
    out = rmap._cache.get(key)
    if out is None:
        if sorted(order) != list(range(rmap.num_relations)):
            raise ValueError(
                f"order must be a permutation of the map's {rmap.num_relations} relations, got {list(order)}"
            )
        if order == tuple(range(rmap.num_relations)):
            return rmap
        out = rmap._cache[key] = _relabel(rmap, order)
    return out


def _relabel(rmap: RelationalMap, order: tuple[int, ...]) -> RelationalMap:
    index = _order_index(order, rmap.device)
    table = rmap._cache.get("neighbor_table")
    if table is not None and rmap.scale is None:
        return RelationalMap.from_neighbor_table(
            table.index_select(1, index), rmap.num_in, validate=False, injective=rmap.injective
        )
    # Pairs: relation j's segment is relation order[j]'s, in its order; no host read (sizes known).
    in_index, out_index, rel_ptr = rmap.pair_lists()
    counts = rel_ptr.diff().index_select(0, index)
    new_ptr = torch.zeros_like(rel_ptr)
    torch.cumsum(counts, 0, out=new_ptr[1:])
    rel = torch.repeat_interleave(
        torch.arange(rmap.num_relations, device=rmap.device), counts, output_size=rmap.num_pairs
    )
    start = (rel_ptr.index_select(0, index) - new_ptr[:-1]).index_select(0, rel)
    src = start + torch.arange(rmap.num_pairs, device=rmap.device)
    return RelationalMap(
        in_index.index_select(0, src),
        out_index.index_select(0, src),
        new_ptr,
        rmap.num_in,
        rmap.num_out,
        scale=None if rmap.scale is None else rmap.scale.index_select(0, src),
        unique_slots=rmap.unique_slots,
        injective=rmap.injective,
        validate=False,
    )


def tables_in_order(
    rmap: RelationalMap, order: Tensor | None, back_order: Tensor | None
) -> tuple[Tensor | None, Tensor | None]:
    """The neighbour table's rows in `order`'s sequence and the transposed table's in
    `back_order`'s (None for an order that is None): the tables relational_conv takes with
    `sorted_tables`, whose kernels then read a tile's entries as one block instead of row by row
    through the order. Cached: a copy of each table, made for prepared calls (relconv.ops.prepare).
    Measured on an H200 with MinkUNet 1.0 over new coordinates (fp16, batch4-64beam), copies made
    for every layer after the one that sorted a map took an inference's peak memory from 360 to
    416 MiB for no GPU time gained."""
    fwd = back = None
    if order is not None:
        fwd = _rows_in_order(rmap, "table_in_order", rmap.neighbor_table, order)
    if back_order is not None:
        back = _rows_in_order(
            rmap, "transposed_table_in_order", lambda: transposed_neighbor_table(rmap), back_order
        )
    return fwd, back


def _rows_in_order(rmap: RelationalMap, key: str, table, order: Tensor) -> Tensor:
    rows = rmap._cache.get(key)
    if rows is None:
        rows = rmap._cache[key] = table().index_select(0, order)
    return rows


def table_views(
    rmap: RelationalMap, weight: Tensor, transposed: bool, pairs: bool, dtype: torch.dtype
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor, Tensor, Tensor]:
    """The views a table forward passes, as `relconv.ops.planning.decide` chose them: (neighbour
    table, its order, transposed table, its order, in_index, out_index, rel_ptr). The orders once
    the map's table forwards (input gradients) have done SORT_WORK, None before; the pairs padded
    (kernel_pairs), or absent when no kernel of the call reads them. `dtype`: the call's compute
    dtype, which weighs its work (sort_weight). The tables as the map holds them: copies in their
    orders' row sequence are for prepared calls (relconv.ops.prepare), a layer that runs again
    over the same map, not for the layers of one forward over a new one."""
    # The one read of the map's table: the views below are all derived from it.
    fwd = rmap.neighbor_table()
    work_weight = sort_weight(dtype)
    forwards = table_work(rmap.num_out, weight) * work_weight
    order = _order_once_worth(rmap, "table_order", "table_work", lambda: fwd, forwards, SORT_WORK)
    back = back_order = None
    if transposed:
        back = _transposed_table(rmap, fwd)
        gradients = table_work(rmap.num_in, weight) * work_weight
        back_order = _order_once_worth(
            rmap, "transposed_table_order", "transposed_table_work", lambda: back, gradients, SORT_WORK
        )
    if not pairs:
        return (fwd, order, back, back_order, *absent_pairs(rmap))
    if rmap.has_pairs or rmap.device.type != "cuda":
        return (fwd, order, back, back_order, *rmap.pair_lists())
    return (fwd, order, back, back_order, *_padded_pairs(rmap, fwd))


core.install_view_builders(
    kernel_pairs=kernel_pairs,
    absent_pairs=absent_pairs,
    table_order=table_order,
    reused_table_order=reused_table_order,
    transposed_neighbor_table=transposed_neighbor_table,
    transposed_table_order=transposed_table_order,
    relabeled=relabeled,
)
