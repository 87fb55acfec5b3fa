"""An inference RGCNConv on CUDA in float32 / float64 writes its root transform and bias first and
has the pair kernel add the messages onto them (`relational_conv_add_`): the same output as the
training path, which adds the root onto the messages."""

import pytest
import torch
import torch_geometric.nn as pyg_nn

import relconv.graph as rg
import relconv.graph.graph_map as graph_map
import relconv.graph.rgcn_conv as rgcn_conv
from tests.graph.graphs import features, paired_layers, random_graph

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def adds(monkeypatch):
    """Counts the layer's calls of relational_conv_add_."""
    calls = []
    real = rgcn_conv.relational_conv_add_

    def counting(*args, **kwargs):
        calls.append(args[0].dtype)
        return real(*args, **kwargs)

    monkeypatch.setattr(rgcn_conv, "relational_conv_add_", counting)
    return calls


def _both_paths(layer, x, ei, et, **kwargs):
    """(inference output, training-path output) of one layer on the same input."""
    with torch.no_grad():
        fast = layer(x, ei, et, **kwargs)
    slow = layer(x, ei, et, **kwargs)
    return fast, slow.detach()


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("aggr", ["mean", "add", "max"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("sums_first", [False, True])
def test_inference_adds_the_messages_onto_the_root(adds, monkeypatch, dtype, aggr, bias, sums_first):
    monkeypatch.setattr(graph_map, "aggregates_first", lambda *args: sums_first)
    ei, et = random_graph(60, 60, 700, 6)
    ei, et = ei.cuda(), et.cuda()
    torch.manual_seed(0)
    layer = rg.RGCNConv(16, 24, 6, aggr=aggr, bias=bias).to("cuda", dtype)
    if bias:
        torch.nn.init.uniform_(layer.bias)  # zeros by default: make the bias count
    x = features(60, 16, dtype=dtype).cuda()
    fast, slow = _both_paths(layer, x, ei, et)
    assert adds == [dtype]
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(fast, slow, rtol=tol, atol=tol)


@pytest.mark.cuda
@needs_cuda
def test_blocks_bipartite_and_edge_weights_agree(adds):
    ei, et = random_graph(50, 40, 600, 5, seed=3)
    ei, et = ei.cuda(), et.cuda()
    torch.manual_seed(1)
    layer = rg.RGCNConv((8, 12), 16, 5).cuda()
    x = (features(50, 8).cuda(), features(40, 12, seed=2).cuda())
    ew = torch.rand(600, device="cuda")
    fast, slow = _both_paths(layer, x, ei, et, edge_weight=ew)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    blocks = rg.RGCNConv(16, 16, 5, num_blocks=4).cuda()
    ei, et = (t.cuda() for t in random_graph(50, 50, 600, 5, seed=4))
    fast, slow = _both_paths(blocks, features(50, 16).cuda(), ei, et)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    assert len(adds) == 2


@pytest.mark.cuda
@needs_cuda
def test_matches_pyg_in_inference():
    ref, ours = paired_layers(pyg_nn.RGCNConv, rg.RGCNConv, 10, 7, 4, aggr="mean")
    ref, ours = ref.cuda(), ours.cuda()
    torch.nn.init.uniform_(ref.bias)
    ours.load_state_dict(ref.state_dict())
    ei, et = random_graph(40, 40, 300, 4)
    x = features(40, 10, dtype=torch.float64).cuda()
    with torch.no_grad():
        torch.testing.assert_close(ours(x, ei.cuda(), et.cuda()), ref(x, ei.cuda(), et.cuda()))


@pytest.mark.cuda
@needs_cuda
def test_half_precision_and_featureless_layers_keep_the_plain_path(adds):
    ei, et = random_graph(30, 30, 200, 4)
    ei, et = ei.cuda(), et.cuda()
    layer = rg.RGCNConv(8, 8, 4).cuda()
    with torch.no_grad():
        layer.half()(features(30, 8, dtype=torch.float16).cuda(), ei, et)
        rg.RGCNConv(30, 8, 4).cuda()(None, ei, et)
    assert adds == []


@pytest.mark.cuda
@needs_cuda
def test_the_plan_says_so():
    ei, et = (t.cuda() for t in random_graph(40, 40, 300, 4))
    layer = rg.RGCNConv(8, 8, 4).cuda()
    x = features(40, 8).cuda()
    said = "added onto the root transform"
    assert said in layer.execution_plan(x, ei, et, requires_grad=False).why
    assert said not in layer.execution_plan(x, ei, et, requires_grad=True).why
    with torch.no_grad():
        assert said in layer.execution_plan(x, ei, et).why
    assert said not in layer.execution_plan(x, ei, et).why  # the parameters want gradients


def test_a_cpu_layer_keeps_the_root_after_the_messages():
    # The in-place addition pays only where the pair kernel would otherwise fill an accumulator.
    ei, et = random_graph(40, 40, 300, 4)
    layer = rg.RGCNConv(8, 8, 4)
    with torch.no_grad():
        assert "root transform" not in layer.execution_plan(features(40, 8), ei, et).why
