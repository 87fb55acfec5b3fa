"""Aggregation semantics checked by hand: per-relation mean, edge weights, empty graphs and relations."""

import pytest
import torch

import relconv.graph as rg
from tests.graph.graphs import features, random_graph


def _by_hand(layer, x, ei, et, edge_weight=None):
    """out[i] = x_i @ root + bias + sum_r sum_{j in N_r(i)} w_e * a_r(i) * x_j @ W_r, edge by edge."""
    w = layer.weight
    out = x @ layer.root + layer.bias
    deg = {}
    for e in range(ei.size(1)):
        key = (int(ei[1, e]), int(et[e]))
        deg[key] = deg.get(key, 0) + 1
    rows = [[] for _ in range(x.size(0))]
    for e in range(ei.size(1)):
        j, i, r = int(ei[0, e]), int(ei[1, e]), int(et[e])
        a = 1.0 / deg[(i, r)] if layer.aggr == "mean" else 1.0
        a = a * (1.0 if edge_weight is None else float(edge_weight[e]))
        rows[i].append(a * x[j] @ w[r])
    return out + torch.stack([sum(r) if r else torch.zeros_like(out[0]) for r in rows])


@pytest.mark.parametrize("aggr", ["mean", "add"])
@pytest.mark.parametrize("weighted", [False, True])
def test_per_relation_mean_by_hand(aggr, weighted):
    ei, et = random_graph(num_src=12, num_dst=12, num_edges=60, num_relations=3)
    x = features(12, 5, dtype=torch.float64)
    layer = rg.RGCNConv(5, 4, 3, aggr=aggr).double()
    torch.nn.init.normal_(layer.bias)
    ew = torch.rand(ei.size(1), dtype=torch.float64) if weighted else None
    expected = _by_hand(layer, x, ei, et, ew)
    torch.testing.assert_close(layer(x, ei, et, edge_weight=ew), expected)


def test_mean_is_not_total_degree_mean():
    """Normalising by the total in-degree (PyG's segment-matmul fast path) is a different operator."""
    ei, et = random_graph(num_src=12, num_dst=12, num_edges=60, num_relations=3)
    x = features(12, 5, dtype=torch.float64)
    layer = rg.RGCNConv(5, 4, 3, root_weight=False, bias=False).double()
    total = layer.__class__(5, 4, 3, aggr="add", root_weight=False, bias=False).double()
    total.load_state_dict(layer.state_dict())
    deg = torch.bincount(ei[1], minlength=12).clamp(min=1).double()
    assert not torch.allclose(layer(x, ei, et), total(x, ei, et) / deg.unsqueeze(1))


@pytest.mark.parametrize("aggr", ["mean", "add", "max"])
def test_edge_weight_max_and_order(aggr):
    """edge_weight is given in the caller's edge order, whatever order the map sorts pairs into."""
    ei, et = random_graph(num_relations=4)
    x = features(30, 6, dtype=torch.float64)
    ew = torch.rand(ei.size(1), dtype=torch.float64)
    layer = rg.RGCNConv(6, 3, 4, aggr=aggr).double()
    perm = torch.randperm(ei.size(1), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(layer(x, ei, et, ew), layer(x, ei[:, perm], et[perm], ew[perm]))
    if aggr == "max":  # max of (w_e * x_j) per slot: scaling all weights by 2 doubles the messages
        base = rg.RGCNConv(6, 3, 4, aggr=aggr, root_weight=False, bias=False).double()
        torch.testing.assert_close(base(x, ei, et, 2 * ew), 2 * base(x, ei, et, ew))


@pytest.mark.parametrize("aggr", ["mean", "add", "max"])
@pytest.mark.parametrize("featureless", [False, True])
def test_empty_graph_and_untouched_nodes(aggr, featureless):
    layer = rg.RGCNConv(7 if featureless else 3, 2, 4, aggr=aggr, root_weight=False).double()
    torch.nn.init.normal_(layer.bias)
    x = None if featureless else features(7, 3, dtype=torch.float64)
    empty = torch.empty(2, 0, dtype=torch.long), torch.empty(0, dtype=torch.long)
    out = layer(x, *empty)
    torch.testing.assert_close(out, layer.bias.expand(7, 2))
    ei = torch.tensor([[0, 1], [2, 2]])
    out = layer(x, ei, torch.tensor([1, 1]))
    untouched = torch.tensor([0, 1, 3, 4, 5, 6])
    torch.testing.assert_close(out[untouched], layer.bias.expand(6, 2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("decomp", [{}, {"num_bases": 2}, {"num_blocks": 2}])
def test_half_precision_cpu(dtype, decomp):
    ei, et = random_graph(num_relations=4)
    x = features(30, 6)
    layer = rg.RGCNConv(6, 4, 4, **decomp)
    ref = layer(x, ei, et)
    half = rg.RGCNConv(6, 4, 4, **decomp).to(dtype)
    half.load_state_dict(layer.state_dict())
    xh = x.to(dtype).requires_grad_()
    out = half(xh, ei, et)
    assert out.dtype == dtype
    out.float().sum().backward()
    assert xh.grad.dtype == dtype and half.weight.grad.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
