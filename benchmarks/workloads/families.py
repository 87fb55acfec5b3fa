"""Scene families for the voxel benchmarks, each at several sizes, seeded and procedural (plus real scans).

Families (scene names in brackets):
  scan       single rotating-LiDAR street scans, 32/64/128 beams at 0.05 m (scan-64beam)
  real-scan  the small-gicp sdist's real outdoor scans at 0.05 m, one or both (real-scan, real-scan-b2)
  batch      training batches of 2-8 different 64-beam scans, or 8 of 32 beams (batch4-64beam)
  aggregate  N sweeps of a moving ego vehicle's LiDAR accumulated in the world frame with a small
             registration error per sweep, as nuScenes/Waymo multi-sweep inputs, 0.5M-10M voxels
             (aggregate-1m); the size follows from sweep count, beams and voxel size
  room       a furnished room scanned densely (surfaces fully covered, ~1 cm noise) at 2-5 cm (room-2cm)
  airborne   top-down laser tiles: a 2.5-D terrain with buildings and tree crowns whose pulses
             return from the canopy, inside it and from the ground below (airborne-200m-25cm), and
             the laspy sdist's real LAZ tiles where laspy and lazrs are installed (airborne-real-autzen)
  object     a batch of four closed surfaces (sphere, torus, box, union of spheres), randomly rotated
             and sampled densely on a grid of R^3 voxels (object-256)

Every generator is deterministic for its seed and returns a `FamilyScene`: int32 coords [N, 4]
(batch, x, y, z), non-negative, unique and sorted by (b, x, y, z), shifted by a multiple of 16 so that
every stride-2 level floors identically for every implementation, and float32 features [N, 4]
(voxel centre x, y, z in metres, and an intensity or grey value in [0, 1]).

`scene_stats(scene)` measures a scene's neighbourhood structure; `python -m benchmarks.workloads.families
--list` prints the table of every family and size from benchmarks/workloads/family_stats.json, and
`--update [PATTERN]` regenerates those scenes and rewrites their entries.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

STATS_PATH = Path(__file__).with_name("family_stats.json")


@dataclass
class FamilyScene:
    coords: np.ndarray  # [N, 4] int32 (b, x, y, z), x, y, z >= 0, unique, sorted by (b, x, y, z)
    feats: np.ndarray  # [N, 4] float32: voxel centre (m) and intensity in [0, 1]
    batch_size: int
    voxel_size: float


# ------------------------------------------------------------------------------------ voxelisation
def _bits(n: int) -> int:
    return max(1, int(n - 1).bit_length())


def voxelize_clouds(clouds: list[tuple[np.ndarray, np.ndarray]], voxel_size: float) -> FamilyScene:
    """Voxels of point clouds (points [P, 3] metres, value [P] in [0, 1]), cloud b as batch entry b.

    One sort of int64 keys carries the voxel (high bits) and an 8-bit value (low bits), so the mean
    value per voxel comes without an argsort of the points (the 10M-voxel aggregate's ~15M points)."""
    if voxel_size <= 0:
        raise ValueError(f"voxel_size must be positive, got {voxel_size}")
    if not clouds:
        raise ValueError("clouds must hold at least one point cloud")
    q = np.concatenate([np.floor(np.asarray(p, np.float64) / voxel_size).astype(np.int64) for p, _ in clouds])
    if len(q) == 0:
        raise ValueError("the point clouds are empty")
    batch = np.concatenate([np.full(len(p), b, np.int64) for b, (p, _) in enumerate(clouds)])
    value = np.concatenate([np.asarray(v, np.float64) for _, v in clouds])
    shift = np.floor_divide(q.min(0), 16) * 16
    q -= shift
    wx, wy, wz = (_bits(int(m) + 1) for m in q.max(0))
    wb = _bits(len(clouds))
    if wb + wx + wy + wz + 8 > 63:
        raise ValueError(f"the scene spans too many voxels at voxel_size {voxel_size} to pack its keys")
    key = batch
    for w, col in ((wx, 0), (wy, 1), (wz, 2)):
        key = (key << w) | q[:, col]
    key = (key << 8) | np.rint(np.clip(value, 0.0, 1.0) * 255).astype(np.int64)
    key.sort()
    vox = key >> 8
    start = np.flatnonzero(np.r_[True, vox[1:] != vox[:-1]])
    count = np.diff(np.r_[start, len(vox)])
    mean_value = np.add.reduceat(key & 255, start) / (255.0 * count)
    vox = vox[start]
    coords = np.empty((len(vox), 4), np.int32)
    for col, w in ((3, wz), (2, wy), (1, wx)):
        coords[:, col] = vox & ((1 << w) - 1)
        vox = vox >> w
    coords[:, 0] = vox
    centre = (coords[:, 1:] + shift + 0.5) * voxel_size
    feats = np.concatenate([centre, mean_value[:, None]], 1).astype(np.float32)
    return FamilyScene(coords, feats, len(clouds), voxel_size)


# ------------------------------------------------------------------------------------ statistics
# The 13 offsets of the 3^3 neighbourhood that come after (0, 0, 0) in (x, y, z) order; each
# neighbour pair is found once through one of them.
_HALF_OFFSETS = [
    (dx, dy, dz) for dx in (-1, 0, 1) for dy in (-1, 0, 1) for dz in (-1, 0, 1) if (dx, dy, dz) > (0, 0, 0)
]


def _packed(coords: np.ndarray, margin: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Sorted int64 keys of (b, x, y, z) with `margin` free cells on every side of x, y, z, and
    the key steps of x, y and z (so key + step * d is the neighbour at offset d, never wrapping)."""
    c = coords.astype(np.int64)
    dims = c[:, 1:].max(0) + 1 + 2 * margin
    sz, sy = 1, int(dims[2])
    sx = sy * int(dims[1])
    sb = sx * int(dims[0])
    if (int(c[:, 0].max()) + 1) * sb >= 2**62:
        raise ValueError("coords span too large a grid to pack into int64 keys")
    key = c[:, 0] * sb + (c[:, 1] + margin) * sx + (c[:, 2] + margin) * sy + (c[:, 3] + margin) * sz
    key.sort()
    return key, (sx, sy, sz)


def neighbour_histogram(coords: np.ndarray) -> np.ndarray:
    """[28] int64: entry k counts the voxels whose 3^3 window (same batch entry) holds k occupied
    voxels, the voxel itself included (entry 0 is always 0)."""
    key, (sx, sy, sz) = _packed(coords, 1)
    counts = np.ones(len(key), np.int64)
    for dx, dy, dz in _HALF_OFFSETS:
        target = key + (dx * sx + dy * sy + dz * sz)
        idx = np.minimum(np.searchsorted(key, target), len(key) - 1)
        found = key[idx] == target
        counts[found] += 1
        counts[idx[found]] += 1  # distinct targets find distinct voxels: no index repeats
    return np.bincount(counts, minlength=28)


def scene_stats(scene: FamilyScene) -> dict:
    """Size and neighbourhood statistics of a scene.

    mean_neighbours_3x3x3: occupied voxels in each voxel's 3^3 window, the voxel itself included
    (1..27), averaged over voxels: the rows per output of a submanifold 3^3 kernel map
    (`neighbour_histogram` has the distribution).
    table_density: mean_neighbours_3x3x3 / 27, the filled fraction of that map's [N, 27] table.
    down2_reduction: voxels per output voxel of a 2^3 stride-2 downsampling (1..8).
    extent_voxels / extent_m: the bounding box of the coordinates (all batch entries together)."""
    coords = scene.coords
    n = len(coords)
    if n == 0:
        raise ValueError("scene has no voxels")
    coarse = coords.astype(np.int64)
    coarse[:, 1:] >>= 1
    coarse_key, _ = _packed(coarse, 0)
    n_coarse = 1 + int(np.count_nonzero(coarse_key[1:] != coarse_key[:-1]))
    extent = (coords[:, 1:].max(0) - coords[:, 1:].min(0) + 1).astype(int)
    hist = neighbour_histogram(coords)
    mean_nb = float(hist @ np.arange(28)) / n
    cumulative = np.cumsum(hist)
    return {
        "voxels": n,
        "batch_size": scene.batch_size,
        "voxel_size_m": scene.voxel_size,
        "extent_voxels": [int(e) for e in extent],
        "extent_m": [round(float(e) * scene.voxel_size, 2) for e in extent],
        "mean_neighbours_3x3x3": round(mean_nb, 3),
        "table_density": round(mean_nb / 27.0, 4),
        # The 10th, 50th and 90th percentiles of the per-voxel count, and its histogram over 1..27.
        "neighbours_p10_p50_p90": [int(np.searchsorted(cumulative, q * n)) for q in (0.1, 0.5, 0.9)],
        "neighbour_histogram": hist[1:].tolist(),
        "down2_reduction": round(n / n_coarse, 3),
    }


# ------------------------------------------------------------------------------------ LiDAR scans
# Sensor settings per beam count: the 64-beam one is relconv.voxel.synthetic's default (HDL-64E-like);
# the 32-beam one follows the HDL-32E's field of view at ~0.5 deg azimuth steps.
SENSORS = {
    32: dict(fov_up=10.67, fov_down=-30.67, azimuth_steps=720),
    64: dict(fov_up=2.0, fov_down=-24.8, azimuth_steps=1800),
    128: dict(fov_up=2.0, fov_down=-24.8, azimuth_steps=1800),
}


def _street_scan(beams: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from relconv.voxel import synthetic

    return synthetic.raycast_scan(beams=beams, seed=seed, **SENSORS[beams])


def lidar_batch(beams: int, batch: int, seed: int = 0, voxel_size: float = 0.05) -> FamilyScene:
    """`batch` street scans of different layouts (seeds seed, seed + 1, ...), one per batch entry."""
    return voxelize_clouds([_street_scan(beams, seed + i) for i in range(batch)], voxel_size)


def real_scans(names: tuple[str, ...], seed: int = 0, voxel_size: float = 0.05) -> FamilyScene:
    """small-gicp's real scans (`relconv.datasets.DataUnavailable` offline without the cache);
    the seed is unused: the data is what it is."""
    from relconv.datasets.lidar import small_gicp_scan

    clouds = []
    for name in names:
        points, inten = small_gicp_scan(name)
        if inten is None:
            inten = np.zeros(len(points), np.float32)
        clouds.append((points, inten / max(1.0, float(inten.max()))))
    return voxelize_clouds(clouds, voxel_size)


# ------------------------------------------------------------------------------------ aggregates
SENSOR_HEIGHT = 1.8  # metres, the roof of a car


def _world(rng: np.random.Generator, length: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A straight street along x in [-length/2, length/2], ground at z = 0: boxes [B, 6]
    (x0, y0, z0, x1, y1, z1) with reflectivity [B], and poles [P, 4] (cx, cy, radius, height).
    The lane y in [0, 3.5] is kept free for the ego vehicle."""
    boxes, refl = [], []
    half = length / 2
    for side in (-1.0, 1.0):
        x = -half
        while x < half:  # buildings with gaps
            run = rng.uniform(8.0, 25.0)
            if rng.random() < 0.8:
                setback, depth, height = (
                    rng.uniform(9.0, 14.0),
                    rng.uniform(8.0, 15.0),
                    rng.uniform(6.0, 25.0),
                )
                y0, y1 = sorted((side * setback + 1.75, side * (setback + depth) + 1.75))
                boxes.append((x, y0, 0.0, x + run, y1, height))
                refl.append(rng.uniform(0.2, 0.5))
            x += run + rng.uniform(0.0, 3.0)
        x = -half
        while x < half:  # parked cars along the kerb
            if rng.random() < 0.6:
                y = 1.75 + side * rng.uniform(5.0, 6.0)
                boxes.append((x, y - 0.9, 0.2, x + 4.5, y + 0.9, 1.5))
                refl.append(rng.uniform(0.3, 0.9))
            x += rng.uniform(5.5, 9.0)
    for _ in range(int(length / 12)):  # oncoming traffic
        x, y = rng.uniform(-half, half), rng.uniform(-3.0, -1.5)
        boxes.append((x, y - 0.9, 0.2, x + 4.5, y + 0.9, 1.5))
        refl.append(rng.uniform(0.3, 0.9))
    xs = np.arange(-half, half, 12.0)
    poles = np.stack(
        [
            np.concatenate([xs + rng.uniform(-2, 2, len(xs)), xs + rng.uniform(-2, 2, len(xs))]),
            np.concatenate([np.full(len(xs), 1.75 - 7.5), np.full(len(xs), 1.75 + 7.5)])
            + rng.uniform(-0.5, 0.5, 2 * len(xs)),
            rng.uniform(0.08, 0.2, 2 * len(xs)),
            rng.uniform(4.0, 8.0, 2 * len(xs)),
        ],
        1,
    )
    return np.asarray(boxes), np.asarray(refl), poles


def _column_slices(a0: float, a1: float, az0: float, step: float, columns: int) -> list[slice]:
    """Azimuth columns covering the angle interval [a0, a1], one slice or two split at the wrap."""
    first = math.floor((a0 - az0) / step) - 1
    count = math.ceil((a1 - az0) / step) + 2 - first
    if count >= columns:
        return [slice(0, columns)]
    start = first % columns
    end = start + count
    return [slice(start, end)] if end <= columns else [slice(start, columns), slice(0, end - columns)]


def _sweep(
    world: tuple[np.ndarray, np.ndarray, np.ndarray],
    origin: np.ndarray,
    beams: int,
    columns: int,
    max_range: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """One rotating-LiDAR sweep from `origin` (world frame) against the street: points [P, 3] in the
    world frame and intensity [P]. Each box and pole is tested only against the azimuth columns it
    covers, which makes a sweep ~10x cheaper than testing every ray against every object."""
    boxes, refl, poles = world
    # The HDL-64E-like field of view for every beam count, as relconv.voxel.synthetic's 128 beams.
    elev = np.deg2rad(np.linspace(SENSORS[64]["fov_up"], SENSORS[64]["fov_down"], beams))
    step = 2 * np.pi / columns
    az0 = -np.pi + rng.uniform(0, step)  # the firing phase differs from sweep to sweep
    az = az0 + step * np.arange(columns)
    d = np.stack(
        [
            np.cos(elev)[None, :] * np.cos(az)[:, None],
            np.cos(elev)[None, :] * np.sin(az)[:, None],
            np.broadcast_to(np.sin(elev)[None, :], (columns, beams)),
        ],
        -1,
    )  # [columns, beams, 3], azimuth-major so that a range of azimuths is one slice
    with np.errstate(divide="ignore"):
        inv = 1.0 / d
        t = np.where(d[..., 2] < 0, -origin[2] / d[..., 2], np.inf)
    hit_refl = np.full(t.shape, 0.15)
    for box, r in zip(boxes, refl, strict=True):
        lo, hi = box[:3] - origin, box[3:] - origin
        if lo[0] <= 0 <= hi[0] and lo[1] <= 0 <= hi[1]:
            continue  # a footprint around the sensor spans every azimuth; the ego lane holds none
        near = np.hypot(max(lo[0], 0, -hi[0]), max(lo[1], 0, -hi[1]))
        if near > max_range:
            continue
        cx, cy = (lo[:2] + hi[:2]) / 2
        centre = math.atan2(cy, cx)
        corners = np.arctan2([lo[1], lo[1], hi[1], hi[1]], [lo[0], hi[0], lo[0], hi[0]]) - centre
        corners = (corners + np.pi) % (2 * np.pi) - np.pi
        for s in _column_slices(centre + corners.min(), centre + corners.max(), az0, step, columns):
            t1, t2 = lo * inv[s], hi * inv[s]
            t_near = np.minimum(t1, t2).max(-1)
            t_far = np.maximum(t1, t2).min(-1)
            hit = (t_far >= t_near) & (t_near > 0) & (t_near < t[s])
            t[s] = np.where(hit, t_near, t[s])
            hit_refl[s] = np.where(hit, r, hit_refl[s])
    for cx, cy, radius, height in poles:
        cx, cy = cx - origin[0], cy - origin[1]
        dist = math.hypot(cx, cy)
        if dist > max_range or dist <= radius:
            continue
        centre, half = math.atan2(cy, cx), math.asin(radius / dist)
        for s in _column_slices(centre - half, centre + half, az0, step, columns):
            dd = d[s]
            a = dd[..., 0] ** 2 + dd[..., 1] ** 2
            b = -2.0 * (dd[..., 0] * cx + dd[..., 1] * cy)
            disc = b * b - 4.0 * a * (dist * dist - radius * radius)
            ok = disc >= 0
            th = np.where(ok, (-b - np.sqrt(np.where(ok, disc, 0.0))) / (2.0 * a + 1e-12), np.inf)
            z = origin[2] + th * dd[..., 2]
            hit = ok & (th > 0) & (z >= 0) & (z <= height) & (th < t[s])
            t[s] = np.where(hit, th, t[s])
            hit_refl[s] = np.where(hit, 0.6, hit_refl[s])
    keep = t < max_range
    t, d, hit_refl = t[keep], d[keep], hit_refl[keep]
    t = t + rng.normal(0.0, 0.01, t.shape)
    inten = np.clip(hit_refl * np.exp(-t / 60.0) + rng.normal(0.0, 0.02, t.shape), 0.0, 1.0)
    return origin + d * t[:, None], inten


def aggregate(
    sweeps: int,
    seed: int = 0,
    beams: int = 64,
    columns: int = 1800,
    voxel_size: float = 0.05,
    max_range: float = 70.0,
    speed: float = 1.0,
    pose_noise: tuple[float, float] = (0.02, 0.002),
) -> FamilyScene:
    """`sweeps` sweeps of a LiDAR on a car driving `speed` metres per sweep down a street, each
    registered into the world frame with a small error (translation std-dev pose_noise[0] metres,
    yaw std-dev pose_noise[1] radians), accumulated and voxelised as one batch entry."""
    if sweeps < 1:
        raise ValueError(f"sweeps must be positive, got {sweeps}")
    rng = np.random.default_rng(seed)
    world = _world(rng, length=2 * max_range + sweeps * speed + 20.0)
    points, inten = [], []
    for k in range(sweeps):
        origin = np.array([(k - (sweeps - 1) / 2) * speed, 1.75 + 0.2 * math.sin(0.05 * k), SENSOR_HEIGHT])
        p, i = _sweep(world, origin, beams, columns, max_range, rng)
        # Registration error: the sweep lands rotated and shifted around its sensor.
        yaw = rng.normal(0.0, pose_noise[1])
        rot = np.array([[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]])
        p[:, :2] = (p[:, :2] - origin[:2]) @ rot.T + origin[:2]
        p += rng.normal(0.0, pose_noise[0], 3)
        points.append(p)
        inten.append(i)
    return voxelize_clouds([(np.concatenate(points), np.concatenate(inten))], voxel_size)


# ------------------------------------------------------------------------------------ rooms
ROOM_SURFACE_M2 = 220.0  # a typical surface area of relconv.voxel.synthetic.indoor_room's rooms


def room(voxel_size: float, seed: int = 0, samples_per_voxel: float = 3.0) -> FamilyScene:
    """A furnished room (relconv.voxel.synthetic.indoor_room) sampled densely enough to cover every
    surface voxel, with ~1 cm of scanner noise across the surfaces, as a ScanNet reconstruction."""
    from relconv.voxel import synthetic

    n = int(samples_per_voxel * ROOM_SURFACE_M2 / voxel_size**2)
    points, colour = synthetic.indoor_room(seed=seed, num_points=n)
    noise = np.random.default_rng(seed + 1).normal(0.0, 0.008, points.shape)
    return voxelize_clouds([(points + noise, colour.mean(1))], voxel_size)


# ------------------------------------------------------------------------------------ airborne
def airborne(tile: float, voxel_size: float, seed: int = 0, pulses_per_voxel: float = 3.0) -> FamilyScene:
    """A `tile` x `tile` metre airborne laser tile: pulses fall uniformly from above onto a rolling
    terrain with flat-roofed buildings (a few wall returns from the scan angle) and tree crowns;
    a pulse into a crown returns from its top, often from inside it and sometimes from the ground."""
    rng = np.random.default_rng(seed)
    n = int(pulses_per_voxel * (tile / voxel_size) ** 2)
    waves = rng.uniform(0.005, 0.05, (6, 2)) * rng.choice([-1, 1], (6, 2))
    amps, phases = rng.uniform(0.5, 4.0, 6), rng.uniform(0, 2 * np.pi, 6)

    def terrain(x, y):
        return sum(
            a * np.sin(2 * np.pi * (w[0] * x + w[1] * y) + ph)
            for a, w, ph in zip(amps, waves, phases, strict=True)
        )

    xy = rng.uniform(0, tile, (n, 2))
    z = terrain(xy[:, 0], xy[:, 1])
    value = np.full(n, 0.3)
    n_build = int(tile * tile / 1500) + 1
    lo = rng.uniform(0, tile, (n_build, 2))
    hi = lo + rng.uniform(8, 30, (n_build, 2))
    roof = terrain(lo[:, 0], lo[:, 1]) + rng.uniform(3, 20, n_build)
    for b in range(n_build):
        inside = np.all((xy >= lo[b]) & (xy <= hi[b]), 1)
        z = np.where(inside, roof[b], z)
        value = np.where(inside, 0.6, value)
    # Wall returns: the scan angle (up to ~20 deg off nadir) lets some pulses hit the facades.
    wall_pts = []
    for b in range(n_build):
        perim = 2 * float((hi[b] - lo[b]).sum())
        k = int(0.3 * pulses_per_voxel * perim * (roof[b] - terrain(lo[b, 0], lo[b, 1])) / voxel_size**2)
        t = rng.uniform(0, perim, k)
        w, h = hi[b] - lo[b]
        x = np.where(
            t < w,
            lo[b, 0] + t,
            np.where(t < w + h, hi[b, 0], np.where(t < 2 * w + h, hi[b, 0] - (t - w - h), lo[b, 0])),
        )
        y = np.where(
            t < w,
            lo[b, 1],
            np.where(
                t < w + h, lo[b, 1] + (t - w), np.where(t < 2 * w + h, hi[b, 1], hi[b, 1] - (t - 2 * w - h))
            ),
        )
        base = terrain(x, y)
        inside = (x <= tile) & (y <= tile)  # footprints may reach past the tile's far edges
        wall = np.stack([x, y, base + rng.uniform(0, 1, k) * (roof[b] - base)], 1)
        wall_pts.append(wall[inside])
    # Tree crowns (spheres of radius r around their top minus r) rasterised into a canopy height
    # grid of half-voxel cells: each pulse reads its crown's top and radius from its cell.
    n_tree = int(tile * tile / 80)
    centres = rng.uniform(0, tile, (n_tree, 2))
    radii = rng.uniform(1.5, 5.0, n_tree)
    tops = terrain(centres[:, 0], centres[:, 1]) + rng.uniform(5, 25, n_tree)
    cell = voxel_size / 2
    cells = int(math.ceil(tile / cell)) + 1
    canopy = np.full((cells, cells), -np.inf)
    crown_radius = np.zeros((cells, cells))
    for (cx, cy), r, top in zip(centres, radii, tops, strict=True):
        i0, i1 = max(0, int((cx - r) / cell)), min(cells, int((cx + r) / cell) + 1)
        j0, j1 = max(0, int((cy - r) / cell)), min(cells, int((cy + r) / cell) + 1)
        gx = (np.arange(i0, i1) + 0.5) * cell - cx
        gy = (np.arange(j0, j1) + 0.5) * cell - cy
        r2 = (gx[:, None] ** 2 + gy[None, :] ** 2) / r**2
        crown = np.where(r2 < 1, top - r * (1 - np.sqrt(np.clip(1 - r2, 0, 1))), -np.inf)
        window = canopy[i0:i1, j0:j1]
        higher = crown > window
        canopy[i0:i1, j0:j1] = np.where(higher, crown, window)
        crown_radius[i0:i1, j0:j1] = np.where(higher, r, crown_radius[i0:i1, j0:j1])
    ij = np.minimum((xy / cell).astype(np.int64), cells - 1)
    best_top = canopy[ij[:, 0], ij[:, 1]]
    pulse_radius = crown_radius[ij[:, 0], ij[:, 1]]
    extra_pts, extra_val = [], []
    in_crown = best_top > z
    ground_z = z.copy()
    z = np.where(in_crown, best_top, z)
    value = np.where(in_crown, 0.45, value)
    idx = np.flatnonzero(in_crown)
    inner = idx[rng.random(len(idx)) < 0.6]  # a second return inside the crown
    depth = rng.uniform(0.2, 1.0, len(inner)) * 2 * pulse_radius[inner]
    extra_pts.append(np.stack([xy[inner, 0], xy[inner, 1], np.maximum(z[inner] - depth, ground_z[inner])], 1))
    extra_val.append(np.full(len(inner), 0.4))
    last = idx[rng.random(len(idx)) < 0.35]  # a last return from the ground below
    extra_pts.append(np.stack([xy[last, 0], xy[last, 1], ground_z[last]], 1))
    extra_val.append(np.full(len(last), 0.3))
    walls = np.concatenate(wall_pts) if wall_pts else np.empty((0, 3))
    points = np.concatenate([np.concatenate([xy, z[:, None]], 1), walls, *extra_pts])
    values = np.concatenate([value, np.full(len(walls), 0.55), *extra_val])
    points += rng.normal(0.0, 0.03, points.shape)
    return voxelize_clouds([(points, values + rng.normal(0, 0.02, len(values)))], voxel_size)


# The laspy sdist's real airborne tiles: (member, voxel size in the file's units). Autzen (Oregon) is
# in US survey feet, ~2.4 ft between pulses; the Lambert-93 tile is in metres, its points within ~60 m.
REAL_AIRBORNE = {
    "autzen": ("tests/data/autzen_trim.laz", 2.0),
    "lambert": ("tests/data/append-bug.laz", 0.5),
}


def real_airborne(tile: str, seed: int = 0) -> FamilyScene:
    """A real airborne tile of the laspy==2.7.0 sdist (LAZ: reading it needs `laspy` and `lazrs`;
    `relconv.datasets.DataUnavailable` without them or offline without the cache); the seed is unused."""
    from relconv.datasets import DataUnavailable
    from relconv.datasets.pypi_cache import fetch_member

    member, voxel_size = REAL_AIRBORNE[tile]
    try:
        import laspy
    except ImportError as err:
        raise DataUnavailable(
            "reading LAZ tiles needs laspy and lazrs (pip install --no-deps laspy lazrs)"
        ) from err
    las = laspy.read(fetch_member("laspy", "2.7.0", member, sdist=True))
    points = np.stack([np.asarray(las.x), np.asarray(las.y), np.asarray(las.z)], 1)
    points -= points.min(0)
    inten = np.asarray(las.intensity, np.float64)
    return voxelize_clouds([(points, inten / max(1.0, float(inten.max())))], voxel_size)


# ------------------------------------------------------------------------------------ objects
def _rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    return q * np.sign(np.diag(r))


def _sphere_points(rng, n, centre, radius):
    v = rng.normal(size=(n, 3))
    return centre + radius * v / np.linalg.norm(v, axis=1, keepdims=True)


def _shape(kind: str, rng: np.random.Generator, density: float) -> np.ndarray:
    """Points on a closed surface inside the unit ball, `density` points per unit area."""
    if kind == "sphere":
        return _sphere_points(rng, int(density * 4 * np.pi * 0.9**2), np.zeros(3), 0.9)
    if kind == "torus":
        big, small = 0.65, 0.25
        n = int(density * 4 * np.pi**2 * big * small * (1 + small / big))
        u, v = rng.uniform(0, 2 * np.pi, (2, n))
        # Area element (big + small cos v): keep v with that probability for a uniform surface.
        keep = rng.random(n) < (big + small * np.cos(v)) / (big + small)
        u, v = u[keep], v[keep]
        ring = big + small * np.cos(v)
        return np.stack([ring * np.cos(u), ring * np.sin(u), small * np.sin(v)], 1)
    if kind == "box":
        half = np.array([0.7, 0.45, 0.3])
        faces = [(axis, side) for axis in range(3) for side in (-1, 1)]
        pts = []
        for axis, side in faces:
            area = 4 * np.prod(np.delete(half, axis))
            p = rng.uniform(-half, half, (int(density * area), 3))
            p[:, axis] = side * half[axis]
            pts.append(p)
        return np.concatenate(pts)
    if kind == "blob":
        # The surface of a union of spheres: each sphere's points outside every other sphere.
        k = rng.integers(5, 9)
        radii = rng.uniform(0.2, 0.45, k)
        centres = rng.normal(size=(k, 3))
        centres *= ((0.95 - radii) * rng.uniform(0.3, 1.0, k) / np.linalg.norm(centres, axis=1))[:, None]
        pts = []
        for i in range(k):
            p = _sphere_points(rng, int(density * 4 * np.pi * radii[i] ** 2), centres[i], radii[i])
            outside = np.ones(len(p), bool)
            for j in range(k):
                if j != i:
                    outside &= ((p - centres[j]) ** 2).sum(1) > radii[j] ** 2
            pts.append(p[outside])
        return np.concatenate(pts)
    raise ValueError(f"unknown shape {kind!r}")


OBJECT_SHAPES = ("sphere", "torus", "box", "blob")


def objects(resolution: int, seed: int = 0, samples_per_voxel: float = 3.0) -> FamilyScene:
    """A batch of the four OBJECT_SHAPES, each randomly rotated and scaled to a `resolution`^3 grid
    (voxel size 2 / resolution in the shape's unit-ball frame), one shape per batch entry."""
    rng = np.random.default_rng(seed)
    voxel = 2.0 / resolution
    density = samples_per_voxel / voxel**2
    clouds = []
    for kind in OBJECT_SHAPES:
        p = _shape(kind, rng, density) @ _rotation(rng).T
        clouds.append((p, 0.5 + 0.5 * p[:, 2]))
    return voxelize_clouds(clouds, voxel)


# ------------------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class SceneSpec:
    """One size of a family: `spec(seed)` generates it; `expected` is its voxel-count range at any
    seed; `real` sizes read real data (the network or a cache) instead of generating it."""

    make: Callable[..., FamilyScene]
    expected: tuple[int, int]
    real: bool = False

    def __call__(self, seed: int = 0) -> FamilyScene:
        return self.make(seed=seed)


FAMILIES: dict[str, dict[str, SceneSpec]] = {
    "scan": {
        f"scan-{b}beam": SceneSpec(partial(lidar_batch, b, 1), rng_)
        for b, rng_ in ((32, (10_000, 40_000)), (64, (50_000, 110_000)), (128, (90_000, 200_000)))
    },
    "real-scan": {
        "real-scan": SceneSpec(partial(real_scans, ("source",)), (20_000, 40_000), real=True),
        "real-scan-b2": SceneSpec(partial(real_scans, ("source", "target")), (40_000, 80_000), real=True),
    },
    "batch": {
        "batch2-64beam": SceneSpec(partial(lidar_batch, 64, 2), (100_000, 220_000)),
        "batch4-64beam": SceneSpec(partial(lidar_batch, 64, 4), (200_000, 440_000)),
        "batch8-64beam": SceneSpec(partial(lidar_batch, 64, 8), (400_000, 880_000)),
        "batch8-32beam": SceneSpec(partial(lidar_batch, 32, 8), (80_000, 320_000)),
    },
    "aggregate": {
        "aggregate-0.5m": SceneSpec(partial(aggregate, 8), (350_000, 700_000)),
        "aggregate-1m": SceneSpec(partial(aggregate, 26), (750_000, 1_300_000)),
        "aggregate-2m": SceneSpec(partial(aggregate, 32, voxel_size=0.03), (1_500_000, 2_600_000)),
        "aggregate-4m": SceneSpec(partial(aggregate, 40, beams=128, voxel_size=0.03), (3_000_000, 5_000_000)),
        "aggregate-10m": SceneSpec(
            partial(aggregate, 70, beams=128, voxel_size=0.02), (8_000_000, 13_000_000)
        ),
    },
    "room": {
        f"room-{cm}cm": SceneSpec(partial(room, cm / 100), rng_)
        for cm, rng_ in (
            (5, (60_000, 140_000)),
            (4, (100_000, 220_000)),
            (3, (170_000, 400_000)),
            (2, (380_000, 900_000)),
        )
    },
    "airborne": {
        "airborne-100m-25cm": SceneSpec(partial(airborne, 100.0, 0.25), (300_000, 550_000)),
        "airborne-200m-25cm": SceneSpec(partial(airborne, 200.0, 0.25), (1_200_000, 2_200_000)),
        "airborne-400m-50cm": SceneSpec(partial(airborne, 400.0, 0.5), (1_000_000, 2_200_000)),
        "airborne-real-autzen": SceneSpec(partial(real_airborne, "autzen"), (60_000, 110_000), real=True),
        "airborne-real-lambert": SceneSpec(partial(real_airborne, "lambert"), (5_000, 12_000), real=True),
    },
    "object": {
        f"object-{r}": SceneSpec(partial(objects, r), rng_)
        for r, rng_ in (
            (64, (15_000, 60_000)),
            (128, (60_000, 240_000)),
            (256, (250_000, 950_000)),
            (512, (1_000_000, 3_800_000)),
        )
    },
}


def scene_names() -> list[str]:
    return [name for sizes in FAMILIES.values() for name in sizes]


def family_of(scene: str) -> str:
    """The family of a scene name, including the voxel suite's fixed workloads (scan64, indoor, ...)."""
    for family, sizes in FAMILIES.items():
        if scene in sizes:
            return family
    legacy = {
        "scan32": "scan",
        "scan64": "scan",
        "scan128": "scan",
        "scan64x3": "aggregate",
        "scan128x8": "aggregate",
        "indoor": "room",
        "kitti-real": "real-scan",
    }
    if scene in legacy:
        return legacy[scene]
    if scene.endswith("b2") and scene[:-2] in legacy:
        return "batch"
    return "other"


def make_scene(name: str, seed: int = 0) -> FamilyScene:
    for sizes in FAMILIES.values():
        if name in sizes:
            return sizes[name](seed)
    raise ValueError(f"unknown family scene {name!r}; known: {', '.join(scene_names())}")


# ------------------------------------------------------------------------------------ CLI
def load_stats() -> dict:
    return json.loads(STATS_PATH.read_text()) if STATS_PATH.exists() else {}


def measure(name: str, seed: int = 0) -> dict:
    """`scene_stats` of a scene and the time to generate it: wall-clock and this process's CPU time
    (one core with OMP_NUM_THREADS=1; unlike wall time, not inflated by other processes)."""
    wall, cpu = time.perf_counter(), time.process_time()
    scene = make_scene(name, seed)
    generated = (time.perf_counter() - wall, time.process_time() - cpu)
    wall, cpu = time.perf_counter(), time.process_time()
    stats = scene_stats(scene)
    return dict(
        family=family_of(name),
        seed=seed,
        **stats,
        generate_s=round(generated[0], 2),
        generate_cpu_s=round(generated[1], 2),
        stats_cpu_s=round(time.process_time() - cpu, 2),
    )


def remeasure(
    entries: dict,
    patterns: str,
    measure_one: Callable[[str], dict],
    path: Path,
    describe: Callable[[str, dict], str],
) -> dict:
    """`entries` with every scene matching `patterns` (fnmatch, comma-separated) measured anew by
    `measure_one`, in scene order, rewritten to `path` after each scene (so a cut-off run keeps what
    it finished); a scene that cannot be made (real data offline) keeps its old entry, and says why."""
    wanted = [s.strip() for s in patterns.split(",") if s.strip()]
    order = {n: i for i, n in enumerate(scene_names())}
    for name in scene_names():
        if not any(fnmatch.fnmatchcase(name, pat) for pat in wanted):
            continue
        try:
            entries[name] = measure_one(name)
        except Exception as err:
            print(f"{name}: skipped ({type(err).__name__}: {err})", file=sys.stderr)
            continue
        print(f"{name}: {describe(name, entries[name])}", file=sys.stderr)
        entries = dict(sorted(entries.items(), key=lambda kv: order.get(kv[0], len(order))))
        path.write_text(json.dumps(entries, indent=1) + "\n")
    return entries


def table(stats: dict) -> str:
    head = (
        f"{'family':<10} {'scene':<20} {'voxels':>11} {'batch':>5} {'voxel':>6} {'extent (m)':>22} "
        f"{'nb 3^3':>7} {'p10/50/90':>9} {'density':>7} {'down2':>6} {'gen cpu s':>9}"
    )
    lines = [
        "nb 3^3: mean occupied voxels in a voxel's 3^3 window, itself included (p10/50/90: percentiles); "
        "density: nb 3^3 / 27; "
        "down2: voxels per output of a 2^3 stride-2 downsampling; gen cpu s: generation CPU time (one core)",
        head,
        "-" * len(head),
    ]
    for family, sizes in FAMILIES.items():
        for name in sizes:
            s = stats.get(name)
            if s is None:
                lines.append(f"{family:<10} {name:<20} {'(not measured)':>11}")
                continue
            extent = " x ".join(f"{e:g}" for e in s["extent_m"])
            pct = "/".join(str(v) for v in s["neighbours_p10_p50_p90"])
            lines.append(
                f"{family:<10} {name:<20} {s['voxels']:>11,} {s['batch_size']:>5} {s['voxel_size_m']:>6.3g} "
                f"{extent:>22} {s['mean_neighbours_3x3x3']:>7.2f} {pct:>9} {s['table_density']:>7.3f} "
                f"{s['down2_reduction']:>6.2f} {s['generate_cpu_s']:>9.1f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.workloads.families", description=__doc__)
    p.add_argument("--list", action="store_true", help="print every family and size with its cached stats")
    p.add_argument(
        "--update",
        nargs="?",
        const="*",
        metavar="PATTERN",
        help="regenerate the scenes matching PATTERN (fnmatch, comma-separated; default every one) "
        "and rewrite their entries in family_stats.json",
    )
    args = p.parse_args(argv)
    if not args.list and args.update is None:
        p.error("nothing to do: pass --list and/or --update")
    stats = load_stats()
    if args.update is not None:
        stats = remeasure(
            stats,
            args.update,
            measure,
            STATS_PATH,
            lambda name, s: f"{s['voxels']:,} voxels, {s['generate_cpu_s']} s CPU",
        )
    if args.list:
        print(table(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
