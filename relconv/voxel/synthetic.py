"""Synthetic scans for tests, demos and benchmarks: a rotating-LiDAR street and an indoor room.

`raycast_scan` casts the rays of a rotating multi-beam LiDAR (HDL-64E-like vertical field of view
+2 .. -24.8 deg, 1800 azimuth steps) against a street scene: ground plane, building facades with
gaps, parked cars (boxes) and poles (vertical cylinders). A 64-beam scan voxelised at 0.05 m gives
~70k voxels, the size of a SemanticKITTI scan. Everything is vectorised numpy and deterministic for a
seed. The API (names, arguments, return types) is stable: benchmarks import it.
"""

from __future__ import annotations

import numpy as np

SENSOR_HEIGHT = 1.73  # metres above the ground, as on the KITTI car
MAX_RANGE = 100.0


def _street_boxes(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """[B, 6] axis-aligned boxes (x0, y0, z0, x1, y1, z1) and [B] reflectivity."""
    boxes, refl = [], []
    ground = -SENSOR_HEIGHT
    for side in (-1.0, 1.0):
        x = -90.0
        while x < 90.0:
            length = rng.uniform(8.0, 25.0)
            if rng.random() < 0.8:  # building; otherwise a gap (side street, parking lot)
                setback = rng.uniform(9.0, 13.0)
                depth, height = rng.uniform(8.0, 15.0), rng.uniform(6.0, 20.0)
                y0, y1 = sorted((side * setback, side * (setback + depth)))
                boxes.append((x, y0, ground, x + length, y1, ground + height))
                refl.append(rng.uniform(0.2, 0.5))
            x += length + rng.uniform(0.0, 3.0)
        x = -60.0
        while x < 60.0:  # parked cars along the kerb
            if rng.random() < 0.6:
                y = side * rng.uniform(4.8, 6.0)
                boxes.append((x, y - 0.9, ground + 0.2, x + 4.5, y + 0.9, ground + 1.5))
                refl.append(rng.uniform(0.3, 0.9))
            x += rng.uniform(5.5, 9.0)
    for _ in range(6):  # moving cars on the road
        x, y = rng.uniform(-40.0, 40.0), rng.uniform(-3.0, 3.0)
        if abs(x) < 4.0:
            continue
        boxes.append((x, y - 0.9, ground + 0.2, x + 4.5, y + 0.9, ground + 1.5))
        refl.append(rng.uniform(0.3, 0.9))
    return np.asarray(boxes, dtype=np.float64), np.asarray(refl, dtype=np.float64)


def _poles(rng: np.random.Generator) -> np.ndarray:
    """[P, 4] vertical cylinders (cx, cy, radius, height)."""
    xs = np.arange(-70.0, 70.0, 12.0) + rng.uniform(-2.0, 2.0, size=12)
    poles = [
        (x, side * rng.uniform(7.0, 8.0), rng.uniform(0.08, 0.18), rng.uniform(4.0, 8.0))
        for x in xs
        for side in (-1.0, 1.0)
    ]
    return np.asarray(poles, dtype=np.float64)


def _ray_boxes(d: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest positive hit distance [M] and box id [M] (-1 = none) of unit rays from the origin."""
    t_best = np.full(d.shape[0], np.inf)
    idx = np.full(d.shape[0], -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / d
        for b, box in enumerate(boxes):
            t1 = box[:3] * inv
            t2 = box[3:] * inv
            t_near = np.minimum(t1, t2).max(1)
            t_far = np.maximum(t1, t2).min(1)
            hit = (t_far >= t_near) & (t_near > 0.0) & (t_near < t_best)
            t_best = np.where(hit, t_near, t_best)
            idx = np.where(hit, b, idx)
    return t_best, idx


def _ray_poles(d: np.ndarray, poles: np.ndarray, ground: float) -> np.ndarray:
    """Nearest hit distance [M] of unit rays from the origin against vertical cylinders."""
    t_best = np.full(d.shape[0], np.inf)
    a = d[:, 0] ** 2 + d[:, 1] ** 2
    for cx, cy, r, h in poles:
        b = -2.0 * (d[:, 0] * cx + d[:, 1] * cy)
        c = cx * cx + cy * cy - r * r
        disc = b * b - 4.0 * a * c
        ok = disc >= 0.0
        t = np.where(ok, (-b - np.sqrt(np.where(ok, disc, 0.0))) / (2.0 * a + 1e-12), np.inf)
        z = t * d[:, 2]
        hit = ok & (t > 0.0) & (z >= ground) & (z <= ground + h)
        t_best = np.where(hit & (t < t_best), t, t_best)
    return t_best


def raycast_scan(
    beams: int = 64,
    seed: int = 0,
    azimuth_steps: int = 1800,
    fov_up: float = 2.0,
    fov_down: float = -24.8,
    range_noise: float = 0.01,
) -> tuple[np.ndarray, np.ndarray]:
    """One rotating-LiDAR sweep of a synthetic street, in the sensor frame (z up, ground at -1.73 m).

    Args:
        beams: laser rows, spread evenly over [fov_down, fov_up] degrees of elevation.
        seed: scene layout and noise seed (deterministic).
        azimuth_steps: columns per revolution.
        range_noise: std-dev of the range noise in metres.
    Returns:
        points [N, 3] float32 (metres) and intensity [N] float32 in [0, 1]; rays that hit nothing
        within 100 m are dropped.
    """
    if beams < 1 or azimuth_steps < 1:
        raise ValueError(f"beams and azimuth_steps must be positive, got {beams}, {azimuth_steps}")
    rng = np.random.default_rng(seed)
    boxes, refl = _street_boxes(rng)
    poles = _poles(rng)
    elev = np.deg2rad(np.linspace(fov_up, fov_down, beams))
    azim = np.linspace(-np.pi, np.pi, azimuth_steps, endpoint=False)
    el, az = np.meshgrid(elev, azim, indexing="ij")
    d = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1).reshape(-1, 3)
    ground = -SENSOR_HEIGHT
    with np.errstate(divide="ignore"):
        t_ground = np.where(d[:, 2] < 0.0, ground / d[:, 2], np.inf)
    t_box, box_id = _ray_boxes(d, boxes)
    t_pole = _ray_poles(d, poles, ground)
    t = np.minimum(np.minimum(t_ground, t_box), t_pole)
    keep = t < MAX_RANGE
    d, t = d[keep], t[keep]
    reflect = np.where(
        t_box[keep] == t, refl[np.maximum(box_id[keep], 0)], np.where(t_pole[keep] == t, 0.6, 0.15)
    )
    t = t + rng.normal(0.0, range_noise, size=t.shape)
    points = d * t[:, None]
    intensity = reflect * np.exp(-t / 60.0) + rng.normal(0.0, 0.02, size=t.shape)
    return points.astype(np.float32), np.clip(intensity, 0.0, 1.0).astype(np.float32)


def indoor_room(seed: int = 0, num_points: int = 300_000) -> tuple[np.ndarray, np.ndarray]:
    """Points sampled uniformly on the surfaces of a furnished room (about 8 x 6 x 3 m).

    Floor, ceiling, four walls and 6-12 furniture boxes (tables, cabinets, beds), each surface with its
    own colour. Meant for voxelisation at 0.02 m.
    Returns:
        points [num_points, 3] float32 (metres, floor at z = 0) and colours [num_points, 3] float32 in [0, 1].
    """
    rng = np.random.default_rng(seed)
    size = np.array([rng.uniform(6.0, 9.0), rng.uniform(5.0, 7.0), rng.uniform(2.6, 3.2)])
    boxes = [np.concatenate([[0.0, 0.0, 0.0], size])]
    for _ in range(rng.integers(6, 13)):
        ext = rng.uniform([0.4, 0.4, 0.4], [2.0, 1.5, 2.0])
        lo = rng.uniform([0.0, 0.0], size[:2] - ext[:2])
        boxes.append(np.array([lo[0], lo[1], 0.0, lo[0] + ext[0], lo[1] + ext[1], ext[2]]))
    # Six faces per box: axis, side; area decides how many points each face receives.
    faces, areas = [], []
    for box in boxes:
        ext = box[3:] - box[:3]
        for axis in range(3):
            for side in (0, 1):
                faces.append((box, axis, side))
                areas.append(np.prod(np.delete(ext, axis)))
    areas = np.asarray(areas)
    counts = rng.multinomial(num_points, areas / areas.sum())
    colours = rng.uniform(0.1, 0.9, size=(len(faces), 3))
    pts, cols = [], []
    for (box, axis, side), n, colour in zip(faces, counts, colours, strict=True):
        p = rng.uniform(box[:3], box[3:], size=(n, 3))
        p[:, axis] = box[axis + 3 * side]
        pts.append(p)
        cols.append(np.clip(colour + rng.normal(0.0, 0.03, size=(n, 3)), 0.0, 1.0))
    return np.concatenate(pts).astype(np.float32), np.concatenate(cols).astype(np.float32)
