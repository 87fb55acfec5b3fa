"""Real outdoor LiDAR scans from the PyPI sdist `small-gicp==1.0.1` (data/source.ply, data/target.ply:
binary PLY with float x/y/z/intensity, ~70k points each), read with a minimal PLY parser."""

from __future__ import annotations

import numpy as np

from relconv.datasets.pypi_cache import cache_dir, fetch_member

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


def small_gicp_scan(name: str = "source") -> tuple[np.ndarray, np.ndarray | None]:
    """(points [N, 3] float32, intensity [N] float32 or None) of small-gicp's `data/{name}.ply`.

    Raises `relconv.datasets.DataUnavailable` when the sdist is neither cached nor downloadable.
    """
    if name not in ("source", "target"):
        raise ValueError(f"name must be 'source' or 'target', got {name!r}")
    props = read_ply(fetch_member("small-gicp", "1.0.1", f"data/{name}.ply", sdist=True))
    points = np.stack([props["x"], props["y"], props["z"]], 1).astype(np.float32)
    inten = next((props[k] for k in props if "intensity" in k), None)
    return points, None if inten is None else inten.astype(np.float32)


LASPY_VERSION = "2.7.0"
# Labelled airborne tiles that laspy's sdist ships as test data (ASPRS point classes).
LASPY_TILES = ("append-bug.laz", "autzen_trim.laz")


def laspy_tile(name: str) -> dict[str, np.ndarray]:
    """Points of a labelled airborne LiDAR tile from the `laspy==2.7.0` sdist (`tests/data/{name}`).

    Returns {"xyz": [N, 3] float64 metres in the file's CRS, "intensity": [N] float32,
    "classification": [N] uint8 ASPRS class, "return_number", "number_of_returns": [N] uint8}.
    The decoded fields are cached beside the archive (`laspy-2.7.0/decoded/{name}.npz` in the
    cache), so a machine given that cache reads them without laspy; decoding LAZ needs `laspy` and
    `lazrs` (`pip install relconv[examples]`). Raises `relconv.datasets.DataUnavailable` when the
    tile is not decoded in the cache and the sdist is neither cached nor downloadable.
    """
    if name not in LASPY_TILES:
        raise ValueError(f"name must be one of {LASPY_TILES}, got {name!r}")
    decoded = cache_dir() / f"laspy-{LASPY_VERSION}" / "decoded" / f"{name}.npz"
    if decoded.exists():
        with np.load(decoded) as data:
            return {k: data[k] for k in data.files}
    try:
        import laspy
    except ImportError as err:
        raise ImportError("decoding LAZ tiles needs laspy and lazrs: pip install laspy lazrs") from err
    las = laspy.read(fetch_member("laspy", LASPY_VERSION, f"tests/data/{name}", sdist=True))
    fields = {
        "xyz": np.stack([np.asarray(las.x), np.asarray(las.y), np.asarray(las.z)], 1).astype(np.float64),
        "intensity": np.asarray(las.intensity).astype(np.float32),
        "classification": np.asarray(las.classification).astype(np.uint8),
        "return_number": np.asarray(las.return_number).astype(np.uint8),
        "number_of_returns": np.asarray(las.number_of_returns).astype(np.uint8),
    }
    decoded.parent.mkdir(parents=True, exist_ok=True)
    tmp = decoded.with_name(decoded.stem + ".part.npz")
    np.savez(tmp, **fields)
    tmp.replace(decoded)
    return fields
