"""RGCNMap: a typed graph turned into a RelationalMap once, then reused by every R-GCN layer.

Building sorts the edges by (relation, target), computes the per-(target, relation) degree for mean
aggregation and, for max aggregation, the (target, relation) slots. It synchronises with the device
(range checks, slot count); a forward pass over a built map does only the first time it sums slots
before transforming them (`relconv.graph.slots`), when it counts them.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.typing import SparseTensor

from relconv._ext import cuda_built
from relconv.core.relational_map import RelationalMap, check_index_range, index_dtype_for
from relconv.graph.slots import SlotLayout, aggregates_first, slot_key, worth_it

# PyG's aggregation names -> the three the layer computes ("add" is PyG's alias of "sum").
AGGRS = {"mean": "mean", "add": "sum", "sum": "sum", "max": "max"}


class RGCNMap:
    """An R-GCN graph in relconv's layout: edge `e` becomes the pair (src, dst, edge_type[e]).

    Attributes:
        rmap: RelationalMap over the edges (in = source node, out = target node), `scale` =
            1 / deg_r(target) for mean aggregation and None for sum and max.
        aggr: "mean", "sum" or "max".
        edge_perm: [E] int32 (int64 from 2^31 edges), pair `p` of `rmap` is edge `edge_perm[p]` of
            the caller's edge order (reorders a per-edge `edge_weight`).
    """

    __slots__ = ("rmap", "aggr", "edge_perm", "_slots", "_mean_scales")

    def __init__(self, rmap: RelationalMap, aggr: str, edge_perm: Tensor) -> None:
        if aggr not in ("mean", "sum", "max"):
            raise ValueError(f"aggr must be 'mean', 'sum' or 'max', got {aggr!r}")
        self.rmap = rmap
        self.aggr = aggr
        self.edge_perm = edge_perm
        # Max aggregates every slot before transforming it, so its slots exist from the start.
        self._slots = SlotLayout(rmap) if aggr == "max" else None
        # 1/deg in precisions other than the map's own float32, made on first use (fp64 layers only).
        self._mean_scales: dict[torch.dtype, Tensor] = {}

    @property
    def num_src(self) -> int:
        return self.rmap.num_in

    @property
    def num_dst(self) -> int:
        return self.rmap.num_out

    @property
    def num_relations(self) -> int:
        return self.rmap.num_relations

    @property
    def num_edges(self) -> int:
        return self.rmap.num_pairs

    @property
    def device(self) -> torch.device:
        return self.rmap.device

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RGCNMap:
        """The same map on another device (no rebuild)."""
        device = torch.device(device)
        if device == self.device:
            return self
        perm = self.edge_perm.to(device, non_blocking=non_blocking)
        return RGCNMap(self.rmap.to(device, non_blocking), self.aggr, perm)

    @property
    def slots(self) -> SlotLayout:
        """The (target, relation) slots (`relconv.graph.slots.SlotLayout`); a mean or sum map counts
        them on first use (one host synchronisation) and keeps them."""
        if self._slots is None:
            self._slots = SlotLayout(self.rmap)
        return self._slots

    def slots_summed_first(self, x: Tensor, c_in_g: int, c_out_g: int) -> SlotLayout | None:
        """The slots when a mean or sum layer over features `x` sums each slot's inputs before the
        per-relation transform (`relconv.graph.slots.aggregates_first`), else None."""
        if self.aggr == "max" or not aggregates_first(self.num_edges, x, c_in_g, c_out_g):
            return None
        return self.slots if worth_it(self.slots, self.num_edges) else None

    def edge_values(self, edge_weight: Tensor | None, dtype: torch.dtype) -> Tensor:
        """[E] per-pair factors of a slot sum, in pair order: `edge_weight`, or ones."""
        if edge_weight is None:
            return torch.ones(self.num_edges, dtype=dtype, device=self.device)
        return self._in_pair_order(edge_weight).to(dtype)

    def _in_pair_order(self, edge_weight: Tensor) -> Tensor:
        """`edge_weight` [E], checked, from the caller's edge order into the map's pair order."""
        _check_edge_weight(edge_weight, self.num_edges, self.device)
        return edge_weight.index_select(0, self.edge_perm)

    def pair_scale(self, edge_weight: Tensor | None, dtype: torch.dtype = torch.float32) -> Tensor | None:
        """Per-pair factor: the aggregation's scale (1/deg_r for mean) times `edge_weight` [E].

        `dtype` is the precision of the features it will multiply: float64 gets a float64 scale
        (computed from the degrees, not widened from float32), anything else float32.
        """
        dtype = torch.float64 if dtype == torch.float64 else torch.float32
        mean = self.mean_scale(dtype)
        if edge_weight is None:
            return mean
        w = self._in_pair_order(edge_weight)
        if mean is None:
            return w
        dtype = torch.promote_types(w.dtype, dtype)
        return w.to(dtype) * mean.to(dtype)

    def mean_scale(self, dtype: torch.dtype) -> Tensor | None:
        """[E] 1 / deg_r(target) in `dtype` (None unless aggr is mean). Cached per dtype."""
        scale = self.rmap.scale
        if scale is None or scale.dtype == dtype:
            return scale
        exact = self._mean_scales.get(dtype)
        if exact is None:
            exact = _slot_degree(self.rmap).to(dtype).reciprocal()
            self._mean_scales[dtype] = exact
        return exact

    def conv_map(self, scale: Tensor | None) -> RelationalMap:
        """`rmap` carrying `scale` (from `pair_scale`); the built map itself when nothing changes."""
        return self.rmap if scale is self.rmap.scale else self.rmap.with_scale(scale)

    def __repr__(self) -> str:
        return (
            f"RGCNMap(num_src={self.num_src}, num_dst={self.num_dst}, num_relations={self.num_relations}, "
            f"num_edges={self.num_edges}, aggr={self.aggr!r}, device={self.device})"
        )


def check_adjacency_type(edge_index: object) -> None:
    """Raises TypeError unless `edge_index` is a tensor (incl. EdgeIndex) or a SparseTensor."""
    if not isinstance(edge_index, (Tensor, SparseTensor)):
        raise TypeError(
            "edge_index must be a [2, E] tensor, an EdgeIndex, a torch_sparse SparseTensor or an "
            f"RGCNMap, got {type(edge_index).__name__}"
        )


def edge_arrays(edge_index: object, edge_type: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """(src, dst, edge_type) from a [2, E] tensor / `EdgeIndex` (row 0 = source, row 1 = target)
    or a torch_sparse `SparseTensor` adjacency `adj_t` (row = target, col = source, value = type)."""
    if isinstance(edge_index, SparseTensor):
        row, col, value = edge_index.coo()
        if value is None:
            raise ValueError("edge_index is a SparseTensor without values; its values must hold edge_type")
        if value.dim() != 1:
            raise ValueError(f"edge_index's SparseTensor values must be 1-D edge types, got {value.dim()}-D")
        return col, row, value
    check_adjacency_type(edge_index)
    if isinstance(edge_index, EdgeIndex):
        edge_index = edge_index.as_tensor()
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or edge_index.dtype == torch.bool:
        raise ValueError(f"edge_index must be an integer tensor, got {edge_index.dtype}")
    if edge_type is None:
        raise ValueError("edge_type is required unless edge_index is a SparseTensor holding the types")
    if not isinstance(edge_type, Tensor) or edge_type.dim() != 1:
        raise ValueError(f"edge_type must be a 1-D tensor, got {_describe(edge_type)}")
    if edge_type.dtype.is_floating_point or edge_type.dtype.is_complex or edge_type.dtype == torch.bool:
        raise ValueError(f"edge_type must be an integer tensor, got {edge_type.dtype}")
    if edge_type.numel() != edge_index.size(1):
        raise ValueError(
            f"edge_type has {edge_type.numel()} entries but edge_index has {edge_index.size(1)} edges"
        )
    if edge_type.device != edge_index.device:
        raise ValueError(f"edge_type is on {edge_type.device} but edge_index is on {edge_index.device}")
    return edge_index[0], edge_index[1], edge_type


def build_rgcn_map(
    edge_index: Tensor | SparseTensor,
    edge_type: Tensor | None = None,
    num_nodes: int | tuple[int, int] | None = None,
    num_relations: int | None = None,
    aggr: str = "mean",
) -> RGCNMap:
    """Builds the map that `relconv.graph.RGCNConv` consumes; pass it as `conv(x, rgcn_map)`.

    Args:
        edge_index: [2, E] (source, target) tensor or `EdgeIndex`, or a SparseTensor `adj_t` whose
            values are the edge types.
        edge_type: [E] integer relation of each edge, in [0, num_relations); may be None when
            num_relations == 1 (or a SparseTensor holds the types).
        num_nodes: number of nodes, or (num_source_nodes, num_target_nodes) for bipartite graphs;
            default: the sparse size of an EdgeIndex/SparseTensor, else max index + 1.
        num_relations: default max(edge_type) + 1.
        aggr: "mean" (per relation and target node), "add"/"sum" or "max".

    Synchronises with the device (range checks); build once per graph and reuse across layers/epochs.
    """
    if aggr not in AGGRS:
        raise ValueError(f"aggr must be one of {sorted(AGGRS)}, got {aggr!r}")
    aggr = AGGRS[aggr]
    if edge_type is None and num_relations == 1 and isinstance(edge_index, Tensor):
        # One relation needs no types: lets the layer serve per-edge-type convs (`to_hetero`).
        edge_type = torch.zeros(edge_index.size(-1), dtype=torch.long, device=edge_index.device)
    src, dst, rel = edge_arrays(edge_index, edge_type)
    num_src, num_dst = _node_counts(edge_index, src, dst, num_nodes)
    if num_relations is None:
        num_relations = int(rel.max().item()) + 1 if rel.numel() else 1
    if num_relations < 1:
        raise ValueError(f"num_relations must be positive, got {num_relations}")
    checks = (
        ("edge_type", rel, num_relations),
        ("edge_index[0] (source nodes)", src, num_src),
        ("edge_index[1] (target nodes)", dst, num_dst),
    )
    idt = index_dtype_for(num_src, num_dst, rel.numel())
    if not (src.device.type == "cpu" or (src.is_cuda and cuda_built)):
        raise ValueError(
            f"edge_index is on {src.device}; relconv builds graph maps on the CPU and, when built "
            "with CUDA, on CUDA devices"
        )
    if rel.numel() and not (num_src and num_dst):
        check_index_range(*checks)  # raises: edges without nodes to hold them
    rmap, perm = _sorted_by_op(checks, aggr == "mean", idt)
    return RGCNMap(rmap, aggr, perm)


def _sorted_by_op(
    checks: tuple[tuple[str, Tensor, int], ...], mean: bool, idt: torch.dtype
) -> tuple[RelationalMap, Tensor]:
    """The edges sorted stably by (relation, target), the relation offsets and the mean scales, from
    one op (`typed_edge_map`; on a GPU four launches and one host wait, on the CPU two counting
    passes), which checks the ranges as it goes. `checks` are build_rgcn_map's (name, values, size)
    of the edge types, sources and targets; their names go into the error raised for a value out
    of range. Sorting by (relation, target) groups the pairs by relation for the kernels and makes
    each (target, relation) slot contiguous."""
    (_, rel, num_relations), (_, src, num_src), (_, dst, num_dst) = checks
    if src.dtype != dst.dtype or src.dtype not in _OP_INDEX_DTYPES:
        src, dst = src.long(), dst.long()
    if rel.dtype not in _OP_INDEX_DTYPES:
        rel = rel.long()
    in_index, out_index, rel_ptr, scale, perm, error = _TYPED_EDGE_MAP(
        src, dst, rel, num_src, num_dst, num_relations, mean, idt
    )
    if error:
        check_index_range(*checks)  # raises, naming the argument and its bounds
        raise AssertionError(f"typed_edge_map found values out of range (mask {error}) that the check missed")
    rmap = RelationalMap(
        in_index, out_index, rel_ptr, num_src, num_dst, scale=scale if mean else None, validate=False
    )
    return rmap, perm


_OP_INDEX_DTYPES = (torch.int32, torch.int64)
_TYPED_EDGE_MAP = torch.ops.relconv.typed_edge_map.default


def _slot_degree(rmap: RelationalMap) -> Tensor:
    """[P] int64 number of pairs sharing each pair's (target, relation) slot.

    The pairs are sorted by (relation, target), so every slot is a run of the sorted key.
    """
    return _run_lengths(slot_key(rmap))


def _run_lengths(sorted_key: Tensor) -> Tensor:
    """[P] int64 length of the run of equal values each element of a sorted key lies in.

    On a GPU: the two ends of its run, from binary searches of the key. Three ops and no host
    synchronisation; a scatter-add over run ids takes ten, and serialises its atomics on a
    high-degree slot. On the CPU, where reading a size costs no wait: the runs' lengths repeated
    over each run, two linear passes (58k keys, 4 threads: 0.55 against 2.5 ms; 1.8M: 12 against 70).
    """
    if sorted_key.device.type == "cpu":
        _, lengths = torch.unique_consecutive(sorted_key, return_counts=True)
        return torch.repeat_interleave(lengths, lengths)
    return torch.searchsorted(sorted_key, sorted_key, right=True) - torch.searchsorted(sorted_key, sorted_key)


def _node_counts(
    edge_index: object, src: Tensor, dst: Tensor, num_nodes: int | tuple[int, int] | None
) -> tuple[int, int]:
    if num_nodes is None:
        if isinstance(edge_index, SparseTensor):
            n_dst, n_src = edge_index.sparse_sizes()
            return int(n_src), int(n_dst)
        if isinstance(edge_index, EdgeIndex) and None not in edge_index.sparse_size():
            n_src, n_dst = edge_index.sparse_size()
            return int(n_src), int(n_dst)
        n = max(
            int(src.max().item()) + 1 if src.numel() else 0, int(dst.max().item()) + 1 if dst.numel() else 0
        )
        return n, n
    if isinstance(num_nodes, int):
        num_nodes = (num_nodes, num_nodes)
    if len(num_nodes) != 2 or any(not isinstance(n, int) or n < 0 for n in num_nodes):
        raise ValueError(f"num_nodes must be a non-negative int or a pair of them, got {num_nodes!r}")
    return num_nodes[0], num_nodes[1]


def _check_edge_weight(edge_weight: Tensor, num_edges: int, device: torch.device) -> None:
    if not isinstance(edge_weight, Tensor) or not edge_weight.dtype.is_floating_point:
        raise ValueError(f"edge_weight must be a floating-point tensor, got {_describe(edge_weight)}")
    if edge_weight.shape != (num_edges,):
        raise ValueError(
            f"edge_weight must have shape [{num_edges}] (one per edge), got {tuple(edge_weight.shape)}"
        )
    if edge_weight.device != device:
        raise ValueError(f"edge_weight is on {edge_weight.device} but the graph is on {device}")
    if edge_weight.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "edge_weight requires grad, but relconv treats per-edge weights as constants; "
            "pass edge_weight.detach() (or use PyG's layer if the weights must be learned)"
        )


def _describe(t: object) -> str:
    return f"{t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
