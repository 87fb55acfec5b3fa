"""Summing each (target, relation) slot's inputs before the per-relation transform: the same layer."""

import pytest
import torch
import torch_geometric.nn as pyg_nn

import relconv.graph as rg
import relconv.graph.graph_map as graph_map
import relconv.graph.slots as slots
from relconv.graph.slots import SlotLayout, slot_sum
from relconv.ops import relational_conv
from tests.conftest import no_host_sync
from tests.graph.graphs import features, paired_layers, random_graph


@pytest.fixture
def sums_first(monkeypatch):
    """Every mean / sum layer sums its slots first, whatever the device and size."""
    monkeypatch.setattr(graph_map, "aggregates_first", lambda *args: True)


@pytest.mark.parametrize("aggr", ["mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
def test_slot_rows_then_transform_equal_the_edges(aggr, weighted):
    ei, et = random_graph(40, 30, 400, 6)
    g = rg.build_rgcn_map(ei, et, (40, 30), 6, aggr)
    x = features(40, 5, dtype=torch.float64).requires_grad_()
    w = torch.randn(6, 5, 3, dtype=torch.float64, requires_grad=True)
    ew = torch.rand(400, dtype=torch.float64) if weighted else None
    ref = relational_conv(x, w, g.conv_map(g.pair_scale(ew, x.dtype)))
    layout = g.slots
    rows = slot_sum(x, layout, g.edge_values(ew, x.dtype))
    out = relational_conv(rows, w, layout.mean_map(x.dtype) if aggr == "mean" else layout.slot_map)
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(ref)
    got, expected = torch.autograd.grad(out, (x, w), grad), torch.autograd.grad(ref, (x, w), grad)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_slot_sum_gradient():
    ei, et = random_graph(20, 20, 120, 4)
    g = rg.build_rgcn_map(ei, et, 20, 4, "sum")
    x = features(20, 3, dtype=torch.float64).requires_grad_()
    values = torch.rand(120, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: slot_sum(t, g.slots, values), (x,))


def test_layout_counts_the_slots():
    # Three edges into (target 0, relation 1), one into (0, 0), two into (2, 1): three slots.
    ei = torch.tensor([[3, 1, 2, 0, 1, 4], [0, 0, 0, 0, 2, 2]])
    et = torch.tensor([1, 1, 1, 0, 1, 1])
    g = rg.build_rgcn_map(ei, et, 5, 2, "mean")
    layout = SlotLayout(g.rmap)
    assert layout.num_slots == 3
    assert layout.degree.tolist() == [1, 3, 2]
    assert layout.pair_ptr.tolist() == [0, 1, 4, 6]
    assert layout.slot_map.out_index.tolist() == [0, 0, 2]
    assert layout.slot_map.rel_ptr.tolist() == [0, 1, 3]
    assert layout.slot_index.tolist() == [0, 1, 1, 1, 2, 2]


@pytest.mark.parametrize("aggr", ["mean", "add"])
@pytest.mark.parametrize(
    "config", [{}, {"num_bases": 2}, {"num_blocks": 2}], ids=["plain", "bases", "blocks"]
)
def test_layer_summing_slots_first_matches_pyg(sums_first, aggr, config):
    ei, et = random_graph(50, 50, 600, 5)
    ref, ours = paired_layers(pyg_nn.RGCNConv, rg.RGCNConv, 8, 6, 5, aggr=aggr, **config)
    x = features(50, 8, dtype=torch.float64)
    assert "sum first" in ours.execution_plan(x, ei, et).why
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out = ref(xr, ei, et), ours(xo, ei, et)
    torch.testing.assert_close(out, out_ref)
    grad = torch.randn_like(out)
    out_ref.backward(grad)
    out.backward(grad)
    torch.testing.assert_close(xo.grad, xr.grad)
    for (name, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_edge_weights_ride_on_the_slot_sum(sums_first, monkeypatch):
    ei, et = random_graph(50, 50, 600, 5)
    layer = rg.RGCNConv(8, 6, 5).double()
    x = features(50, 8, dtype=torch.float64)
    ew = torch.rand(600, dtype=torch.float64)
    first = layer(x, ei, et, ew)
    monkeypatch.setattr(graph_map, "aggregates_first", lambda *args: False)
    torch.testing.assert_close(first, layer(x, ei, et, ew))


def test_graphs_with_about_one_edge_per_slot_keep_the_edges(sums_first):
    # Every edge its own (target, relation) slot: summing first would save nothing.
    ei = torch.stack([torch.arange(100), torch.arange(100)])
    layer = rg.RGCNConv(4, 4, 1).double()
    assert "sum first" not in layer.execution_plan(features(100, 4, dtype=torch.float64), ei, None).why


def test_the_rule_needs_a_gpu_a_large_graph_and_wide_layers():
    x = torch.zeros(1, 64)
    assert not slots.aggregates_first(1 << 24, x, 64, 64)  # CPU features


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("aggr", ["mean", "add"])
def test_large_graph_on_cuda_sums_first_and_agrees(monkeypatch, dtype, aggr):
    n, edges, relations = 50_000, slots.MIN_EDGES, 40
    gen = torch.Generator().manual_seed(0)
    # Targets from a tenth of the nodes and few relations: about 0.4 slots per edge.
    src = torch.randint(0, n, (edges,), generator=gen)
    dst = torch.randint(0, n // 10, (edges,), generator=gen)
    et = torch.randint(0, relations, (edges,), generator=gen)
    ei, et = torch.stack([src, dst]).cuda(), et.cuda()
    torch.manual_seed(0)
    layer = rg.RGCNConv(64, 64, relations, aggr=aggr).to("cuda", dtype)
    x = torch.randn(n, 64, device="cuda", dtype=dtype)
    graph = rg.build_rgcn_map(ei, et, n, relations, aggr)
    assert "sum first" in layer.execution_plan(x, graph).why
    xs = x.clone().requires_grad_()
    out = layer(xs, graph)
    with no_host_sync():  # the slots are counted once, then kept on the map
        layer(x, graph)
    grad = torch.randn_like(out)
    out.backward(grad)
    grads = [xs.grad] + [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    monkeypatch.setattr(slots, "MIN_EDGES", 1 << 62)
    assert "sum first" not in layer.execution_plan(x, graph).why
    xe = x.clone().requires_grad_()
    ref = layer(xe, graph)
    ref.backward(grad)
    # Both sides round to half precision at different points (slot rows, outputs): compare on the
    # tensor's scale.
    tol = {"atol": 1e-5, "rtol": 0} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 0}
    for a, b in zip([out] + grads, [ref, xe.grad] + [p.grad for p in layer.parameters()], strict=True):
        scale = b.float().abs().max()
        torch.testing.assert_close(a.float() / scale, b.float() / scale, **tol)
