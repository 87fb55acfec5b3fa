"""Probe lengths of relconv's CUDA coordinate hash on every scene family, computed exactly on the host.

The CUDA map builders (csrc/cuda/kernel_map_hash.cuh) keep one int32 slot per entry in a table of
`hash_capacity(n)` slots (the smallest power of two >= 2n, at least 32: csrc/cuda/kernel_map.cu),
hash a (b, x, y, z) row with `hash_coord` (a multiply-add by odd constants and murmur3's 32-bit
finaliser), take the low bits as the first slot and probe linearly; a slot's upper bits hold a tag
(the hash bits above the slot's), and a probe reads the stored coordinate row only on a tag match.

For linear probing the set of occupied slots does not depend on the order of the inserts, nor does
the total displacement of the keys (so the mean probes per hit); a miss probes from its first slot to
the next empty one. Both are therefore what the GPU kernels do, whatever order their threads insert
in; only the spread of the hit lengths depends on that order (reported for keys placed in the order of
their first slot). This module recomputes the table from the scene's coordinates with the same hash,
capacity rule and tag width and counts, per query of a submanifold 3^3 map (13 per voxel: the offsets
below the centre, csrc/cuda/kernel_map_query.cuh) and of a 2^3 stride-2 map's coarse table:

  load         entries / slots (between 1/4 and 1/2 by the capacity rule)
  hit_frac     fraction of the queries that find a voxel
  probes_hit   slots read by a query that finds its key (mean; p99)
  probes_miss  slots read by a query that does not (mean; p99)
  slots_query  slots read per query, hits and misses together
  rows_query   coordinate rows read per query (a tag match, true or false)
  table_mib    slot table size (the coordinate rows add 16 bytes per voxel)

and the submanifold table once more with twice the slots (`subm3_4x`), the candidate rule that would
make its load, and so its probes, depend less on where a scene's size falls between powers of two.

    python -m benchmarks.workloads.hash_probes [--scenes PATTERN] [--out FILE] [--list]

(FILE defaults to benchmarks/workloads/hash_probes.json; --list prints its table.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.workloads.families import family_of, make_scene, remeasure

OUT_PATH = Path(__file__).with_name("hash_probes.json")
M32 = np.uint64(0xFFFFFFFF)
_CONSTANTS = (0x27D4EB2F, 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D)
_QUERY_CHUNK = 1 << 23


def hash_coord(coords: np.ndarray) -> np.ndarray:
    """`hash_coord` of kernel_map_hash.cuh for [N, 4] int32 (b, x, y, z) rows: uint32 as uint64."""
    c = coords.astype(np.int64).astype(np.uint64) & M32  # the int32 -> uint32 cast
    h = np.zeros(len(c), np.uint64)
    for col, k in enumerate(_CONSTANTS):
        h = (h + (c[:, col] * np.uint64(k) & M32)) & M32
    h ^= h >> np.uint64(16)
    h = h * np.uint64(0x85EBCA6B) & M32
    h ^= h >> np.uint64(13)
    h = h * np.uint64(0xC2B2AE35) & M32
    h ^= h >> np.uint64(16)
    return h


def hash_capacity(n: int, slots_per_entry: int = 2) -> int:
    """The CUDA rule (`slots_per_entry` 2): the smallest power of two >= 2n, at least 32."""
    cap = 32
    while cap < slots_per_entry * n:
        cap *= 2
    return cap


class Table:
    """The occupied slots of a linear-probing table of `capacity` slots holding keys with hashes `h`,
    each key's slot (placed in the order of their first slots) and the tag stored in every slot."""

    def __init__(self, h: np.ndarray, capacity: int) -> None:
        bits = capacity.bit_length() - 1
        self.capacity, self.mask = capacity, capacity - 1
        home = (h & np.uint64(self.mask)).astype(np.int64)
        count = np.bincount(home, minlength=capacity)
        # Keys left over to place after slot s: carry[s] = max(0, carry[s-1] + count[s] - 1), around
        # the ring. Start after a slot whose carry is 0 (the minimum of the prefix sums) so the
        # recurrence is a plain scan: carry = S - running min of S (S the prefix sums of count - 1).
        start = int(np.argmin(np.cumsum(count - 1))) + 1
        order = np.roll(np.arange(capacity), -start)
        s = np.cumsum(count[order] - 1)
        carry = s - np.minimum(np.minimum.accumulate(s), 0)
        filled = np.empty(capacity, bool)
        filled[order] = (np.concatenate(([0], carry[:-1])) + count[order]) > 0
        self.filled = filled
        self.total_displacement = int(carry.sum())
        # Inserted in the ring order of their first slots (from `start`), the keys take the occupied
        # slots in that same order, each at or after its first slot.
        by_first = np.argsort((home - start) & self.mask, kind="stable")
        position = np.empty(len(h), np.int64)
        position[by_first] = order[filled[order]]
        self.displacement = (position - home) & self.mask
        self.tags = np.full(capacity, -1, np.int64)
        self.tags[position] = (h >> np.uint64(bits)).astype(np.int64)
        # Slots from each slot to the next empty one, empties included (a miss starting there
        # reads that many slots): a reverse scan over the ring, started at an empty slot.
        empty = int(np.flatnonzero(~filled)[0])
        ring = np.roll(np.arange(capacity), -(empty + 1))[::-1]  # ends at the empty slot
        run = np.zeros(capacity, np.int64)
        f = filled[ring]
        # Distance to the next empty slot, counting itself: consecutive occupied slots add up.
        idx = np.arange(capacity)
        last_empty = np.maximum.accumulate(np.where(~f, idx, -1))
        run[ring] = idx - last_empty + 1
        self.run = run

    def misses(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots read and tag matches (coordinate rows read) by queries with hashes `h` not in the table."""
        first = (h & np.uint64(self.mask)).astype(np.int64)
        tag = (h >> np.uint64(self.capacity.bit_length() - 1)).astype(np.int64)
        length = self.run[first]
        matches = np.zeros(len(h), np.int64)
        for step in range(int(length.max()) - 1):
            live = length - 1 > step
            slot = (first[live] + step) & self.mask
            matches[live] += self.tags[slot] == tag[live]
        return length, matches

    def hits(self, keys: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots read and coordinate rows read by queries for the stored keys `keys` (hashes `h`)."""
        first = (h & np.uint64(self.mask)).astype(np.int64)
        tag = (h >> np.uint64(self.capacity.bit_length() - 1)).astype(np.int64)
        d = self.displacement[keys]
        matches = np.ones(len(keys), np.int64)  # the key's own row
        for step in range(int(d.max()) if len(d) else 0):
            live = d > step
            matches[live] += self.tags[(first[live] + step) & self.mask] == tag[live]
        return d + 1, matches


def _packed_lookup(coords: np.ndarray):
    """A sorted-key index of the coordinates: find(rows) -> index of each row or -1."""
    c = coords.astype(np.int64)
    lo = c.min(0) - 1
    dims = c.max(0) - lo + 2
    steps = np.array([dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1], np.int64)
    key = (c - lo) @ steps
    order = np.argsort(key)
    skey = key[order]

    def find(rows: np.ndarray) -> np.ndarray:
        k = (rows.astype(np.int64) - lo) @ steps
        i = np.minimum(np.searchsorted(skey, k), len(skey) - 1)
        return np.where(skey[i] == k, order[i], -1)

    return find


def _summary(length: np.ndarray, rows: np.ndarray, found: np.ndarray) -> dict:
    hit, miss = length[found], length[~found]

    def stat(a: np.ndarray) -> list:
        return [round(float(a.mean()), 3), int(np.percentile(a, 99))] if len(a) else [0.0, 0]

    return {
        "queries": int(len(length)),
        "hit_frac": round(float(found.mean()), 4),
        "probes_hit": stat(hit),
        "probes_miss": stat(miss),
        "slots_query": round(float(length.mean()), 3),
        "rows_query": round(float(rows.mean()), 4),
    }


def _query(table: Table, find, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    found_at = find(keys)
    found = found_at >= 0
    h = hash_coord(keys)
    length = np.empty(len(keys), np.int64)
    rows = np.empty(len(keys), np.int64)
    length[found], rows[found] = table.hits(found_at[found], h[found])
    length[~found], rows[~found] = table.misses(h[~found])
    return length, rows, found


def submanifold_probes(coords: np.ndarray, slots_per_entry: int = 2) -> dict:
    """The 13 queries per voxel of a submanifold 3^3 map against the table of the voxels
    (`slots_per_entry`: the capacity rule, 2 as on CUDA)."""
    n = len(coords)
    capacity = hash_capacity(n, slots_per_entry)
    table = Table(hash_coord(coords), capacity)
    find = _packed_lookup(coords)
    offsets = [(dx, dy, dz) for dx in (-1, 0, 1) for dy in (-1, 0, 1) for dz in (-1, 0, 1)][:13]
    parts = []
    per_chunk = max(1, _QUERY_CHUNK // 13)
    for start in range(0, n, per_chunk):
        block = coords[start : start + per_chunk].astype(np.int64)
        q = np.concatenate([block + np.array((0, *o)) for o in offsets])
        parts.append(_query(table, find, q))
    length, rows, found = (np.concatenate(p) for p in zip(*parts, strict=True))
    out = {
        "entries": n,
        "capacity": capacity,
        "load": round(n / capacity, 4),
        "table_mib": round(4 * capacity / 2**20, 1),
        "mean_probes_hit_exact": round(1 + table.total_displacement / n, 3),
    }
    out.update(_summary(length, rows, found))
    return out


def downsample_probes(coords: np.ndarray) -> dict:
    """The coarse table of a 2^3 stride-2 map: every fine row inserts its coarse site (equal keys meet
    in one slot), sized by the fine row count; each insert probes like a hit on its site."""
    coarse = coords.astype(np.int64).copy()
    coarse[:, 1:] >>= 1
    sites, inverse = np.unique(coarse, axis=0, return_inverse=True)
    capacity = hash_capacity(len(coords))
    h_sites = hash_coord(sites)
    table = Table(h_sites, capacity)
    inverse = inverse.reshape(-1)
    length, rows = table.hits(inverse, h_sites[inverse])
    out = {"entries": int(len(sites)), "capacity": capacity, "load": round(len(sites) / capacity, 4)}
    out["table_mib"] = round(4 * capacity / 2**20, 1)
    out.update(_summary(length, rows, np.ones(len(length), bool)))
    return out


def measure(name: str, seed: int = 0) -> dict:
    """The CUDA tables of a scene (`subm3`, `down2`) and, for comparison, the submanifold table at
    twice the slots (`subm3_4x`: the smallest power of two >= 4n, load 1/8 to 1/4)."""
    coords = make_scene(name, seed).coords
    return {
        "family": family_of(name),
        "voxels": int(len(coords)),
        "subm3": submanifold_probes(coords),
        "subm3_4x": submanifold_probes(coords, slots_per_entry=4),
        "down2": downsample_probes(coords),
    }


def table_text(results: dict) -> str:
    head = (
        f"{'family':<10} {'scene':<22} {'voxels':>11} {'load':>5} {'MiB':>6} {'hit':>5} "
        f"{'probe hit':>9} {'probe miss':>10} {'slots/q':>7} {'rows/q':>6} | "
        f"{'4n slots/q':>10} | {'down2 load':>10} {'slots/q':>7}"
    )
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        s, d = r["subm3"], r["down2"]
        wide = r.get("subm3_4x", {}).get("slots_query")
        wide = f"{wide:>10.2f}" if wide is not None else f"{'-':>10}"
        lines.append(
            f"{r['family']:<10} {name:<22} {r['voxels']:>11,} {s['load']:>5.2f} {s['table_mib']:>6.1f} "
            f"{s['hit_frac']:>5.2f} {s['probes_hit'][0]:>5.2f}/{s['probes_hit'][1]:<3d} "
            f"{s['probes_miss'][0]:>6.2f}/{s['probes_miss'][1]:<3d} {s['slots_query']:>7.2f} "
            f"{s['rows_query']:>6.3f} | {wide} | {d['load']:>10.2f} {d['slots_query']:>7.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.workloads.hash_probes", description=__doc__)
    p.add_argument("--scenes", default="*", help="fnmatch patterns, comma-separated (default: every scene)")
    p.add_argument("--out", type=Path, default=OUT_PATH)
    p.add_argument("--list", action="store_true", help="print the table of the results in --out")
    args = p.parse_args(argv)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    if not args.list:
        results = remeasure(results, args.scenes, measure, args.out, lambda name, r: "done")
    print(table_text(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
