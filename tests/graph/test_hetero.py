"""HeteroData -> (edge_index, edge_type) and back; relconv layers inside `to_hetero` models."""

import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import to_hetero

import relconv.graph as rg
from tests.graph.graphs import features


def _data() -> HeteroData:
    gen = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["user"].x = features(10, 6, seed=1)
    data["movie"].x = features(8, 6, seed=2)
    rates = torch.stack(
        [torch.randint(0, 10, (30,), generator=gen), torch.randint(0, 8, (30,), generator=gen)]
    )
    data["user", "rates", "movie"].edge_index = rates
    data["movie", "rated_by", "user"].edge_index = rates.flip(0)
    data["movie", "sequel", "movie"].edge_index = torch.randint(0, 8, (2, 6), generator=gen)
    return data


def test_round_trip():
    data = _data()
    g = rg.to_relational(data)
    x, edge_index, edge_type, node_type, offsets, (node_types, edge_types) = g
    assert node_types == ["user", "movie"] and offsets == {"user": 0, "movie": 10}
    assert x.shape == (18, 6) and node_type.tolist() == [0] * 10 + [1] * 8
    assert edge_index.shape == (2, 66) and edge_type.bincount().tolist() == [30, 30, 6]
    for k, (src, rel, dst) in enumerate(edge_types):
        local = edge_index[:, edge_type == k] - torch.tensor([[offsets[src]], [offsets[dst]]])
        torch.testing.assert_close(local, data[src, rel, dst].edge_index)
    parts = rg.split_node_outputs(x, g)
    torch.testing.assert_close(parts["user"], data["user"].x)
    torch.testing.assert_close(parts["movie"], data["movie"].x)


def test_featureless_types_give_no_x():
    data = _data()
    del data["movie"].x
    data["movie"].num_nodes = 8
    assert rg.to_relational(data).x is None


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = rg.RGCNConv(6, 4, 1, root_weight=False, bias=False)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


def test_to_hetero_equals_rgcn_on_relational_form():
    """to_hetero gives each edge type its own 1-relation conv and sums them per target type: that is
    one R-GCN layer over the flattened graph whose W_r is edge type r's weight."""
    data = _data()
    hetero = to_hetero(_Net(), data.metadata(), aggr="sum")
    out_dict = hetero(data.x_dict, data.edge_index_dict)
    g = rg.to_relational(data)
    conv = rg.RGCNConv(6, 4, len(g.metadata[1]), root_weight=False, bias=False)
    with torch.no_grad():
        for k, edge_type in enumerate(g.metadata[1]):
            conv.weight[k] = hetero.conv["__".join(edge_type)].weight[0]
    flat = rg.split_node_outputs(conv(g.x, g.edge_index, g.edge_type), g)
    for node_type, out in out_dict.items():
        torch.testing.assert_close(out, flat[node_type])
