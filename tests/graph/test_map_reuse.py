"""The graph's map is built once and reused; a prebuilt map runs under torch.compile without breaks."""

import copy
import io

import pytest
import torch

import relconv.graph as rg
import relconv.graph.map_cache as map_cache
from relconv.graph.graph_map import _run_lengths
from tests.conftest import DEVICES
from tests.graph.graphs import features, random_graph


@pytest.fixture
def build_count(monkeypatch):
    calls = []
    real = map_cache.build_rgcn_map

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(map_cache, "build_rgcn_map", counting)
    return calls


def test_built_once_per_graph(build_count):
    ei, et = random_graph(num_relations=4)
    x = features(30, 6)
    layers = [rg.RGCNConv(6, 6, 4), rg.RGCNConv(6, 6, 4)]
    for _ in range(3):  # epochs
        h = x
        for layer in layers:
            h = layer(h, ei, et).relu()
        h.sum().backward()
    assert len(build_count) == 1
    rg.RGCNConv(6, 6, 4, aggr="add")(x, ei, et)  # another aggregation needs another map
    assert len(build_count) == 2


def test_rebuilt_when_the_graph_changes(build_count):
    ei, et = random_graph(num_relations=4)
    x = features(30, 6)
    layer = rg.RGCNConv(6, 6, 4)
    before = layer(x, ei, et)
    et2 = et.clone()
    et2[:10] = (et2[:10] + 1) % 3
    torch.testing.assert_close(layer(x, ei, et2), rg.RGCNConv.forward(layer, x, ei.clone(), et2))
    et[:10] = (et[:10] + 1) % 3  # in place: bumps the version
    torch.testing.assert_close(layer(x, ei, et), layer(x, ei.clone(), et.clone()))
    assert not torch.allclose(before, layer(x, ei, et))
    assert len(build_count) == 5


def test_cached_graph_still_saves_and_copies():
    ei, et = random_graph(num_relations=4)
    rg.RGCNConv(6, 6, 4)(features(30, 6), ei, et)
    buf = io.BytesIO()
    torch.save(ei, buf)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, weights_only=True), ei)
    torch.testing.assert_close(copy.deepcopy(ei), ei)


@pytest.mark.parametrize("aggr", ["mean", "add", "max"])
def test_prebuilt_map_equals_raw_input(aggr):
    ei, et = random_graph(num_relations=4)
    x = features(30, 6)
    layer = rg.RGCNConv(6, 5, 4, aggr=aggr)
    graph = rg.build_rgcn_map(ei, et, num_nodes=30, num_relations=4, aggr=aggr)
    torch.testing.assert_close(layer(x, graph), layer(x, ei, et))
    assert graph.to("cpu") is graph


def test_single_relation_needs_no_edge_type():
    ei, et = random_graph(num_relations=1)
    x = features(30, 6)
    layer = rg.RGCNConv(6, 5, 1)
    torch.testing.assert_close(layer(x, ei), layer(x, ei, et))


@pytest.mark.parametrize(
    "kwargs", [{}, {"num_bases": 2}, {"num_blocks": 2}, {"aggr": "max"}, {"aggr": "add"}], ids=str
)
@pytest.mark.parametrize("featureless", [False, True])
def test_compile_fullgraph_no_breaks(kwargs, featureless):
    if featureless and "num_blocks" in kwargs:
        pytest.skip("blocks need features")
    torch._dynamo.reset()
    ei, et = random_graph(num_relations=4)
    x = None if featureless else features(30, 6).requires_grad_()
    layer = rg.RGCNConv(30 if featureless else 6, 4, 4, **kwargs)
    graph = rg.build_rgcn_map(ei, et, 30, 4, layer.aggr)
    ew = torch.rand(ei.size(1))
    explain = torch._dynamo.explain(layer)(x, graph, None, ew)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    compiled = torch.compile(layer, fullgraph=True)
    out = compiled(x, graph, None, ew)
    torch.testing.assert_close(out, layer(x, graph, None, ew))
    out.sum().backward()
    assert layer.weight.grad is not None


@pytest.mark.parametrize("num_nodes", [40, 2**28], ids=["32-bit keys", "64-bit keys"])
def test_sort_keys_of_any_width_give_the_same_map(num_nodes):
    # (relation, target) keys reach num_relations * num_nodes: past 2^31 they sort as int64.
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 3, 7, 7, 3, 9]])
    edge_type = torch.tensor([2, 0, 2, 1, 0, 8])
    g = rg.build_rgcn_map(edge_index, edge_type, num_nodes, 9, "mean")
    assert g.rmap.rel_ptr.tolist() == [0, 2, 3, 5, 5, 5, 5, 5, 5, 6]
    assert g.rmap.in_index.tolist() == [1, 4, 3, 0, 2, 5]
    assert g.rmap.out_index.tolist() == [3, 3, 7, 7, 7, 9]
    assert g.rmap.scale.tolist() == [0.5, 0.5, 1.0, 0.5, 0.5, 1.0]
    assert g.edge_perm.tolist() == [1, 4, 3, 0, 2, 5]


@pytest.mark.parametrize("device", DEVICES)
def test_run_lengths_count_each_keys_run(device):
    # Linear passes on the CPU, binary searches (no host read) on a GPU: the same lengths.
    key = torch.tensor([3, 3, 5, 7, 7, 7, 9], dtype=torch.int32, device=device)
    assert _run_lengths(key).tolist() == [2, 2, 1, 3, 3, 3, 1]
    assert _run_lengths(key[:0]).tolist() == []
    assert _run_lengths(key).dtype == torch.int64
