"""benchmarks.workloads.hash_probes: the host model of relconv's CUDA coordinate hash against a
slot-by-slot linear-probing table filled in random order."""

import numpy as np
import pytest

from benchmarks.workloads.hash_probes import Table, downsample_probes, hash_coord, submanifold_probes


def test_hash_coord_is_the_cuda_hash():
    # hash_coord of csrc/cuda/kernel_map_hash.cuh, compiled as host C++, on these rows.
    rows = np.array([[0, 0, 0, 0], [1, 2, 3, 4], [-1, 100000, -7, 65535]], np.int32)
    assert hash_coord(rows).tolist() == [0, 1232189467, 2264847294]


def _probe_by_hand(h, capacity, rng):
    mask = capacity - 1
    slots = [-1] * capacity
    for i in rng.permutation(len(h)):
        s = int(h[i]) & mask
        while slots[s] != -1:
            s = (s + 1) & mask
        slots[s] = int(i)
    return slots


@pytest.mark.parametrize("seed", range(40))
def test_table_is_the_table_any_insert_order_builds(seed):
    rng = np.random.default_rng(seed)
    capacity = int(2 ** rng.integers(5, 10))
    n = int(rng.integers(1, capacity // 2 + 1))
    h = rng.choice(2**32, size=n, replace=False).astype(np.uint64)
    table = Table(h, capacity)
    slots = _probe_by_hand(h, capacity, rng)
    mask, bits = capacity - 1, capacity.bit_length() - 1
    assert table.filled.tolist() == [s != -1 for s in slots]
    by_hand = sum((s - (int(h[i]) & mask)) & mask for s, i in enumerate(slots) if i != -1)
    assert table.total_displacement == by_hand == int(table.displacement.sum())
    for k in range(n):  # every key sits where its probe sequence reaches it, under its tag
        at = (int(h[k]) + int(table.displacement[k])) & mask
        assert table.tags[at] == int(h[k]) >> bits
    for first in range(capacity):  # a miss reads up to and including the next empty slot
        s, reads = first, 1
        while slots[s] != -1:
            s, reads = (s + 1) & mask, reads + 1
        assert table.run[first] == reads


def test_scene_summaries_count_every_query():
    rng = np.random.default_rng(0)
    coords = np.unique(
        np.concatenate([rng.integers(0, 2, (400, 1)), rng.integers(0, 12, (400, 3))], 1), axis=0
    ).astype(np.int32)
    n = len(coords)
    sub = submanifold_probes(coords)
    assert sub["entries"] == n and sub["queries"] == 13 * n
    assert 0.25 < sub["load"] <= 0.5 and sub["capacity"] >= 2 * n
    assert sub["probes_hit"][0] >= 1 and sub["mean_probes_hit_exact"] >= 1
    assert sub["probes_miss"][0] >= 1 and sub["rows_query"] >= sub["hit_frac"]
    # The 13 offsets below the centre: a voxel never queries itself, its hits are occupied neighbours.
    occupied = {tuple(r) for r in coords.tolist()}
    offsets = [(dx, dy, dz) for dx in (-1, 0, 1) for dy in (-1, 0, 1) for dz in (-1, 0, 1)][:13]
    hits = sum((b, x + dx, y + dy, z + dz) in occupied for b, x, y, z in occupied for dx, dy, dz in offsets)
    assert sub["hit_frac"] == pytest.approx(hits / (13 * n), abs=1e-4)
    down = downsample_probes(coords)
    assert down["queries"] == n and down["hit_frac"] == 1.0
    assert down["entries"] == len({(b, x >> 1, y >> 1, z >> 1) for b, x, y, z in occupied})
