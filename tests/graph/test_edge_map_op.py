"""The graph-map op `typed_edge_map`: on the CPU (two counting passes, or a merge sort where the
targets far outnumber the edges) against a stable sort of the (relation, target) keys, and its
argument errors on either device (tests/graph/test_device_map.py compares the CUDA op with it)."""

import pytest
import torch

import relconv  # noqa: F401  (registers the ops)
from tests.conftest import DEVICES

OP = torch.ops.relconv.typed_edge_map.default


def _reference(src, dst, rel, num_dst, num_relations):
    key = rel.long() * num_dst + dst.long()
    key, perm = torch.sort(key, stable=True)
    rel_ptr = torch.searchsorted(key, torch.arange(num_relations + 1) * num_dst)
    _, runs = torch.unique_consecutive(key, return_counts=True)
    scale = torch.repeat_interleave(runs, runs).float().reciprocal()
    return src[perm], dst[perm], rel_ptr, scale, perm


def _graph(num_src, num_dst, num_edges, num_relations, seed, hubs=False):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_src, (num_edges,), generator=g)
    dst = torch.randint(0, 3 if hubs else num_dst, (num_edges,), generator=g)
    rel = torch.randint(0, num_relations, (num_edges,), generator=g)
    return src, dst, rel


@pytest.mark.parametrize(
    ("num_src", "num_dst", "num_edges", "num_relations", "hubs"),
    [
        (40, 50, 3000, 7, False),  # counting passes
        (1000, 1000, 20_000, 3, True),  # long runs into three targets
        (50, 2**30, 500, 9, False),  # far more targets than edges: the merge sort
        (1, 1, 10, 1, False),
    ],
)
@pytest.mark.parametrize(("src_dtype", "rel_dtype"), [(torch.int64, torch.int64), (torch.int32, torch.int32)])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_cpu_op_sorts_like_a_stable_key_sort(
    num_src, num_dst, num_edges, num_relations, hubs, src_dtype, rel_dtype, index_dtype
):
    src, dst, rel = _graph(num_src, min(num_dst, 10_000), num_edges, num_relations, seed=num_edges, hubs=hubs)
    src, dst, rel = src.to(src_dtype), dst.to(src_dtype), rel.to(rel_dtype)
    in_index, out_index, rel_ptr, scale, perm, error = OP(
        src, dst, rel, num_src, num_dst, num_relations, True, index_dtype
    )
    want = _reference(src, dst, rel, num_dst, num_relations)
    assert error == 0
    assert in_index.dtype == out_index.dtype == index_dtype and perm.dtype == torch.int32
    assert torch.equal(in_index.long(), want[0].long()) and torch.equal(out_index.long(), want[1].long())
    assert torch.equal(rel_ptr, want[2]) and torch.equal(scale, want[3])
    assert torch.equal(perm.long(), want[4])
    _, _, _, no_scale, _, _ = OP(src, dst, rel, num_src, num_dst, num_relations, False, index_dtype)
    assert no_scale.numel() == 0


def test_cpu_op_reports_values_out_of_range_in_its_error_word():
    src, dst, rel = _graph(10, 10, 100, 4, seed=1)
    assert OP(src, dst, rel, 10, 10, 4, True, torch.int32)[5] == 0
    rel[3], src[5], dst[7] = 4, -1, 10
    assert OP(src, dst, rel, 10, 10, 4, True, torch.int32)[5] == 1 | 2 | 4


def test_cpu_op_on_a_graph_without_edges():
    empty = torch.zeros(0, dtype=torch.long)
    in_index, _, rel_ptr, scale, perm, error = OP(empty, empty, empty, 0, 0, 3, True, torch.int64)
    assert in_index.numel() == scale.numel() == perm.numel() == 0 and error == 0
    assert rel_ptr.tolist() == [0, 0, 0, 0]


def _args(device):
    src, dst, rel = (t.to(device) for t in _graph(30, 30, 150, 5, seed=2))
    return dict(
        src=src,
        dst=dst,
        edge_type=rel,
        num_src=30,
        num_dst=30,
        num_relations=5,
        mean=True,
        index_dtype=torch.int32,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: {**a, "dst": a["dst"][:-1]}, "one entry per edge"),
        (lambda a: {**a, "src": a["src"].float()}, "int32 or int64 dtype"),
        (lambda a: {**a, "dst": a["dst"].int()}, "share an int32 or int64 dtype"),
        (lambda a: {**a, "src": a["src"].view(2, -1)}, "must be 1-D"),
        (lambda a: {**a, "num_relations": 0}, "num_relations must be positive"),
        (lambda a: {**a, "num_dst": -1}, "node counts must be non-negative"),
        (lambda a: {**a, "num_src": 0}, "needs source and target nodes"),
        (lambda a: {**a, "num_relations": 2**40, "num_dst": 2**40}, "overflows int64"),
        (lambda a: {**a, "index_dtype": torch.float32}, "index_dtype must be int32 or int64"),
        (lambda a: {**a, "num_dst": 2**31}, "int32 indices hold node ids below 2"),
    ],
    ids=[
        "lengths",
        "float src",
        "mixed dtypes",
        "2-D",
        "relations",
        "targets",
        "no nodes",
        "overflow",
        "dtype",
        "int32 ids",
    ],
)
def test_op_rejects_bad_arguments(device, change, match):
    with pytest.raises(ValueError, match=match):
        OP(**change(_args(device)))


@pytest.mark.cuda
def test_op_rejects_tensors_on_two_devices():
    args = _args("cuda")
    with pytest.raises(ValueError, match="on one device"):
        OP(**{**args, "src": args["src"].cpu()})
