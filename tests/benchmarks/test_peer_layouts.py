"""Weight-layout conversions of the voxel peers: where each relconv kernel offset lands."""

from __future__ import annotations

import itertools

import pytest
import torch

from benchmarks.peers.layouts import to_spconv, to_torchsparse


def _relconv_index(d: tuple[int, int, int], k: int) -> int:
    """relconv's flat offset index: x slowest, z fastest; odd sizes centred, even 0 .. k-1."""
    lo = (k - 1) // 2 if k % 2 else 0
    x, y, z = (v + lo for v in d)
    return (x * k + y) * k + z


def _offsets(k: int):
    lo = (k - 1) // 2 if k % 2 else 0
    return itertools.product(range(-lo, k - lo), repeat=3)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_torchsparse_offset_order(k):
    """TorchSparse++ 2.1 flattens odd volumes x fastest (z slowest), even volumes x slowest."""
    w = torch.arange(k**3, dtype=torch.float64).reshape(k**3, 1, 1)  # w[r] = r
    ts = to_torchsparse(w, (k, k, k))
    lo = (k - 1) // 2 if k % 2 else 0
    for d in _offsets(k):
        ix, iy, iz = (v + lo for v in d)
        t = (iz * k + iy) * k + ix if k % 2 else (ix * k + iy) * k + iz
        assert int(ts[t, 0, 0]) == _relconv_index(d, k), (d, t)


def test_torchsparse_pointwise_is_a_matrix():
    w = torch.randn(1, 3, 5)
    assert torch.equal(to_torchsparse(w, (1, 1, 1)), w[0])


@pytest.mark.parametrize("k", [2, 3])
def test_spconv_layout(k):
    """spconv: [C_out, kx, ky, kz, C_in] with the kernel index = offset + (k - 1) // 2 per axis."""
    w = torch.randn(k**3, 3, 4)
    sp = to_spconv(w, (k, k, k))
    lo = (k - 1) // 2 if k % 2 else 0
    for d in _offsets(k):
        ix, iy, iz = (v + lo for v in d)
        torch.testing.assert_close(sp[:, ix, iy, iz, :], w[_relconv_index(d, k)].T)
