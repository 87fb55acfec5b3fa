"""Real data shipped inside PyPI packages (fetched and cached by `relconv.datasets`).

- `small-gicp==1.0.1` sdist: two real outdoor LiDAR scans, data/source.ply and data/target.ply
  (binary PLY, float x/y/z/scalar_intensity, ~70k points each).
- `recbole==1.2.1` wheel: recbole/dataset_example/ml-100k/: a Freebase KG (ml-100k.kg, tab-separated
  head/relation/tail tokens) linked to MovieLens-100k items (ml-100k.link) and ratings (ml-100k.inter).

A machine without network (the GPU host) reads them from the cache `$RELCONV_CACHE` or
~/.cache/relconv; callers treat `DataUnavailable` as "workload skipped".
"""

from __future__ import annotations

import numpy as np
import torch

from relconv.datasets import DataUnavailable, fetch_member

__all__ = ["DataUnavailable", "movielens_kg", "read_ply", "small_gicp_scans"]

_PLY_TYPES = {
    "float": "<f4",
    "float32": "<f4",
    "double": "<f8",
    "float64": "<f8",
    "uchar": "u1",
    "uint8": "u1",
    "char": "i1",
    "int8": "i1",
    "short": "<i2",
    "ushort": "<u2",
    "int": "<i4",
    "int32": "<i4",
    "uint": "<u4",
    "uint32": "<u4",
}


def read_ply(path) -> dict[str, np.ndarray]:
    """Vertex properties of a binary little-endian PLY file (no list properties), by name."""
    with open(path, "rb") as f:
        if f.readline().strip() != b"ply":
            raise ValueError(f"{path}: not a PLY file")
        fields, count, in_vertex = [], 0, False
        for raw in iter(f.readline, b""):
            words = raw.decode("ascii", "replace").split()
            if not words:
                continue
            if words[0] == "format" and words[1] != "binary_little_endian":
                raise ValueError(f"{path}: only binary_little_endian PLY is supported, got {words[1]}")
            if words[0] == "element":
                in_vertex = words[1] == "vertex"
                if in_vertex:
                    count = int(words[2])
                elif count:
                    break  # later elements (faces) are not needed; vertices come first
            elif words[0] == "property" and in_vertex:
                if words[1] == "list":
                    raise ValueError(f"{path}: list properties in the vertex element are not supported")
                fields.append((words[2], _PLY_TYPES[words[1]]))
            elif words[0] == "end_header":
                break
        data = np.frombuffer(f.read(count * np.dtype(fields).itemsize), dtype=np.dtype(fields), count=count)
    return {name: np.ascontiguousarray(data[name]) for name, _ in fields}


def small_gicp_scans() -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """{"source": (points [N, 3] float32, intensity [N] float32 or None), "target": ...}."""
    scans = {}
    for name in ("source", "target"):
        props = read_ply(fetch_member("small-gicp", "1.0.1", f"data/{name}.ply", sdist=True))
        points = torch.from_numpy(np.stack([props["x"], props["y"], props["z"]], 1).astype(np.float32))
        inten = next((props[k] for k in props if "intensity" in k), None)
        scans[name] = (points, None if inten is None else torch.from_numpy(inten.astype(np.float32)))
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
