"""Hypothesis property tests: random shapes and maps against the reference."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relconv import relational_conv
from relconv.ops.reference import relational_conv_reference
from tests.ops.maps import random_map, rel_error


@settings(max_examples=40, deadline=None)
@given(
    num_in=st.integers(1, 40),
    num_out=st.integers(1, 40),
    num_relations=st.integers(1, 12),
    num_pairs=st.integers(0, 300),
    groups=st.sampled_from([1, 2, 3]),
    cin_g=st.integers(1, 6),
    cout_g=st.integers(1, 6),
    with_scale=st.booleans(),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_match_reference(
    num_in, num_out, num_relations, num_pairs, groups, cin_g, cout_g, with_scale, index_dtype, seed
):
    rmap = random_map(num_in, num_out, num_relations, num_pairs, "cpu", index_dtype, with_scale, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_in, groups * cin_g, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(
        num_relations, groups, cin_g, cout_g, generator=g, dtype=torch.float64, requires_grad=True
    )
    out = relational_conv(x, w, rmap, groups=groups)
    ref = relational_conv_reference(x, w, rmap, groups=groups)
    assert rel_error(out, ref) < 1e-12
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    # With no pairs the reference is a constant, so its gradients are zeros.
    if ref.requires_grad:
        ref_grads = torch.autograd.grad(ref, (x, w), grad, allow_unused=True, materialize_grads=True)
    else:
        ref_grads = (torch.zeros_like(x), torch.zeros_like(w))
    for a, b in zip(torch.autograd.grad(out, (x, w), grad), ref_grads, strict=True):
        assert rel_error(a, b) < 1e-12
