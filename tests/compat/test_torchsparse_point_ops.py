"""TorchSparse's point-voxel ops (sphash, sphashquery, spcount, spvoxelize, calc_ti_weights,
spdevoxelize) against plain Python loops written from TorchSparse 2.1's CPU kernels."""

from __future__ import annotations

import pytest
import torch

import relconv.torchsparse.nn.functional as tsF
from tests.conftest import DEVICES


def _fnv_reference(row) -> int:
    """TorchSparse 2.1's CUDA hash_kernel: FNV-1a 64 over the four columns, read as int64."""
    h = 14695981039346656037
    for v in row:
        h ^= v & 0xFFFFFFFF
        h = (h * 1099511628211) % (1 << 64)
    return h - (1 << 64) if h >= 1 << 63 else h


@pytest.mark.parametrize("device", DEVICES)
def test_sphash_is_torchsparse_hash(device):
    coords = torch.tensor([[0, 1, 2, 3], [1, -4, 70000, 5], [0, 0, 0, 0]], dtype=torch.int32, device=device)
    assert tsF.sphash(coords).tolist() == [_fnv_reference(r) for r in coords.tolist()]
    offsets = torch.tensor([[0, 0, 0], [1, -1, 2]], dtype=torch.int32)
    got = tsF.sphash(coords, offsets)
    assert got.shape == (2, 3)
    for k, off in enumerate(offsets.tolist()):
        # TorchSparse 2.1's CUDA kernel_hash_kernel adds the offsets to (x, y, z)
        want = [_fnv_reference([r[0], r[1] + off[0], r[2] + off[1], r[3] + off[2]]) for r in coords.tolist()]
        assert got[k].tolist() == want
    with pytest.raises(ValueError, match="int32"):
        tsF.sphash(coords.long())
    with pytest.raises(ValueError, match="offsets"):
        tsF.sphash(coords, offsets.long())


@pytest.mark.parametrize("device", DEVICES)
def test_hashquery_count_voxelize(device):
    g = torch.Generator().manual_seed(0)
    points = torch.randint(0, 4, (50, 4), generator=g, dtype=torch.int32).to(device)
    voxels = torch.unique(points, dim=0)
    idx = tsF.sphashquery(tsF.sphash(points), tsF.sphash(voxels))
    assert torch.equal(voxels[idx], points)
    miss = tsF.sphashquery(tsF.sphash(points + 10), tsF.sphash(voxels))
    assert bool((miss == -1).all())
    counts = tsF.spcount(idx.int(), len(voxels))
    assert counts.dtype == torch.int32 and counts.tolist() == [
        int((idx == v).sum()) for v in range(len(voxels))
    ]
    feats = torch.randn(50, 3, generator=g).to(device).requires_grad_(True)
    out = tsF.spvoxelize(feats, idx.int(), counts)
    want = torch.stack([feats[idx == v].mean(0) for v in range(len(voxels))])
    torch.testing.assert_close(out, want)
    g_out = torch.randn_like(out)
    (grad,) = torch.autograd.grad((out * g_out).sum(), feats)
    torch.testing.assert_close(grad, g_out[idx] / counts[idx].float()[:, None])


def test_trilinear_weights_and_devoxelize():
    pts = torch.tensor([[0.25, 0.5, 0.75], [1.5, 1.5, 1.5]])
    idx = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [0, -1, -1, -1, -1, -1, -1, 1]], dtype=torch.int32)
    w = tsF.calc_ti_weights(pts, idx)
    x, y, z = 0.25, 0.5, 0.75
    corners = [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]
    want0 = [(x if a else 1 - x) * (y if b else 1 - y) * (z if c else 1 - z) for a, b, c in corners]
    torch.testing.assert_close(w[0], torch.tensor(want0))
    torch.testing.assert_close(w[1], torch.tensor([0.5, 0, 0, 0, 0, 0, 0, 0.5]), atol=1e-6, rtol=0)
    feats = torch.randn(8, 2, requires_grad=True)
    out = tsF.spdevoxelize(feats, idx, w)
    want = torch.stack(
        [
            (w[n, :, None] * torch.where(idx[n, :, None] >= 0, feats[idx[n].clamp(min=0)], 0)).sum(0)
            for n in range(2)
        ]
    )
    torch.testing.assert_close(out, want)
    out.sum().backward()
    assert feats.grad is not None
