"""HeteroData <-> the homogeneous (edge_index, edge_type) form an R-GCN consumes.

Node type t occupies global ids [node_offsets[t], node_offsets[t] + num_nodes_t); edge type k of
`data.edge_types` becomes relation k.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch_geometric.data import HeteroData
from torch_geometric.typing import EdgeType, NodeType


class RelationalGraph(NamedTuple):
    """`to_relational`'s result; unpacks as (x, edge_index, edge_type, node_type, node_offsets, metadata).

    x: [N, C] node features of all types concatenated, or None (types lack `x` or differ in C).
    edge_index: [2, E] global (source, target) ids.  edge_type: [E] int64 relation ids.
    node_type: [N] int64 index into metadata[0].  node_offsets: first global id of each node type.
    metadata: (node_types, edge_types) as `HeteroData.metadata()`; relation k is edge_types[k].
    """

    x: Tensor | None
    edge_index: Tensor
    edge_type: Tensor
    node_type: Tensor
    node_offsets: dict[NodeType, int]
    metadata: tuple[list[NodeType], list[EdgeType]]


def to_relational(data: HeteroData) -> RelationalGraph:
    """Flattens `data` into one graph with relation id = position of the edge type in `data.edge_types`."""
    if not isinstance(data, HeteroData):
        raise TypeError(f"data must be a torch_geometric HeteroData, got {type(data).__name__}")
    node_types, edge_types = data.metadata()
    if not node_types:
        raise ValueError("data has no node types")
    counts = [data[t].num_nodes for t in node_types]
    if any(n is None for n in counts):
        missing = [t for t, n in zip(node_types, counts, strict=True) if n is None]
        raise ValueError(f"data lacks num_nodes / x for node types {missing}")
    offsets, start = {}, 0
    for t, n in zip(node_types, counts, strict=True):
        offsets[t] = start
        start += n
    device = _device(data)
    node_type = torch.repeat_interleave(
        torch.arange(len(node_types), device=device), torch.tensor(counts, device=device), output_size=start
    )
    parts, types = [], []
    for k, (src, rel, dst) in enumerate(edge_types):
        ei = data[src, rel, dst].edge_index
        shift = torch.tensor([[offsets[src]], [offsets[dst]]], device=ei.device, dtype=ei.dtype)
        parts.append(ei + shift)
        types.append(torch.full((ei.size(1),), k, dtype=torch.long, device=ei.device))
    edge_index = torch.cat(parts, 1) if parts else torch.empty(2, 0, dtype=torch.long, device=device)
    edge_type = torch.cat(types) if types else torch.empty(0, dtype=torch.long, device=device)
    feats = [data[t].get("x") for t in node_types]
    same = all(f is not None and f.dim() == 2 for f in feats) and len({f.size(1) for f in feats}) == 1
    x = torch.cat(feats, 0) if same else None
    return RelationalGraph(x, edge_index, edge_type, node_type, offsets, (list(node_types), list(edge_types)))


def split_node_outputs(out: Tensor, graph: RelationalGraph) -> dict[NodeType, Tensor]:
    """Splits [N, ...] per-node outputs of the flattened graph back into {node type: [N_t, ...]}."""
    if out.size(0) != graph.node_type.numel():
        raise ValueError(f"out has {out.size(0)} rows but the graph has {graph.node_type.numel()} nodes")
    node_types = graph.metadata[0]
    ends = [graph.node_offsets[t] for t in node_types[1:]] + [out.size(0)]
    return {t: out[graph.node_offsets[t] : end] for t, end in zip(node_types, ends, strict=True)}


def _device(data: HeteroData) -> torch.device:
    for store in data.stores:
        for value in store.values():
            if isinstance(value, Tensor):
                return value.device
    return torch.device("cpu")
