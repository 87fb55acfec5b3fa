"""float64 RGCNConv is float64 all the way: it matches PyG's RGCNConv to 1e-12 relative.

A mean scale 1/deg_r(i) computed in float32 would leave about 6e-9 relative error; these tests hold
every configuration and the gradients to a bound that only a float64 scale meets.
"""

import pytest
import torch
import torch_geometric.nn as pyg_nn

import relconv.graph as rg
from tests.graph.graphs import features, grads, paired_layers, random_graph

R, C_IN, C_OUT, N = 6, 6, 4, 40
DECOMP = {"plain": {}, "bases": {"num_bases": 3}, "blocks": {"num_blocks": 1}, "blocks2": {"num_blocks": 2}}
RTOL = 1e-12


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def _graph():
    # Degrees 1..~10 per (target, relation) slot; 1/3, 1/7, ... are inexact in every binary precision.
    return random_graph(num_src=N, num_dst=N, num_edges=400, num_relations=R, seed=11)


@pytest.mark.parametrize("aggr", ["mean", "add"])
@pytest.mark.parametrize("decomp", DECOMP)
@pytest.mark.parametrize("x_kind", ["features", "none"])
def test_fp64_matches_pyg(aggr, decomp, x_kind):
    if x_kind == "none" and decomp.startswith("blocks"):
        pytest.skip("block decomposition needs float features (both libraries raise)")
    in_channels = C_IN if x_kind == "features" else N
    kwargs = {"aggr": aggr, **DECOMP[decomp]}
    ref, ours = paired_layers(pyg_nn.RGCNConv, rg.RGCNConv, in_channels, C_OUT, R, **kwargs)
    x = features(N, C_IN, seed=2, dtype=torch.float64).requires_grad_() if x_kind == "features" else None
    ei, et = _graph()
    g_out = torch.randn(N, C_OUT, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    results = []
    for layer in (ref, ours):
        if x is not None:
            x.grad = None
        out = layer(x, ei, et)
        assert out.dtype == torch.float64
        out.backward(g_out)
        results.append((out.detach(), grads(layer, *(() if x is None else (x,)))))
    (out_ref, g_ref), (out, g) = results
    assert _rel_err(out, out_ref) <= RTOL
    assert g.keys() == g_ref.keys()
    for k in g:
        assert _rel_err(g[k], g_ref[k]) <= RTOL, k


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.float64])
def test_fp64_mean_with_edge_weight(weight_dtype):
    """A float32 edge weight with float64 features still gets the float64 mean scale."""
    ei, et = _graph()
    w = torch.rand(ei.size(1), generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    layer = rg.RGCNConv(C_IN, C_OUT, R, aggr="mean").double()
    x = features(N, C_IN, seed=3, dtype=torch.float64)
    out = layer(x, ei, et, edge_weight=w.to(weight_dtype))
    # Reference: per-edge message scaled by weight / deg_r(target), summed in float64.
    src, dst = ei
    deg = torch.zeros(N, R, dtype=torch.float64).index_put_((dst, et), torch.ones_like(w), accumulate=True)
    factor = w.to(weight_dtype).double() / deg[dst, et]
    msg = torch.einsum("ec,eco->eo", x[src], layer.weight[et]) * factor[:, None]
    ref = torch.zeros(N, C_OUT, dtype=torch.float64).index_add_(0, dst, msg) + x @ layer.root + layer.bias
    assert _rel_err(out.detach(), ref.detach()) <= RTOL


def test_mean_scale_per_dtype():
    """The float32 map scale is kept for float32; float64 is derived from the degrees, not widened."""
    ei, et = _graph()
    graph = rg.build_rgcn_map(ei, et, N, R, aggr="mean")
    s32, s64 = graph.mean_scale(torch.float32), graph.mean_scale(torch.float64)
    assert s32 is graph.rmap.scale and s32.dtype == torch.float32
    assert s64.dtype == torch.float64 and graph.mean_scale(torch.float64) is s64
    key = et * N + ei[1]
    deg = torch.unique(key, return_counts=True, return_inverse=True)
    expected = (1.0 / deg[2][deg[1]].double()).index_select(0, graph.edge_perm)
    assert torch.equal(s64, expected)
    torch.testing.assert_close(s64.float(), s32, rtol=0, atol=0)
    assert rg.build_rgcn_map(ei, et, N, R, aggr="add").mean_scale(torch.float64) is None
