"""Small link-prediction knowledge graphs that the `pykeen==1.11.1` wheel ships as plain files.

`pykeen/datasets/{kinships,nations,umls}/{train,valid,test}.txt` hold one `head<TAB>relation<TAB>tail`
triple per line. Nothing from pykeen is imported: the files are extracted with `fetch_member`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from relconv.datasets.pypi_cache import fetch_member

PYKEEN_VERSION = "1.11.1"
PYKEEN_GRAPHS = ("kinships", "nations", "umls")
SPLITS = ("train", "valid", "test")


@dataclass
class TripleSplits:
    """Triples as id tensors; ids index `entities` / `relations` (sorted names, so stable across runs)."""

    splits: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # split -> (heads, relations, tails)
    entities: list[str]
    relations: list[str]


def read_triples(paths: Mapping[str, Path]) -> TripleSplits:
    """Parses tab-separated triple files, one per split; one vocabulary covers all splits.

    The vocabulary spans every split so that a test entity or relation unseen in training still gets
    an id (it is then ranked, as any model would rank it, from an untrained embedding).
    """
    rows: dict[str, list[list[str]]] = {}
    for split, path in paths.items():
        rows[split] = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 3:
                raise ValueError(f"{path}:{number}: expected head<TAB>relation<TAB>tail, got {line!r}")
            rows[split].append(fields)
    entities = sorted({f for r in rows.values() for h, _, t in r for f in (h, t)})
    relations = sorted({rel for r in rows.values() for _, rel, _ in r})
    ent_id = {e: i for i, e in enumerate(entities)}
    rel_id = {r: i for i, r in enumerate(relations)}
    splits = {}
    for split, r in rows.items():
        ids = torch.tensor([[ent_id[h], rel_id[rel], ent_id[t]] for h, rel, t in r], dtype=torch.long)
        ids = ids.reshape(-1, 3)  # an empty split stays [0, 3]
        splits[split] = (ids[:, 0], ids[:, 1], ids[:, 2])
    return TripleSplits(splits, entities, relations)


def pykeen_triples(name: str) -> TripleSplits:
    """Train/valid/test triples of pykeen's `name` graph ("umls", "kinships" or "nations").

    Raises `DataUnavailable` when the wheel is neither cached nor downloadable.
    """
    if name not in PYKEEN_GRAPHS:
        raise ValueError(f"name must be one of {PYKEEN_GRAPHS}, got {name!r}")
    paths = {
        split: fetch_member("pykeen", PYKEEN_VERSION, f"pykeen/datasets/{name}/{split}.txt", sdist=False)
        for split in SPLITS
    }
    return read_triples(paths)


__all__ = ["PYKEEN_GRAPHS", "TripleSplits", "pykeen_triples", "read_triples"]
