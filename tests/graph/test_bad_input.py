"""Bad input raises ValueError/TypeError naming the argument, never a crash or silent garbage."""

import pytest
import torch

import relconv.graph as rg
from tests.graph.graphs import features, random_graph


@pytest.fixture
def graph():
    ei, et = random_graph(num_relations=4)
    return features(30, 6), ei, et


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_blocks": 4}, "num_blocks"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"num_bases": 2, "num_blocks": 2}, "num_bases and num_blocks"),
        ({"num_bases": 0}, "num_bases"),
        ({"aggr": "min"}, "aggr"),
        ({"aggr": ["mean", "max"]}, "aggr"),
    ],
    ids=str,
)
def test_bad_constructor(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rg.RGCNConv(6, 6, 4, **kwargs)


def test_bad_constructor_sizes():
    with pytest.raises(ValueError, match="in_channels"):
        rg.RGCNConv(0, 6, 4)
    with pytest.raises(ValueError, match="out_channels"):
        rg.RGCNConv(6, -1, 4)
    with pytest.raises(ValueError, match="num_relations"):
        rg.RGCNConv(6, 6, 0)


def test_edge_type_out_of_range(graph):
    x, ei, et = graph
    layer = rg.RGCNConv(6, 6, 4)
    with pytest.raises(ValueError, match=r"edge_type values must lie in \[0, 4\)"):
        layer(x, ei, et + 2)
    with pytest.raises(ValueError, match="edge_type values"):
        layer(x, ei, et - 1)


def test_node_index_out_of_range(graph):
    x, ei, et = graph
    layer = rg.RGCNConv(6, 6, 4)
    with pytest.raises(ValueError, match=r"edge_index\[0\]"):
        layer(x, torch.stack([ei[0] + 30, ei[1]]), et)
    with pytest.raises(ValueError, match=r"edge_index\[1\]"):
        layer(x, torch.stack([ei[0], ei[1] - 31]), et)


def test_bad_edge_arguments(graph):
    x, ei, et = graph
    layer = rg.RGCNConv(6, 6, 4)
    with pytest.raises(ValueError, match="edge_type is required"):
        layer(x, ei)
    with pytest.raises(ValueError, match="edge_type has"):
        layer(x, ei, et[:-1])
    with pytest.raises(ValueError, match="edge_type must be an integer"):
        layer(x, ei, et.float())
    with pytest.raises(ValueError, match=r"edge_index must have shape \[2, E\]"):
        layer(x, ei.t(), et)
    with pytest.raises(ValueError, match="edge_index must be an integer"):
        layer(x, ei.float(), et)
    with pytest.raises(TypeError, match="edge_index must be"):
        layer(x, ei.tolist(), et)


def test_bad_x(graph):
    x, ei, et = graph
    layer = rg.RGCNConv(6, 6, 4)
    with pytest.raises(ValueError, match=r"x must have shape \[num_nodes, 6\]"):
        layer(x[:, :5], ei, et)
    with pytest.raises(TypeError, match="x must be a tensor"):
        layer(x.tolist(), ei, et)
    with pytest.raises(ValueError, match=r"x\[1\]"):
        rg.RGCNConv((6, 3), 6, 4)((x, None), ei, et)
    with pytest.raises(ValueError, match=r"x\[1\] must have shape"):
        rg.RGCNConv((6, 3), 6, 4)((x, x), ei, et)
    with pytest.raises(ValueError, match="num_blocks needs floating-point"):
        rg.RGCNConv(30, 6, 4, num_blocks=2)(None, ei, et)


def test_map_does_not_fit(graph):
    x, ei, et = graph
    prebuilt = rg.build_rgcn_map(ei, et, 30, 4, "mean")
    with pytest.raises(ValueError, match="node counts"):
        rg.RGCNConv(6, 6, 4)(x[:20], prebuilt)
    with pytest.raises(ValueError, match="num_relations=4"):
        rg.RGCNConv(6, 6, 5)(x, prebuilt)
    with pytest.raises(ValueError, match="aggr='mean'"):
        rg.RGCNConv(6, 6, 4, aggr="add")(x, prebuilt)
    with pytest.raises(ValueError, match="edge_type must be None"):
        rg.RGCNConv(6, 6, 4)(x, prebuilt, et)
    with pytest.raises(ValueError, match="num_nodes"):
        rg.build_rgcn_map(ei, et, num_nodes=(30, -1))
    with pytest.raises(ValueError, match="aggr"):
        rg.build_rgcn_map(ei, et, aggr="std")


def test_bad_edge_weight(graph):
    x, ei, et = graph
    layer = rg.RGCNConv(6, 6, 4)
    with pytest.raises(ValueError, match="edge_weight must have shape"):
        layer(x, ei, et, torch.ones(3))
    with pytest.raises(ValueError, match="edge_weight must be a floating-point"):
        layer(x, ei, et, torch.ones(ei.size(1), dtype=torch.long))
    with pytest.raises(ValueError, match="edge_weight requires grad"):
        layer(x, ei, et, torch.ones(ei.size(1), requires_grad=True))


@pytest.mark.cuda
def test_mismatched_devices(graph):
    x, ei, et = graph
    layer = rg.RGCNConv(6, 6, 4)
    with pytest.raises(ValueError, match="x is on cuda"):
        layer(x.cuda(), ei, et)
    with pytest.raises(ValueError, match="edge_type is on"):
        layer.cuda()(x.cuda(), ei.cuda(), et)
    with pytest.raises(ValueError, match="edge_index is on cpu"):
        layer(x.cuda(), rg.build_rgcn_map(ei, et, 30, 4))
