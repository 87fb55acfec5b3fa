"""Hypothesis property tests: random scenes and conv geometries against dense conv3d and brute force."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from voxel_refs import as_triples, brute_force, dense_conv, random_voxels

from relconv.voxel import conv3d, submanifold_map

kernels = st.tuples(*[st.integers(1, 4)] * 3)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 60),
    kernel=kernels,
    stride=st.tuples(*[st.integers(1, 3)] * 3),
    dilation=st.integers(1, 2),
    batch=st.integers(1, 2),
    seed=st.integers(0, 10_000),
)
def test_random_conv_matches_dense(n, kernel, stride, dilation, batch, seed):
    x = random_voxels(n, 5, 2, batch=batch, seed=seed)
    w = torch.randn(kernel[0] * kernel[1] * kernel[2], 2, 3, dtype=torch.float64)
    y = conv3d(x, w, kernel, stride, dilation)
    ref = dense_conv(x, w, y.coords, 5, batch, kernel, stride, (dilation,) * 3, 1)
    torch.testing.assert_close(y.feats, ref)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 40), kernel=kernels, shift=st.integers(-50, 50), seed=st.integers(0, 10_000))
def test_random_submanifold_map_matches_brute_force(n, kernel, shift, seed):
    x = random_voxels(max(n, 1), 4, 1, batch=2, seed=seed)
    coords = x.coords[:n] + torch.tensor([0, shift, -shift, shift], dtype=torch.int32)
    rmap = submanifold_map(coords, kernel, (1, 1, 1), (1, 1, 1))
    assert as_triples(rmap) == brute_force(coords, coords, kernel, (1, 1, 1))
