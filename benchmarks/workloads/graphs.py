"""Synthetic knowledge graphs with the statistics of the R-GCN entity-classification sets.

Counts are those of the PyG `Entities` datasets, inverse edges included: every base triple
(s, r, d) comes with (d, r + R/2, s). Degrees are power-law (Chung-Lu: endpoints drawn with
probability proportional to a Zipf weight, so a few hubs collect most edges, like rdf:type targets)
and relation frequencies are Zipf-skewed (a few relations carry most triples, a long tail carries
a handful each). Labels are synthetic but tied to structure (a node's first outgoing relation)
so a 2-layer R-GCN has something to learn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class KGStats:
    num_nodes: int
    num_edges: int  # with inverses; even
    num_relations: int  # with inverses; even
    num_labelled: int
    num_classes: int


STATS = {
    "AIFB": KGStats(8_285, 58_086, 90, 176, 4),
    "MUTAG": KGStats(23_644, 148_454, 46, 340, 2),
    "BGS": KGStats(333_845, 1_832_398, 206, 146, 2),
    "AM": KGStats(1_666_764, 11_976_642, 266, 1_000, 11),
    "tiny": KGStats(300, 2_000, 8, 40, 3),
}

# Zipf exponents: node weights ~ rank^-DEGREE_SKEW, relation weights ~ rank^-RELATION_SKEW.
DEGREE_SKEW = 0.9
RELATION_SKEW = 1.3


def _zipf_weights(n: int, skew: float, rng: np.random.Generator) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** skew
    rng.shuffle(w)  # hubs are random ids, not 0, 1, 2, ...
    return w / w.sum()


def make_kg(name: str, seed: int = 0):
    """Synthetic KG with the statistics of `name` (AIFB, MUTAG, BGS, AM or tiny).

    Returns:
        edge_index [2, E] int64 (row 0 source, row 1 target), sorted by (source, target);
        edge_type [E] int64 in [0, num_relations); relation r + R/2 is the inverse of r;
        num_nodes, num_relations;
        labels [num_nodes] int64: a class for `num_labelled` nodes, -1 elsewhere.
    """
    if name not in STATS:
        raise ValueError(f"unknown graph {name!r}; choose from {sorted(STATS)}")
    s = STATS[name]
    rng = np.random.default_rng(seed)
    half_e, half_r = s.num_edges // 2, s.num_relations // 2
    node_p = _zipf_weights(s.num_nodes, DEGREE_SKEW, rng)
    src = rng.choice(s.num_nodes, size=half_e, p=node_p)
    dst = rng.choice(s.num_nodes, size=half_e, p=node_p)
    rel = rng.choice(half_r, size=half_e, p=_zipf_weights(half_r, RELATION_SKEW, rng))
    # Every relation keeps at least one triple, as in the real sets (none is declared but unused).
    rel[rng.choice(half_e, size=half_r, replace=False)] = np.arange(half_r)

    rows = np.concatenate([src, dst])
    cols = np.concatenate([dst, src])
    types = np.concatenate([rel, rel + half_r])
    order = np.lexsort((cols, rows))
    edge_index = torch.from_numpy(np.stack([rows[order], cols[order]]).astype(np.int64))
    edge_type = torch.from_numpy(types[order].astype(np.int64))

    # A labelled node's class is its first outgoing base relation (mod classes): learnable from
    # structure; nodes without outgoing edges get a random class.
    labels = torch.full((s.num_nodes,), -1, dtype=torch.int64)
    labelled = rng.choice(s.num_nodes, size=s.num_labelled, replace=False)
    first = np.full(s.num_nodes, -1)
    first[src[::-1]] = rel[::-1]
    cls = np.where(first[labelled] >= 0, first[labelled], rng.integers(0, half_r, labelled.size))
    labels[torch.from_numpy(labelled)] = torch.from_numpy((cls % s.num_classes).astype(np.int64))
    return edge_index, edge_type, s.num_nodes, s.num_relations, labels


def num_slots(edge_index: torch.Tensor, edge_type: torch.Tensor, num_nodes: int) -> int:
    """Distinct (target, relation) pairs: the rows an aggregate-then-transform kernel multiplies."""
    key = edge_type.to(torch.int64) * num_nodes + edge_index[1].to(torch.int64)
    return int(torch.unique(key).numel())
