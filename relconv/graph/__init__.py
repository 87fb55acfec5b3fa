"""PyG front end: `RGCNConv` (drop-in for `torch_geometric.nn.RGCNConv`), graph maps, HeteroData helpers.

Imports torch_geometric; the core (`relconv.core`, `relconv.ops`) does not.
"""

from relconv.graph.graph_map import RGCNMap, build_rgcn_map
from relconv.graph.hetero import RelationalGraph, split_node_outputs, to_relational
from relconv.graph.rgcn_conv import RGCNConv

__all__ = ["RGCNConv", "RGCNMap", "RelationalGraph", "build_rgcn_map", "split_node_outputs", "to_relational"]
