"""voxelize / devoxelize / collate against a NumPy reference; VoxelTensor conversions."""

import warnings

import numpy as np
import pytest
import torch
from voxel_refs import random_voxels

from relconv.voxel import VoxelTensor, cat, collate, devoxelize, voxelize
from relconv.voxel.synthetic import indoor_room, raycast_scan


def numpy_voxelize(points, feats, batch, size, reduce):
    grid = np.floor(points.astype(np.float64) / size).astype(np.int64)
    coords = np.concatenate([batch[:, None], grid], 1)
    uniq, inverse = np.unique(coords, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    out = np.zeros((len(uniq), feats.shape[1]))
    for v in range(len(uniq)):
        rows = feats[inverse == v]
        out[v] = {"mean": rows.mean(0), "sum": rows.sum(0), "max": rows.max(0)}[reduce]
    return uniq, out, inverse


@pytest.mark.parametrize("reduce", ["mean", "sum", "max"])
def test_voxelize_matches_numpy(reduce):
    rng = np.random.default_rng(0)
    points = rng.normal(0, 1.5, size=(600, 3))
    feats = rng.normal(size=(600, 2))
    batch = rng.integers(0, 3, size=600)
    v = voxelize(torch.from_numpy(points), 0.5, torch.from_numpy(batch), reduce, torch.from_numpy(feats))
    coords, out, inverse = numpy_voxelize(points, feats, batch, 0.5, reduce)
    assert v.tensor.coords.dtype == torch.int32
    np.testing.assert_array_equal(v.tensor.coords.numpy(), coords)
    np.testing.assert_allclose(v.tensor.feats.numpy(), out)
    np.testing.assert_array_equal(v.point_to_voxel.numpy(), inverse)
    back = devoxelize(v.tensor, v.point_to_voxel)
    np.testing.assert_allclose(back.numpy(), out[inverse])


def test_voxelize_anisotropic_and_default_feats():
    pts = torch.tensor([[0.1, 0.1, 0.1], [0.2, 0.9, 0.1], [-0.1, 0.0, 0.0]], dtype=torch.float64)
    v = voxelize(pts, (1.0, 0.5, 1.0))
    assert v.tensor.coords.tolist() == [[0, -1, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0]]
    torch.testing.assert_close(v.tensor.feats[v.point_to_voxel[0]], pts[0])


def test_collate_and_cat():
    a, b = random_voxels(20, 4, 3, seed=1), random_voxels(30, 4, 3, seed=2)
    batch = collate([a, b])
    assert batch.coords[:, 0].tolist() == [0] * len(a) + [1] * len(b)
    both = cat([a, a.replace_feature(a.feats * 2)])
    assert both.feats.shape == (len(a), 6)
    with pytest.raises(ValueError, match="tensors\\[1\\]"):
        cat([a, b])
    torch.testing.assert_close((a + a).feats, 2 * a.feats)


def test_dense_roundtrip_and_to():
    x = random_voxels(40, 5, 3, batch=2, stride=2)
    d = x.dense()
    assert d.shape[:2] == (2, 3)
    y = VoxelTensor.from_dense(d, stride=2)
    assert torch.equal(y.coords, x.coords) and torch.equal(y.feats, x.feats)
    assert x.to(torch.float32).cache is x.cache
    assert x.to(torch.float32).feats.dtype == torch.float32


def test_coalesce_merges_duplicates():
    coords = torch.tensor([[0, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 1]], dtype=torch.int32)
    x = VoxelTensor(torch.tensor([[1.0], [2.0], [3.0]]), coords).coalesce("sum")
    assert x.coords.tolist() == [[0, 0, 0, 0], [0, 1, 1, 1]] and x.feats.flatten().tolist() == [2.0, 4.0]


def test_synthetic_scans_are_deterministic():
    p1, i1 = raycast_scan(beams=16, azimuth_steps=256, seed=3)
    p2, i2 = raycast_scan(beams=16, azimuth_steps=256, seed=3)
    assert p1.dtype == np.float32 and p1.shape[1] == 3 and i1.shape == (p1.shape[0],)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(i1, i2)
    assert 0.0 <= i1.min() and i1.max() <= 1.0
    pts, col = indoor_room(seed=1, num_points=2000)
    assert pts.shape == (2000, 3) and col.shape == (2000, 3)


@pytest.mark.cuda
def test_cuda_collate_reads_nothing_back_and_voxelize_reads_its_checks_once():
    """collate fills host-known row ranges; voxelize reads its finiteness, range and bound checks
    in one read, the rest being torch.unique's own sizing."""
    from tests.conftest import no_host_sync

    points = torch.rand(2000, 3, device="cuda") * 20.0
    first = voxelize(points, 0.5).tensor
    second = voxelize(points + 7.0, (0.5, 0.5, 1.0)).tensor
    with no_host_sync():
        batch = collate([first, second])
    assert torch.equal(
        batch.coords[: len(first), 0], torch.zeros(len(first), dtype=batch.coords.dtype, device="cuda")
    )
    assert bool((batch.coords[len(first) :, 0] == 1).all())
    keys = torch.randint(0, 9, (2000,), device="cuda")
    unique_reads = _sync_count(lambda: torch.unique(keys, sorted=True, return_inverse=True))
    assert _sync_count(lambda: voxelize(points, 0.5)) == unique_reads + 1


def _sync_count(fn) -> int:
    """Host synchronisations that torch's sync debug mode reports during fn()."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("called a synchronizing" in str(w.message) for w in caught)
