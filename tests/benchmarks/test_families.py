"""Scene families of the voxel benchmarks: determinism, valid coordinates, exact neighbour statistics,
sizes, and the benchmark report's per-family summary. CPU, small sizes only."""

from __future__ import annotations

import fnmatch
import itertools

import numpy as np
import pytest
import torch

from benchmarks.harness import report
from benchmarks.workloads import families
from benchmarks.workloads.families import FAMILIES, FamilyScene, scene_stats

# The smallest size of every generated family (real scans need the network or a cache: not here).
SMALLEST = {
    family: min(generated, key=lambda n: sizes[n].expected[0])
    for family, sizes in FAMILIES.items()
    if (generated := [name for name, spec in sizes.items() if not spec.real])
}


def _assert_valid(scene: FamilyScene) -> None:
    c, f = scene.coords, scene.feats
    assert c.dtype == np.int32 and c.ndim == 2 and c.shape[1] == 4
    assert f.dtype == np.float32 and f.shape == (len(c), 4) and np.isfinite(f).all()
    assert (c >= 0).all()
    assert set(np.unique(c[:, 0]).tolist()) == set(range(scene.batch_size))
    key = c.astype(np.int64)
    lex = np.lexsort(key[:, ::-1].T)
    assert (lex == np.arange(len(c))).all(), "coords are not sorted by (b, x, y, z)"
    assert (np.diff(key, axis=0) != 0).any(1).all(), "coords repeat"
    assert ((f[:, 3] >= 0) & (f[:, 3] <= 1)).all()


@pytest.fixture(scope="module")
def small_scenes() -> dict[str, FamilyScene]:
    return {name: families.make_scene(name, seed=0) for name in SMALLEST.values()}


@pytest.mark.parametrize("family", sorted(SMALLEST))
def test_smallest_size_is_valid_and_in_its_range(family, small_scenes):
    name = SMALLEST[family]
    scene = small_scenes[name]
    _assert_valid(scene)
    lo, hi = FAMILIES[family][name].expected
    assert lo <= len(scene.coords) <= hi, (name, len(scene.coords))


@pytest.mark.parametrize("name", ["object-64", "room-5cm", "scan-32beam"])
def test_generators_are_deterministic_per_seed(name, small_scenes):
    again = families.make_scene(name, seed=0)
    first = small_scenes[name] if name in small_scenes else families.make_scene(name, seed=0)
    assert np.array_equal(first.coords, again.coords) and np.array_equal(first.feats, again.feats)
    other = families.make_scene(name, seed=1)
    assert len(other.coords) != len(first.coords) or not np.array_equal(other.coords, first.coords)


def test_aggregate_and_airborne_are_deterministic_per_seed():
    for make in (
        lambda s: families.aggregate(2, seed=s, beams=8, columns=180, max_range=20.0),
        lambda s: families.airborne(20.0, 0.5, seed=s),
    ):
        a, b, c = make(0), make(0), make(1)
        _assert_valid(a)
        assert np.array_equal(a.coords, b.coords) and np.array_equal(a.feats, b.feats)
        assert not np.array_equal(a.coords, c.coords)


def test_sweep_culling_matches_testing_every_ray(monkeypatch):
    """Testing each box and pole only against the azimuth columns it covers changes no hit."""
    world = families._world(np.random.default_rng(3), 60.0)
    origin = np.array([0.5, 1.75, families.SENSOR_HEIGHT])

    def sweep():
        return families._sweep(world, origin, 16, 360, 30.0, np.random.default_rng(4))

    culled = sweep()
    monkeypatch.setattr(families, "_column_slices", lambda *args: [slice(0, args[-1])])
    full = sweep()
    assert len(culled[0]) > 1000
    assert np.array_equal(culled[0], full[0]) and np.array_equal(culled[1], full[1])


def _brute_force_stats(coords: np.ndarray) -> tuple[list[int], float]:
    occupied = {tuple(c) for c in coords.tolist()}
    counts = [
        sum((b, x + dx, y + dy, z + dz) in occupied for dx, dy, dz in itertools.product((-1, 0, 1), repeat=3))
        for b, x, y, z in coords.tolist()
    ]
    coarse = {(b, x // 2, y // 2, z // 2) for b, x, y, z in coords.tolist()}
    return counts, len(coords) / len(coarse)


def test_neighbour_stats_match_a_brute_force_count():
    rng = np.random.default_rng(0)
    cells = rng.choice(2 * 7**3, size=300, replace=False)
    coords = np.stack([cells // 343, cells % 343 // 49, cells % 49 // 7, cells % 7], 1).astype(np.int32)
    coords[:, 1:] += np.array([0, 5, 17], np.int32)  # not at the origin: the margins must not wrap
    coords = coords[np.lexsort(coords[:, ::-1].T)]
    stats = scene_stats(FamilyScene(coords, np.zeros((len(coords), 4), np.float32), 2, 0.1))
    counts, reduction = _brute_force_stats(coords)
    mean_nb = float(np.mean(counts))
    assert stats["neighbour_histogram"] == np.bincount(counts, minlength=28)[1:].tolist()
    assert stats["neighbours_p10_p50_p90"][1] == int(np.percentile(counts, 50, method="inverted_cdf"))
    assert stats["mean_neighbours_3x3x3"] == pytest.approx(mean_nb, abs=1e-3)
    assert stats["table_density"] == pytest.approx(mean_nb / 27, abs=1e-4)
    assert stats["down2_reduction"] == pytest.approx(reduction, abs=1e-3)
    assert stats["voxels"] == 300 and stats["batch_size"] == 2
    assert stats["extent_voxels"] == [7, 7, 7]


def test_neighbour_stats_of_a_full_block():
    coords = np.array([(0, x, y, z) for x in range(4) for y in range(4) for z in range(4)], np.int32)
    stats = scene_stats(FamilyScene(coords, np.zeros((64, 4), np.float32), 1, 1.0))
    # Per axis, 2 cells see 2 and 2 see 3 occupied cells along it: mean 2.5 per axis, 2.5^3 in all.
    assert stats["mean_neighbours_3x3x3"] == pytest.approx(2.5**3)
    # Corner cells see 2^3, edge cells 2^2 * 3, face cells 2 * 3^2 and the 8 inner cells 3^3.
    hist = stats["neighbour_histogram"]
    assert (hist[8 - 1], hist[12 - 1], hist[18 - 1], hist[27 - 1]) == (8, 24, 24, 8) and sum(hist) == 64
    assert stats["down2_reduction"] == 8.0


def test_voxelize_clouds_rejects_bad_input():
    with pytest.raises(ValueError, match="voxel_size"):
        families.voxelize_clouds([(np.zeros((3, 3)), np.zeros(3))], 0.0)
    with pytest.raises(ValueError, match="clouds"):
        families.voxelize_clouds([], 0.1)
    with pytest.raises(ValueError, match="unknown family scene"):
        families.make_scene("aggregate-3t")


def test_load_scene_reads_family_scenes():
    from benchmarks.workloads.voxels import load_scene

    scene = load_scene("object-64", torch.device("cpu"))
    ref = families.make_scene("object-64")
    assert scene.coords.dtype == torch.int32 and scene.batch_size == 4
    assert torch.equal(scene.coords, torch.from_numpy(ref.coords))
    assert scene.feats.shape == (len(ref.coords), 4)


def test_family_cases_are_named_and_tagged():
    from benchmarks import voxel_suite

    specs = voxel_suite.family_case_specs(["cuda"], ["room-*", "aggregate-1m"])
    names = [s["case"] for s in specs]
    assert len(names) == len(set(names))
    assert {s["workload"] for s in specs} == {"aggregate-1m", *FAMILIES["room"]}
    assert {s["family"] for s in specs} == {"aggregate", "room"}
    assert "voxel/cuda/layer/room-2cm/subm3/C128/fp16/cached/fwd" in names
    assert "voxel/cuda/e2e/minkunet1.0/aggregate-1m/train/fp16" in names
    # The suite's default cases stay as they were: no family scene among them.
    default = {s["workload"] for s in voxel_suite.case_specs(["cuda"], tiny=False)}
    assert not default & set(families.scene_names())


def test_family_of_maps_the_fixed_workloads():
    assert families.family_of("scan64x3") == "aggregate"
    assert families.family_of("scan64b2") == "batch"
    assert families.family_of("indoor") == "room"
    assert families.family_of("room-2cm") == "room"
    assert families.family_of("graph-am") == "other"


def _row(case, impl, lat, thr=None, gpu=None, workload="room-2cm", family=None, status="ok", floor=None):
    row = dict(
        suite="voxel",
        device="cuda",
        case=case,
        impl=impl,
        status=status,
        workload=workload,
        latency_ms=lat,
        throughput_ms=thr if thr is not None else lat,
        gpu_ms=gpu,
        floor_ms=floor,
    )
    if family:
        row["family"] = family
    return row


def test_family_summary_of_a_synthetic_result_list():
    rows = [
        # room: speedups over the best peer 2.0 (a slower second peer ignored), 1.1 and 0.8
        _row("a", "relconv", 1.0, gpu=1.0, family="room", floor=0.5),
        _row("a", "spconv", 2.0, gpu=1.5),
        _row("a", "torchsparse", 5.0, gpu=4.0),
        _row("b", "relconv", 1.0, thr=2.0, family="room"),
        _row("b", "spconv", 3.0, thr=2.2),  # latency 3.0x, throughput 1.1x: the lower one counts
        _row("c", "relconv", 1.0, family="room"),
        _row("c", "spconv", 0.8),
        _row("c", "relconv-unfolded", 0.5),  # relconv's own variant is never a peer
        # the fixed workload "indoor" belongs to the room family too
        _row("d", "relconv", 1.0, workload="indoor"),
        _row("d", "spconv", 1.3),
        # aggregate: one case, and a case whose peer failed (no ratio)
        _row("e", "relconv", 2.0, workload="aggregate-1m"),
        _row("e", "spconv", 6.0),
        _row("f", "relconv", 2.0, workload="aggregate-1m"),
        _row("f", "spconv", None, status="error: boom"),
        # relconv alone (a map case): only its GPU time over the floor; another suite: not summarised
        _row("g", "relconv", 1.0, gpu=0.9, floor=0.3),
        _row("i", "relconv", 1.0, gpu=0.4, floor=0.2, workload="object-64"),
        dict(_row("h", "relconv", 1.0), suite="graph"),
        dict(_row("h", "pyg", 2.0), suite="graph"),
    ]
    summary = {e["family"]: e for e in report.family_summary(rows)}
    assert set(summary) == {"room", "aggregate", "object"}
    room = summary["room"]
    assert room["floor_rows"] == 2 and room["floor_median"] == pytest.approx(2.5)
    assert room["floor_max"] == pytest.approx(3.0)
    obj = summary["object"]
    assert obj["rows"] == 0 and obj["median"] is None and obj["floor_max"] == pytest.approx(2.0)
    assert room["rows"] == 4
    assert room["median"] == pytest.approx((1.1 + 1.3) / 2)
    assert room["min"] == pytest.approx(0.8)
    assert room["below_1.2"] == 2 and room["below_1.0"] == 1
    assert room["gpu_rows"] == 1 and room["gpu_min"] == pytest.approx(1.5)
    agg = summary["aggregate"]
    assert agg["rows"] == 1 and agg["min"] == pytest.approx(3.0) and agg["below_1.2"] == 0
    assert agg["gpu_rows"] == 0 and agg["gpu_median"] is None and agg["floor_rows"] == 0
    text = report.table(rows)
    assert "per scene family" in text and "aggregate" in text


def test_committed_stats_cover_every_scene_within_its_range(capsys):
    stats = families.load_stats()
    for family, sizes in FAMILIES.items():
        for name, spec in sizes.items():
            entry = stats[name]
            assert entry["family"] == family
            assert spec.expected[0] <= entry["voxels"] <= spec.expected[1], name
            assert entry["table_density"] == pytest.approx(entry["mean_neighbours_3x3x3"] / 27, abs=1e-3)
    assert families.main(["--list"]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in families.scene_names())
    assert "not measured" not in printed


@pytest.mark.parametrize(("name", "count", "networks"), [("core", 29, 2), ("breadth", 28, 8)])
def test_family_set_selects_family_cases_only(capsys, name, count, networks):
    from benchmarks import run, voxel_suite

    assert (
        run.main(["--suite", "voxel", "--device", "cpu", "--family-set", name, "--list", "--out", "x"]) == 0
    )
    cases = capsys.readouterr().out.split()
    scenes, patterns = voxel_suite.FAMILY_SETS[name]()
    assert len(cases) == count and len(set(cases)) == count
    # Only family scenes, each of them, and none of the default workloads' cases; every pattern
    # selects a case (a misspelt op or width would select none).
    scene_of = {c: c.split("/")[4 if "/e2e/" in c else 3] for c in cases}
    assert set(scene_of.values()) == set(scenes) <= set(families.scene_names())
    assert sum("/e2e/" in c for c in cases) == networks
    assert all(any(fnmatch.fnmatchcase(c, p) for c in cases) for p in patterns)


def test_breadth_family_set_adds_to_core():
    from benchmarks import voxel_suite

    _, core = voxel_suite.FAMILY_SETS["core"]()
    _, breadth = voxel_suite.FAMILY_SETS["breadth"]()
    assert not set(core) & set(breadth)


def test_family_set_excludes_families_and_cases():
    from benchmarks import run

    with pytest.raises(SystemExit):
        run.parse_args(["--out", "x", "--family-set", "core", "--cases", "voxel/*"])


def test_sort_rule_takes_a_scenes_sites_at_a_coarser_stride():
    from benchmarks.workloads.voxels import at_stride

    coords = torch.tensor(
        [[0, 0, 0, 0], [0, 1, 1, 1], [0, 2, 3, 4], [0, -1, 0, 0], [1, 3, 3, 3]], dtype=torch.int32
    )
    assert at_stride(coords, 1) is coords
    # floor division: -1 // 2 is -1; (0, 1, 1, 1) and (0, 0, 0, 0) meet at (0, 0, 0, 0)
    assert at_stride(coords, 2).tolist() == [[0, -1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 2], [1, 1, 1, 1]]
