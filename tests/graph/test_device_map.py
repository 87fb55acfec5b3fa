"""The CUDA graph-map build (one op, `typed_edge_map`) gives exactly the CPU build's map, and
raises the CPU build's errors for values out of range."""

import pytest
import torch

import relconv.graph as rg
from tests.graph.graphs import random_graph

pytestmark = pytest.mark.cuda


def _assert_same_map(a: rg.RGCNMap, b: rg.RGCNMap) -> None:
    for name in ("in_index", "out_index", "rel_ptr"):
        got, want = getattr(a.rmap, name), getattr(b.rmap, name)
        assert got.dtype == want.dtype, name
        assert torch.equal(got.cpu(), want.cpu()), name
    assert (a.rmap.scale is None) == (b.rmap.scale is None)
    if a.rmap.scale is not None:
        assert torch.equal(a.rmap.scale.cpu(), b.rmap.scale.cpu())
    assert torch.equal(a.edge_perm.cpu().long(), b.edge_perm.cpu().long())
    assert (a.num_src, a.num_dst, a.num_relations) == (b.num_src, b.num_dst, b.num_relations)


def _hub_graph(num_nodes: int, num_edges: int, num_relations: int, seed: int):
    """Most edges into a few targets (runs of equal keys far longer than a block)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = torch.where(
        torch.rand(num_edges, generator=gen) < 0.7,
        torch.randint(0, 3, (num_edges,), generator=gen),
        torch.randint(0, num_nodes, (num_edges,), generator=gen),
    )
    rel = torch.randint(0, num_relations, (num_edges,), generator=gen)
    return torch.stack([src, dst]), rel


@pytest.mark.parametrize("aggr", ["mean", "sum", "max"])
@pytest.mark.parametrize(
    ("index_dtype", "type_dtype"),
    [
        (torch.int64, torch.int64),
        (torch.int32, torch.int32),
        (torch.int64, torch.int32),
        (torch.int16, torch.uint8),
    ],
    ids=str,
)
def test_same_map_as_the_cpu_build(aggr, index_dtype, type_dtype):
    ei, et = random_graph(num_src=40, num_dst=50, num_edges=3000, num_relations=7)
    ei, et = ei.to(index_dtype), et.to(type_dtype)
    cpu = rg.build_rgcn_map(ei, et, (40, 50), 7, aggr)
    gpu = rg.build_rgcn_map(ei.cuda(), et.cuda(), (40, 50), 7, aggr)
    _assert_same_map(gpu, cpu)


@pytest.mark.parametrize(
    ("num_nodes", "num_relations"),
    [(100_000, 3), (2**28, 9), (2**30, 9)],
    ids=["small keys", "32-bit keys", "64-bit keys"],
)
def test_same_map_on_hubs_and_wide_keys(num_nodes, num_relations):
    ei, et = _hub_graph(min(num_nodes, 100_000), 200_000, num_relations, seed=3)
    cpu = rg.build_rgcn_map(ei, et, num_nodes, num_relations, "mean")
    gpu = rg.build_rgcn_map(ei.cuda(), et.cuda(), num_nodes, num_relations, "mean")
    _assert_same_map(gpu, cpu)


def test_defaults_and_sparse_input_match():
    ei, et = random_graph(num_edges=500, num_relations=6)
    _assert_same_map(rg.build_rgcn_map(ei.cuda(), et.cuda()), rg.build_rgcn_map(ei, et))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda ei, et: (ei, et + 4), r"edge_type values must lie in \[0, 5\)"),
        (lambda ei, et: (ei, et - 1), r"edge_type values must lie in \[0, 5\)"),
        (lambda ei, et: (torch.stack([ei[0] + 30, ei[1]]), et), r"edge_index\[0\] \(source nodes\)"),
        (lambda ei, et: (torch.stack([ei[0], ei[1] - 31]), et), r"edge_index\[1\] \(target nodes\)"),
    ],
    ids=["type too big", "type negative", "source too big", "target negative"],
)
def test_out_of_range_raises_like_the_cpu_build(change, match):
    ei, et = change(*random_graph(num_relations=5))
    with pytest.raises(ValueError, match=match):
        rg.build_rgcn_map(ei, et, 30, 5)
    with pytest.raises(ValueError, match=match):
        rg.build_rgcn_map(ei.cuda(), et.cuda(), 30, 5)
    # The failed build leaves the device usable.
    ok = rg.build_rgcn_map(*(t.cuda() for t in random_graph(num_relations=5)), 30, 5)
    assert ok.num_edges == 150


def test_graph_without_edges():
    ei = torch.zeros(2, 0, dtype=torch.long, device="cuda")
    g = rg.build_rgcn_map(ei, torch.zeros(0, dtype=torch.long, device="cuda"), 10, 3)
    assert g.num_edges == 0
    assert g.rmap.rel_ptr.tolist() == [0, 0, 0, 0]
