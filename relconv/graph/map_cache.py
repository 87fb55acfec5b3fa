"""Per-graph cache of RGCNMaps, kept on the edge_index object itself.

Every layer fed the same `edge_index` (and `edge_type`) tensor finds the map its first call built, so a
drop-in model builds it once per graph, not per layer or per epoch. The cache dies with the tensor; an
in-place change of either tensor (its `_version`) or another `edge_type` object rebuilds it.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import NamedTuple

import torch
from torch import Tensor

from relconv.graph.graph_map import AGGRS, RGCNMap, build_rgcn_map, check_adjacency_type

_ATTR = "_relconv_rgcn_maps"


class _Slot:
    """The cache attached to one edge_index object."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: dict[tuple, _Entry] = {}

    def __reduce__(self):
        # A pickled / deep-copied graph carries no maps. OrderedDict keeps `torch.load(weights_only=True)`
        # of a saved edge_index working; the copy rebuilds its maps on first use.
        return (OrderedDict, ())


class _Entry(NamedTuple):
    edge_type: object  # weakref to the edge_type tensor, or None for SparseTensor input
    versions: tuple[int, ...]
    rgcn_map: RGCNMap


@torch.compiler.disable
def cached_rgcn_map(
    edge_index: object,
    edge_type: Tensor | None,
    num_nodes: tuple[int, int],
    num_relations: int,
    aggr: str,
) -> RGCNMap:
    """The map of (edge_index, edge_type), built on first use and reused while neither tensor changes.

    Runs eagerly under torch.compile (the lookup is Python bookkeeping); pass a prebuilt map from
    `build_rgcn_map` for a graph without breaks.
    """
    check_adjacency_type(edge_index)
    slot = getattr(edge_index, _ATTR, None)
    if not isinstance(slot, _Slot):
        slot = _Slot()
        setattr(edge_index, _ATTR, slot)
    key = (num_nodes, num_relations, AGGRS.get(aggr, aggr))
    versions = _versions(edge_index, edge_type)
    entry = slot.entries.get(key)
    if entry is not None and entry.versions == versions and _deref(entry.edge_type) is edge_type:
        return entry.rgcn_map
    rgcn_map = build_rgcn_map(edge_index, edge_type, num_nodes, num_relations, aggr)
    ref = None if edge_type is None else weakref.ref(edge_type)
    slot.entries[key] = _Entry(ref, versions, rgcn_map)
    return rgcn_map


def _deref(ref: object) -> object:
    return None if ref is None else ref()


def _versions(edge_index: object, edge_type: Tensor | None) -> tuple[int, ...]:
    if isinstance(edge_index, Tensor):
        tensors = [edge_index]
    else:  # SparseTensor: its row / col / value storage
        tensors = [t for t in edge_index.coo() if t is not None]
    if edge_type is not None:
        tensors.append(edge_type)
    return tuple(t._version for t in tensors)
