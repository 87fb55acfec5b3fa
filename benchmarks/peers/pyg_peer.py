"""PyG peers for the graph suite: `torch_geometric.nn.RGCNConv` and `FastRGCNConv`.

Both share relconv's `RGCNConv` constructor and state_dict (weight [R, C_in, C_out] or bases +
comp, root [C_in, C_out], bias), so weights load unchanged. PyG builds its per-relation edge split
on every call: it has no map cache, so its "cached" rows run the same call as its "fresh" ones.
"""

from __future__ import annotations

import torch


def available() -> tuple[bool, str]:
    try:
        import torch_geometric
    except ImportError as err:
        return False, f"not installed ({err})"
    return True, torch_geometric.__version__


def rgcn_layer(
    kind: str,
    state_dict: dict,
    in_channels: int,
    out_channels: int,
    num_relations: int,
    aggr: str,
    num_bases: int | None = None,
) -> torch.nn.Module:
    """`kind` "RGCNConv" or "FastRGCNConv", loaded with relconv's layer's state_dict."""
    from torch_geometric import nn as pyg_nn

    cls = getattr(pyg_nn, kind)
    layer = cls(in_channels, out_channels, num_relations, num_bases=num_bases, aggr=aggr)
    layer.load_state_dict(state_dict)
    return layer


def fast_rgcn_bytes(num_edges: int, c_in: int, c_out: int, elem: int) -> int:
    """FastRGCNConv gathers one [C_in, C_out] weight per edge: its dominant allocation."""
    return num_edges * c_in * c_out * elem
