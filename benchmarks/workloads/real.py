"""Real data shipped inside PyPI packages (fetched and cached by `relconv.datasets`).

- `small-gicp==1.0.1` sdist: two real outdoor LiDAR scans, data/source.ply and data/target.ply
  (binary PLY, float x/y/z/scalar_intensity, ~70k points each).
- `recbole==1.2.1` wheel: recbole/dataset_example/ml-100k/: a Freebase KG (ml-100k.kg, tab-separated
  head/relation/tail tokens) linked to MovieLens-100k items (ml-100k.link) and ratings (ml-100k.inter).

A machine without network (the GPU host) reads them from the cache `$RELCONV_CACHE` or
~/.cache/relconv; callers treat `DataUnavailable` as "workload skipped".
"""

from __future__ import annotations

import torch

from relconv.datasets import DataUnavailable, fetch_member
from relconv.datasets.lidar import small_gicp_scan

__all__ = ["DataUnavailable", "movielens_kg", "small_gicp_scans"]


def small_gicp_scans() -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """{"source": (points [N, 3] float32, intensity [N] float32 or None), "target": ...}."""
    scans = {}
    for name in ("source", "target"):
        points, inten = small_gicp_scan(name)
        scans[name] = (torch.from_numpy(points), None if inten is None else torch.from_numpy(inten))
    return scans


def _read_table(path) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        next(f)  # header "name:type<TAB>..."
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


def movielens_kg():
    """The ml-100k Freebase KG joined to MovieLens-100k as one typed graph, inverse edges included.

    Nodes: KG entities, then users, then items without a KG entity. Relations: the KG's relations,
    "rated_1".."rated_5" (user -> item, by rating) and each one's inverse (relation r + R/2).

    Returns (edge_index [2, E] int64, edge_type [E] int64, num_nodes, num_relations, relation_names).
    """

    def member(name):
        return fetch_member("recbole", "1.2.1", f"dataset_example/ml-100k/{name}", sdist=False)

    kg = _read_table(member("ml-100k.kg"))
    link = dict(_read_table(member("ml-100k.link")))
    inter = _read_table(member("ml-100k.inter"))

    nodes: dict[str, int] = {}

    def node(token: str) -> int:
        return nodes.setdefault(token, len(nodes))

    relations: dict[str, int] = {}
    src, dst, rel = [], [], []
    for head, relation, tail in kg:
        src.append(node(head))
        dst.append(node(tail))
        rel.append(relations.setdefault(relation, len(relations)))
    for user, item, rating, _ in inter:
        src.append(node(f"user:{user}"))
        dst.append(node(link.get(item, f"item:{item}")))
        rel.append(relations.setdefault(f"rated_{int(float(rating))}", len(relations)))
    base = len(relations)
    s, d, r = (torch.tensor(v, dtype=torch.int64) for v in (src, dst, rel))
    edge_index = torch.stack([torch.cat([s, d]), torch.cat([d, s])])
    edge_type = torch.cat([r, r + base])
    names = list(relations) + [f"inverse:{n}" for n in relations]
    return edge_index, edge_type, len(nodes), 2 * base, names
