"""A graph map's (target, relation) slots, and the sum of each slot's inputs.

A slot is one target node's edges of one relation. R-GCN's message into a slot is
(sum or mean of its inputs) @ W_r, so summing the inputs first and transforming each slot row once
runs one GEMM row per slot instead of one per edge. The sum is a sparse [slots, nodes] @ [nodes, C]
product (relconv's csr_row_sum op); its input gradient is the transposed product.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from relconv.core.relational_map import RelationalMap

# Aggregating first pays on large graphs with wide layers. On an H200, mean, C_in = C_out = 64,
# queued ms per call, per edge -> slots summed first: an AM-shaped graph (12M edges, 0.46 slots per
# edge) with a cached map forward fp32 6.76 -> 4.97, bf16 6.48 -> 4.21, forward and backward fp32
# 16.5 -> 12.5, bf16 11.9 -> 9.7; a BGS-shaped one (1.8M edges) forward fp32 0.91 -> 0.88 and bf16
# 0.84 -> 0.76, but with the map built in the call 1.47 -> 1.92 (counting the slots reads the device
# back). At C16 the per-edge GEMM is cheap and the sum costs what it saves (BGS bf16 kernels 0.22
# against 0.38 ms). The slot rows are an extra activation of S x C_in (1.4 GB on AM at C64 fp32).
# On the CPU summing first loses (BGS C64 forward 298 -> 503 ms on two cores): CUDA only.
MIN_EDGES = 1 << 22
MIN_CHANNELS = 64
MAX_SLOTS_PER_EDGE = 0.6


class SlotLayout:
    """The non-empty (target, relation) slots of a map whose pairs are sorted by (relation, target).

    Attributes:
        slot_map: RelationalMap with one pair (slot id, target, relation) per slot, slots numbered
            in the pairs' order.
        pair_ptr: [S + 1] offsets of each slot's run of pairs (the map's index dtype).
        degree: [S] int64, the number of pairs in each slot.
    """

    __slots__ = ("slot_map", "pair_ptr", "degree", "_rmap", "_slot_index", "_by_source", "_mean_maps")

    def __init__(self, rmap: RelationalMap) -> None:
        """Reads the slot count back from the device (one host synchronisation)."""
        stride = max(rmap.num_out, 1)
        key = slot_key(rmap)
        slot_keys, counts = torch.unique_consecutive(key, return_counts=True)
        num_slots = slot_keys.numel()
        idt = rmap.index_dtype
        slot_rel = torch.div(slot_keys, stride, rounding_mode="floor")
        self.slot_map = RelationalMap(
            torch.arange(num_slots, dtype=idt, device=key.device),
            (slot_keys - slot_rel * stride).to(idt),
            relation_offsets(slot_keys, rmap.num_relations, stride),
            num_slots,
            rmap.num_out,
            validate=False,
        )
        self.pair_ptr = torch.zeros(num_slots + 1, dtype=idt, device=key.device)
        torch.cumsum(counts, 0, out=self.pair_ptr[1:])
        self.degree = counts
        self._rmap = rmap
        self._slot_index: Tensor | None = None
        self._by_source: tuple[Tensor, Tensor, Tensor] | None = None
        self._mean_maps: dict[torch.dtype, RelationalMap] = {}

    @property
    def num_slots(self) -> int:
        return self.slot_map.num_in

    @property
    def slot_index(self) -> Tensor:
        """[P] int64, the slot of each pair; made on first use (max aggregation, the sum's input
        gradient), so that a summing forward does not hold 8 bytes per edge for it."""
        if self._slot_index is None:
            slots = torch.arange(self.num_slots, device=self.degree.device)
            self._slot_index = torch.repeat_interleave(slots, self.degree, output_size=self._rmap.num_pairs)
        return self._slot_index

    def mean_map(self, dtype: torch.dtype) -> RelationalMap:
        """`slot_map` scaled by 1 / degree, in float64 for float64 features, else float32. Cached:
        the map keeps the views the kernels derive from it."""
        dtype = torch.float64 if dtype == torch.float64 else torch.float32
        scaled = self._mean_maps.get(dtype)
        if scaled is None:
            scaled = self.slot_map.with_scale(self.degree.to(dtype).reciprocal())
            self._mean_maps[dtype] = scaled
        return scaled

    def by_source(self) -> tuple[Tensor, Tensor, Tensor]:
        """(order, row_ptr, col) of the transposed [num_in, S] product: the pairs sorted by input,
        each input's run of pairs, and each such pair's slot (the sum's input gradient)."""
        if self._by_source is None:
            # Built on the first backward: inference never pays for it.
            src = self._rmap.in_index
            order = torch.sort(src, stable=True)[1]
            bounds = torch.arange(self._rmap.num_in + 1, device=src.device, dtype=src.dtype)
            row_ptr = torch.searchsorted(src.index_select(0, order), bounds).to(src.dtype)
            self._by_source = (order, row_ptr, self.slot_index.index_select(0, order).to(src.dtype))
        return self._by_source


def slot_key(rmap: RelationalMap) -> Tensor:
    """[P] int64 key relation * max(num_out, 1) + target of each pair: sorted, and equal exactly
    within a (target, relation) slot, for a map whose pairs are sorted by (relation, target)."""
    return torch.add(rmap.out_index.long(), rmap.relation_of_pairs(), alpha=max(rmap.num_out, 1))


def relation_offsets(sorted_key: Tensor, num_relations: int, stride: int) -> Tensor:
    """[R + 1] int64 offsets of each relation's run in keys `relation * stride + target` sorted
    ascending: a search of the keys, where bincount would read the device back."""
    end = (num_relations + 1) * stride
    starts = torch.arange(0, end, stride, dtype=sorted_key.dtype, device=sorted_key.device)
    return torch.searchsorted(sorted_key, starts)


def aggregates_first(num_edges: int, x: Tensor, c_in_g: int, c_out_g: int) -> bool:
    """Whether a CUDA R-GCN forward over features `x` may sum each slot's inputs before transforming
    (`MIN_EDGES`, `MIN_CHANNELS`; the slot count is checked once the slots exist). Traced and
    exported graphs keep the per-edge path: building the slots reads their count back."""
    # Tracing first: under torch.export the edge count is symbolic, and comparing it would add a
    # guard that bounds the exported program's edge count.
    return (
        not torch.compiler.is_compiling()
        and x.is_cuda
        and num_edges >= MIN_EDGES
        and min(c_in_g, c_out_g) >= MIN_CHANNELS
    )


def worth_it(layout: SlotLayout, num_edges: int) -> bool:
    """Whether the slots are few enough per edge (`MAX_SLOTS_PER_EDGE`) for summing first to pay."""
    return layout.num_slots <= MAX_SLOTS_PER_EDGE * num_edges


def slot_sum(x: Tensor, layout: SlotLayout, values: Tensor) -> Tensor:
    """[S, C] rows: slot s holds sum over its pairs p of values[p] * x[in_index[p]]."""
    return _SlotSum.apply(x, layout, values.to(x.dtype))


class _SlotSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, layout: SlotLayout, values: Tensor) -> Tensor:
        ctx.layout = layout
        ctx.save_for_backward(values)
        return torch.ops.relconv.csr_row_sum(layout.pair_ptr, layout._rmap.in_index, values, x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        (values,) = ctx.saved_tensors
        order, row_ptr, col = ctx.layout.by_source()
        return torch.ops.relconv.csr_row_sum(row_ptr, col, values.index_select(0, order), grad), None, None
