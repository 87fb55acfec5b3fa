"""`RGCNConv`: drop-in replacement for `torch_geometric.nn.RGCNConv` running on relconv's core.

    out[i] = x_i @ root + bias + sum_r sum_{j in N_r(i)} a_r(i, j) * x_j @ W_r

with a_r(i, j) = 1 / |N_r(i)| for mean (per relation and target node), 1 for sum, times an optional
edge weight. Same constructor, parameter names, shapes, initialisation and repr as PyG's layer, so its
state_dict loads unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.inits import glorot, zeros
from torch_geometric.typing import SparseTensor

from relconv.core.relational_map import RelationalMap
from relconv.graph.graph_map import AGGRS, RGCNMap
from relconv.graph.map_cache import cached_rgcn_map
from relconv.graph.slots import slot_sum
from relconv.ops import ConvPlan, acc_dtype, adds_in_place, plan, relational_conv, relational_conv_add_

NodeInput = Tensor | None
"""Float features [N, C], a 1-D integer tensor of node ids (featureless), or None (= all node ids)."""


class RGCNConv(MessagePassing):
    """Relational graph convolution (Schlichtkrull et al., 2017), computed by `relational_conv`.

    Args:
        in_channels: input size, or (source, target) sizes for bipartite graphs; without input
            features, the number of (source) nodes.
        out_channels: output size.
        num_relations: number of edge types R.
        num_bases: basis decomposition W_r = sum_b comp[r, b] * weight[b].
        num_blocks: block-diagonal W_r with `num_blocks` blocks (relconv's `groups`).
        aggr: "mean" (per relation and target node), "add"/"sum" or "max" (per relation and target
            node over the raw inputs, then transformed, as PyG's RGCNConv).
        root_weight: add x_i @ root.
        is_sorted: accepted for compatibility; relconv sorts once when it builds the graph's map.
        bias: learn an additive bias.
        **kwargs: further `MessagePassing` arguments.
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        num_relations: int,
        num_bases: int | None = None,
        num_blocks: int | None = None,
        aggr: str = "mean",
        root_weight: bool = True,
        is_sorted: bool = False,
        bias: bool = True,
        **kwargs,
    ) -> None:
        if not isinstance(aggr, str) or aggr not in AGGRS:
            raise ValueError(f"aggr must be one of {sorted(AGGRS)} for relconv's RGCNConv, got {aggr!r}")
        super().__init__(aggr=aggr, node_dim=0, **kwargs)
        if num_bases is not None and num_blocks is not None:
            raise ValueError("num_bases and num_blocks cannot both be set (basis or block decomposition)")
        in_pair = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        if len(in_pair) != 2 or any(not isinstance(c, int) or c < 1 for c in in_pair):
            raise ValueError(f"in_channels must be a positive int or a pair of them, got {in_channels!r}")
        if not isinstance(out_channels, int) or out_channels < 1:
            raise ValueError(f"out_channels must be a positive int, got {out_channels!r}")
        if not isinstance(num_relations, int) or num_relations < 1:
            raise ValueError(f"num_relations must be a positive int, got {num_relations!r}")
        if num_bases is not None and (not isinstance(num_bases, int) or num_bases < 1):
            raise ValueError(f"num_bases must be a positive int, got {num_bases!r}")
        if num_blocks is not None:
            if not isinstance(num_blocks, int) or num_blocks < 1:
                raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
            if in_pair[0] % num_blocks or out_channels % num_blocks:
                raise ValueError(
                    f"num_blocks ({num_blocks}) must divide in_channels ({in_pair[0]}) and "
                    f"out_channels ({out_channels})"
                )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.num_relations = num_relations
        self.num_bases = num_bases
        self.num_blocks = num_blocks
        self.is_sorted = is_sorted
        self.in_channels_l = in_pair[0]
        self.in_channels_r = in_pair[1]

        if num_bases is not None:
            self.weight = Parameter(torch.empty(num_bases, in_pair[0], out_channels))
            self.comp = Parameter(torch.empty(num_relations, num_bases))
        elif num_blocks is not None:
            self.weight = Parameter(
                torch.empty(num_relations, num_blocks, in_pair[0] // num_blocks, out_channels // num_blocks)
            )
            self.register_parameter("comp", None)
        else:
            self.weight = Parameter(torch.empty(num_relations, in_pair[0], out_channels))
            self.register_parameter("comp", None)
        self.root = Parameter(torch.empty(in_pair[1], out_channels)) if root_weight else None
        self.bias = Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        glorot(self.weight)
        glorot(self.comp)
        glorot(self.root)
        zeros(self.bias)

    def forward(
        self,
        x: NodeInput | tuple[NodeInput, NodeInput],
        edge_index: Tensor | SparseTensor | RGCNMap,
        edge_type: Tensor | None = None,
        edge_weight: Tensor | None = None,
    ) -> Tensor:
        """
        Args:
            x: [N, in_channels] features, a 1-D node-id tensor or None (featureless: W_r is indexed
                by node id), or a (source, target) pair of those for bipartite graphs.
            edge_index: [2, E] (source, target) tensor or `EdgeIndex`, a SparseTensor `adj_t` whose
                values are the edge types, or an `RGCNMap` from `build_rgcn_map` (then no edge_type).
                A map built from a tensor is cached on it, so later calls and layers reuse it.
            edge_type: [E] relation of each edge.
            edge_weight: optional [E] per-edge factor (in edge_index's edge order), a constant.

        Returns:
            [num_target_nodes, out_channels].
        """
        x_src, x_dst = x if isinstance(x, tuple) else (x, x)
        if isinstance(x, tuple) and x_dst is None and x_src is not None:
            raise ValueError("x is a (source, target) pair; the target entry x[1] must not be None")
        num_src = self._num_nodes("x[0]" if isinstance(x, tuple) else "x", x_src, self.in_channels_l)
        num_dst = num_src if x_dst is None else self._num_nodes("x[1]", x_dst, self.in_channels_r)
        graph = self._graph(edge_index, edge_type, (num_src, num_dst))
        weight = self._relation_weight()
        x_src, weight = _autocast(x_src, weight)
        features = x_src is not None and x_src.is_floating_point()
        # The bias rides in the core op's epilogue, one pass over the output fewer, unless autocast
        # runs the layer in another dtype than the bias: `out + bias` then promotes the output to
        # the bias's dtype, as PyG's layer does.
        fused = features and self.bias is not None and self.bias.dtype == x_src.dtype
        fused_bias = self.bias if fused else None
        root_done = False
        if not features:
            # The scale's precision follows the rows it multiplies: here weight rows.
            out = self._featureless(x_src, weight, graph, graph.pair_scale(edge_weight, weight.dtype))
        else:
            groups = 1 if self.num_blocks is None else self.num_blocks
            rows, rmap = self._transform_input(x_src, weight, graph, edge_weight, groups)
            if self._root_first(x_dst, rows, weight, rmap, groups):
                # The root transform (and bias) written first, the messages added onto it by the
                # pair kernel: no accumulator of the messages' own, no fill, no pass that adds the
                # two (an AM-shaped layer: a bias fill and an in-place GEMM become one GEMM).
                out = x_dst @ self.root if fused_bias is None else torch.addmm(fused_bias, x_dst, self.root)
                out = relational_conv_add_(out, rows, weight, rmap, groups)
                root_done = True
            else:
                out = relational_conv(rows, weight, rmap, groups, bias=fused_bias)
        if self.root is not None and not root_done:
            if x_dst is None:  # x=None: the targets are nodes 0..N-1, so root[x_dst] is root itself
                out = out + self.root.to(out.dtype)
            elif x_dst.is_floating_point():
                # One GEMM that adds onto the messages in place: no copy of the output, no extra pass.
                out = out.addmm_(x_dst.to(out.dtype), self.root.to(out.dtype))
            else:
                out = out + self.root.to(out.dtype).index_select(0, x_dst)
        if self.bias is not None and not fused:
            out = out + self.bias
        return out

    def execution_plan(
        self,
        x: Tensor,
        edge_index: Tensor | SparseTensor | RGCNMap,
        edge_type: Tensor | None = None,
        *,
        requires_grad: bool | None = None,
        arch: tuple[int, int] | None = None,
    ) -> ConvPlan:
        """How this layer's relational convolution runs over float features `x` (see
        `relconv.ops.plan`: dataflow, kernel and why); `arch` plans for that CUDA compute capability."""
        num = self._num_nodes("x", x, self.in_channels_l)
        graph = self._graph(edge_index, edge_type, (num, num))
        weight = self._relation_weight()
        groups = 1 if self.num_blocks is None else self.num_blocks
        rmap, first = self._transform_map(graph, x, groups)
        conv_plan = plan(rmap, x, weight, groups, requires_grad=requires_grad, arch=arch)
        why = conv_plan.why
        if first is not None:
            why += f"; over the (target, relation) slots, {first} first"
        if arch is None and self._root_first(x, x, weight, rmap, groups, requires_grad):
            why += "; the messages added onto the root transform (relational_conv_add_)"
        return replace(conv_plan, why=why)

    def __repr__(self) -> str:
        name = self.__class__.__name__
        return f"{name}({self.in_channels}, {self.out_channels}, num_relations={self.num_relations})"

    # ------------------------------------------------------------------ helpers
    def _num_nodes(self, name: str, x: Tensor | None, channels: int) -> int:
        """Rows of one side of `x`, checking its shape and device against the parameters."""
        if x is None:
            return self.in_channels_l
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a tensor or None, got {type(x).__name__}")
        if x.device != self.weight.device:
            raise ValueError(
                f"{name} is on {x.device} but the layer's parameters are on {self.weight.device}"
            )
        if x.is_floating_point():
            if x.dim() != 2 or x.size(1) != channels:
                raise ValueError(f"{name} must have shape [num_nodes, {channels}], got {tuple(x.shape)}")
        elif x.dim() != 1 or x.dtype == torch.bool:
            raise ValueError(
                f"{name} must be float features or a 1-D integer node-id tensor, "
                f"got {x.dtype} of shape {tuple(x.shape)}"
            )
        return x.size(0)

    def _graph(self, edge_index: object, edge_type: Tensor | None, num_nodes: tuple[int, int]) -> RGCNMap:
        if isinstance(edge_index, RGCNMap):
            if edge_type is not None:
                raise ValueError(
                    "edge_type must be None when edge_index is an RGCNMap (the map holds the types)"
                )
            graph = edge_index
        else:
            graph = cached_rgcn_map(edge_index, edge_type, num_nodes, self.num_relations, self.aggr)
        if (graph.num_src, graph.num_dst) != num_nodes:
            raise ValueError(
                f"edge_index was built for (source, target) node counts ({graph.num_src}, {graph.num_dst}) "
                f"but x gives {num_nodes}"
            )
        if graph.num_relations != self.num_relations:
            raise ValueError(
                f"edge_index has num_relations={graph.num_relations} but the layer has {self.num_relations}"
            )
        if graph.aggr != AGGRS[self.aggr]:
            raise ValueError(f"edge_index was built for aggr={graph.aggr!r} but the layer uses {self.aggr!r}")
        if graph.device != self.weight.device:
            raise ValueError(
                f"edge_index is on {graph.device} but the layer's parameters are on {self.weight.device}"
            )
        return graph

    def _relation_weight(self) -> Tensor:
        """W as [R, C_in, C_out], or [R, B, C_in/B, C_out/B] for blocks; bases in one matmul."""
        if self.comp is None:
            return self.weight
        basis = self.weight.reshape(self.num_bases, -1)
        return (self.comp @ basis).view(self.num_relations, self.in_channels_l, self.out_channels)

    def _transform_map(
        self, graph: RGCNMap, x: Tensor, groups: int, edge_weight: Tensor | None = None
    ) -> tuple[RelationalMap, str | None]:
        """The map the per-relation transform runs over, and what aggregates before it: the edges
        themselves (None; the map then carries each edge's scale), or the slots after a max or a
        sum of each slot's inputs."""
        if graph.aggr == "max":
            return graph.slots.slot_map, "max"
        slots = graph.slots_summed_first(x, x.size(1) // groups, self.out_channels // groups)
        if slots is None:
            return graph.conv_map(graph.pair_scale(edge_weight, x.dtype)), None
        return (slots.mean_map(x.dtype) if graph.aggr == "mean" else slots.slot_map), "sum"

    def _transform_input(
        self, x: Tensor, weight: Tensor, graph: RGCNMap, edge_weight: Tensor | None, groups: int
    ) -> tuple[Tensor, RelationalMap]:
        """The rows and the map the per-relation transform runs over: x itself over the edges, or
        the slots' sums or maxima over the slot map (`_transform_map`)."""
        rmap, first = self._transform_map(graph, x, groups, edge_weight)
        if first is None:
            return x, rmap
        if first == "sum":
            # One GEMM row per slot instead of per edge; the mean's 1/deg rides on the slot map.
            return slot_sum(x, graph.slots, graph.edge_values(edge_weight, x.dtype)), rmap
        # Max over each (target, relation) slot of the raw inputs, then one core call transforms the
        # slot rows (PyG aggregates before the per-relation matmul too).
        rows = x.index_select(0, graph.rmap.in_index)
        scale = graph.pair_scale(edge_weight, x.dtype)
        if scale is not None:
            rows = rows * scale.to(rows.dtype).unsqueeze(1)
        return _slot_max(rows, graph), rmap

    def _root_first(
        self,
        x_dst: NodeInput,
        rows: Tensor,
        weight: Tensor,
        rmap: RelationalMap,
        groups: int,
        requires_grad: bool | None = None,
    ) -> bool:
        """Whether the root transform runs first and the messages are added onto it in place: an
        inference call (nothing needs a gradient; `requires_grad` None: as grad mode and the
        tensors say) with float target features in the rows' dtype, on the pair kernel in that
        dtype (`adds_in_place`)."""
        if self.root is None or x_dst is None or not x_dst.is_floating_point():
            return False
        dtype = rows.dtype
        if x_dst.dtype != dtype or self.root.dtype != dtype:
            return False
        if requires_grad is None:
            requires_grad = torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (rows, weight, x_dst, self.root, self.bias)
            )
        return not requires_grad and adds_in_place(rows, weight, rmap, groups)

    def _featureless(
        self, ids: Tensor | None, weight: Tensor, graph: RGCNMap, scale: Tensor | None
    ) -> Tensor:
        """x_j is the one-hot of node j, so x_j @ W_r is row j of W_r: a gather of weight rows."""
        if self.num_blocks is not None:
            raise ValueError("num_blocks needs floating-point node features x; got node ids / None")
        rmap = graph.rmap
        num_rows = weight.size(1)
        src = rmap.in_index.long() if ids is None else ids.index_select(0, rmap.in_index).long()
        relation = torch.repeat_interleave(
            torch.arange(rmap.num_relations, device=rmap.device),
            rmap.rel_ptr.diff(),
            output_size=rmap.num_pairs,
        )
        # Summed in the accumulation dtype like the core op: a bf16 index_add of 162 equal rows into
        # one node lost 8% (found by the GPU property run).
        acc = acc_dtype(weight.dtype)
        rows = weight.reshape(-1, weight.size(-1)).index_select(0, relation * num_rows + src).to(acc)
        if scale is not None:
            rows = rows * scale.to(acc).unsqueeze(1)
        if graph.aggr == "max":
            rows, target = _slot_max(rows, graph), graph.slots.slot_map.out_index
        else:
            target = rmap.out_index
        out = rows.new_zeros(rmap.num_out, rows.size(1)).index_add(0, target.long(), rows)
        return out.to(weight.dtype)


def _slot_max(rows: Tensor, graph: RGCNMap) -> Tensor:
    """[E, C] pair rows -> [num_slots, C] channel-wise max per (target, relation) slot."""
    index = graph.slots.slot_index.unsqueeze(1).expand_as(rows)
    return rows.new_zeros(graph.slots.num_slots, rows.size(1)).scatter_reduce(
        0, index, rows, "amax", include_self=False
    )


def _autocast(x: Tensor | None, weight: Tensor) -> tuple[Tensor | None, Tensor]:
    """Under autocast, run the whole layer in the autocast dtype: the core op would cast its own
    operands, but the featureless row gather, the max slot aggregation and the scale's precision
    happen outside it and must see the same dtype."""
    device_type = weight.device.type
    if not torch.is_autocast_enabled(device_type):
        return x, weight
    dtype = torch.get_autocast_dtype(device_type)
    if x is not None and x.is_floating_point():
        x = x.to(dtype)
    return x, weight.to(dtype)
