"""relconv's RGCNConv against torch_geometric's RGCNConv / FastRGCNConv with the same state_dict."""

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor

import relconv.graph as rg
from tests.graph.graphs import assert_close_grads, features, grads, paired_layers, random_graph

R, C_IN, C_OUT = 5, 6, 4
DECOMP = {"plain": {}, "bases": {"num_bases": 3}, "blocks": {"num_blocks": 2}}


def _inputs(kind: str):
    """(in_channels, x, x tensors that get gradients, edge_index, edge_type) for one input kind."""
    if kind == "bipartite":
        ei, et = random_graph(num_src=25, num_dst=18, num_relations=R)
        xs, xd = features(25, C_IN, seed=3, dtype=torch.float64), features(18, 2, seed=4, dtype=torch.float64)
        xs.requires_grad_(), xd.requires_grad_()
        return (C_IN, 2), (xs, xd), (xs, xd), ei, et
    ei, et = random_graph(num_relations=R)
    if kind == "features":
        x = features(30, C_IN, dtype=torch.float64).requires_grad_()
        return C_IN, x, (x,), ei, et
    if kind == "none":
        return 30, None, (), ei, et
    # "ids": a 1-D node-id tensor indexes W_r's rows (PyG's trainable-embedding input)
    return 40, torch.randperm(40, generator=torch.Generator().manual_seed(5))[:30], (), ei, et


def _run(layer, x, leaves, ei, et):
    for t in leaves:
        t.grad = None
    out = layer(x, ei, et)
    gen = torch.Generator().manual_seed(9)
    out.backward(torch.randn(out.shape, generator=gen, dtype=out.dtype))
    return out.detach(), grads(layer, *leaves)


@pytest.mark.parametrize("decomp", DECOMP)
@pytest.mark.parametrize("aggr", ["mean", "add", "sum", "max"])
@pytest.mark.parametrize("kind", ["features", "none", "ids", "bipartite"])
@pytest.mark.parametrize("pyg_cls", [pyg_nn.RGCNConv, pyg_nn.FastRGCNConv], ids=["RGCNConv", "FastRGCNConv"])
def test_matches_pyg(decomp, aggr, kind, pyg_cls):
    if decomp == "blocks" and kind in ("none", "ids"):
        pytest.skip("block decomposition needs float features (PyG raises too)")
    if pyg_cls is pyg_nn.FastRGCNConv and aggr == "max":
        pytest.skip("FastRGCNConv has no max aggregation")
    if pyg_cls is pyg_nn.FastRGCNConv and kind == "ids":
        pytest.skip("FastRGCNConv indexes W_r by edge_index, ignoring node-id x; RGCNConv uses the ids")
    in_channels, x, leaves, ei, et = _inputs(kind)
    ref, ours = paired_layers(pyg_cls, rg.RGCNConv, in_channels, C_OUT, R, aggr=aggr, **DECOMP[decomp])
    out_ref, g_ref = _run(ref, x, leaves, ei, et)
    out, g = _run(ours, x, leaves, ei, et)
    torch.testing.assert_close(out, out_ref)
    assert_close_grads(g, g_ref)


def test_same_parameters_init_and_repr():
    for kwargs in ({}, {"num_bases": 2}, {"num_blocks": 2}, {"root_weight": False, "bias": False}):
        ref, ours = pyg_nn.RGCNConv(8, 4, 3, **kwargs), rg.RGCNConv(8, 4, 3, **kwargs)
        assert repr(ours) == repr(ref)
        assert {k: v.shape for k, v in ours.state_dict().items()} == {
            k: v.shape for k, v in ref.state_dict().items()
        }
    # glorot on both: the same seed draws the same parameters
    torch.manual_seed(3)
    ref = pyg_nn.RGCNConv((8, 5), 4, 3, num_bases=2)
    torch.manual_seed(3)
    ours = rg.RGCNConv((8, 5), 4, 3, num_bases=2)
    for (k, a), (_, b) in zip(ref.state_dict().items(), ours.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, msg=k)
    assert repr(ours) == repr(ref) == "RGCNConv((8, 5), 4, num_relations=3)"


@pytest.mark.parametrize("aggr", ["mean", "add"])
def test_edge_index_input(aggr):
    ei, et = random_graph(num_relations=R)
    x = features(30, C_IN, dtype=torch.float64)
    ref, ours = paired_layers(pyg_nn.RGCNConv, rg.RGCNConv, C_IN, C_OUT, R, aggr=aggr)
    eidx = EdgeIndex(ei, sparse_size=(30, 30))
    torch.testing.assert_close(ours(x, eidx, et), ref(x, ei, et))


@pytest.mark.skipif(not WITH_TORCH_SPARSE, reason="torch_sparse is not installed")
@pytest.mark.parametrize("aggr", ["mean", "add", "max"])
def test_sparse_tensor_input(aggr):
    ei, et = random_graph(num_relations=R)
    x = features(30, C_IN, dtype=torch.float64)
    ref, ours = paired_layers(pyg_nn.RGCNConv, rg.RGCNConv, C_IN, C_OUT, R, aggr=aggr)
    adj_t = SparseTensor(row=ei[1], col=ei[0], value=et, sparse_sizes=(30, 30))
    torch.testing.assert_close(ours(x, adj_t), ref(x, adj_t))
    torch.testing.assert_close(ours(x, adj_t), ours(x, ei, et))
