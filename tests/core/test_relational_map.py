"""RelationalMap: sorting, CSR offsets, derived layouts, device moves."""

import copy
import pickle

import pytest
import torch

from relconv import RelationalMap
from relconv.core import index_dtype_for
from tests.conftest import DEVICES, cyclic_garbage


def _triples(seed=0, p=200, n_in=30, n_out=25, r=7):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, n_in, (p,), generator=g),
        torch.randint(0, n_out, (p,), generator=g),
        torch.randint(1, r, (p,), generator=g),  # relation 0 stays empty
    )


@pytest.mark.parametrize("device", DEVICES)
def test_from_triples_groups_by_relation_in_canonical_order(device):
    ii, oi, rel = _triples()
    scale = torch.arange(200, dtype=torch.float32)
    m = RelationalMap.from_triples(
        ii.to(device), oi.to(device), rel.to(device), 30, 25, 7, scale=scale.to(device)
    )
    assert m.num_relations == 7 and m.num_pairs == 200 and m.in_index.dtype == torch.int32
    ptr = m.rel_ptr.cpu()
    assert ptr[0] == 0 and ptr[1] == 0 and ptr[-1] == 200
    assert torch.equal(ptr.diff(), torch.bincount(rel, minlength=7))
    # Same multiset of triples, now sorted by (relation, out, in); scale followed its pair.
    got = torch.stack([m.relation_of_pairs().cpu(), m.out_index.cpu().long(), m.in_index.cpu().long()], 1)
    want = torch.stack([rel, oi, ii], 1)
    key = lambda t: (t[:, 0] * 25 + t[:, 1]) * 30 + t[:, 2]  # noqa: E731
    assert torch.equal(key(got), torch.sort(key(want)).values)
    order = torch.sort(key(want), stable=True).indices
    assert torch.equal(m.scale.cpu(), scale[order])


@pytest.mark.parametrize("device", DEVICES)
def test_transpose_swaps_roles_and_is_cached(device):
    m = RelationalMap.from_triples(*_triples(), 30, 25, 7).to(device)
    t = m.transpose()
    assert t.num_in == 25 and t.num_out == 30
    assert torch.equal(t.in_index, m.out_index) and torch.equal(t.out_index, m.in_index)
    assert t is m.transpose() and t.transpose() is m


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("injective", [False, True])
def test_a_map_and_its_transpose_go_without_the_cycle_collector(device, injective):
    # A map and its transpose must not keep each other alive: their tables are device memory.
    def build():
        if injective:
            table = torch.tensor([[0, -1], [2, 0], [-1, 1]], dtype=torch.int32, device=device)
            return RelationalMap.from_neighbor_table(table, 3, injective=True)
        return RelationalMap.from_triples(*_triples(), 30, 25, 7).to(device)

    assert cyclic_garbage(lambda: build().transpose()) == []
    # The transpose alone (its map gone) still transposes back, to an equal map.
    t = build().transpose()
    back, want = t.transpose(), build()
    assert back.transpose() is t
    assert (back.num_in, back.num_out) == (want.num_in, want.num_out)
    assert torch.equal(back.in_index, want.in_index) and torch.equal(back.out_index, want.out_index)
    assert torch.equal(back.rel_ptr, want.rel_ptr)


@pytest.mark.parametrize(
    "copy_map", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))], ids=["deepcopy", "pickle"]
)
def test_a_map_and_its_transpose_copy_and_pickle(copy_map):
    m = RelationalMap.from_triples(*_triples(), 30, 25, 7)
    t = m.transpose()
    m2, t2 = copy_map(m), copy_map(t)
    assert torch.equal(m2.in_index, m.in_index) and torch.equal(m2.transpose().in_index, t.in_index)
    assert m2.transpose().transpose() is m2
    # The copied transpose lost its weak link back and builds its map anew.
    back = t2.transpose()
    assert back is not m and torch.equal(back.in_index, m.in_index) and back.transpose() is t2


@pytest.mark.parametrize("device", DEVICES)
def test_neighbor_table(device):
    # A voxel-like map: each (out, relation) slot has at most one input.
    oi = torch.tensor([0, 1, 2, 0, 2])
    ii = torch.tensor([3, 4, 0, 1, 1])
    rel = torch.tensor([0, 0, 0, 1, 1])
    m = RelationalMap.from_triples(ii, oi, rel, 5, 3, 2).to(device)
    with pytest.raises(ValueError, match="unique_slots"):
        m.neighbor_table()
    m = RelationalMap(m.in_index, m.out_index, m.rel_ptr, 5, 3, unique_slots=True)
    table = m.neighbor_table()
    assert table.tolist() == [[3, 1], [4, -1], [0, 1]]
    assert m.neighbor_table() is table


def test_to_device_round_trip_and_index_dtype():
    m = RelationalMap.from_triples(*_triples(), 30, 25, 7, index_dtype=torch.int64)
    assert m.in_index.dtype == torch.int64
    assert m.to("cpu") is m
    assert index_dtype_for(10, 2**31 - 1) == torch.int32
    assert index_dtype_for(2**31) == torch.int64
    assert "num_relations=7" in repr(m)


def test_int32_cannot_address_beyond_2_31():
    with pytest.raises(ValueError, match="int32 indices cannot address"):
        RelationalMap(
            torch.zeros(0, dtype=torch.int32),
            torch.zeros(0, dtype=torch.int32),
            torch.tensor([0, 0]),
            2**31,
            4,
            validate=False,
        )


def _voxel_like_table():
    return torch.tensor([[3, 1], [4, -1], [0, 1]], dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
def test_map_from_table_materialises_pairs_lazily(device):
    table = _voxel_like_table().to(device)
    m = RelationalMap.from_neighbor_table(table, num_in=5)
    assert not m.has_pairs and m.unique_slots and m.neighbor_table() is table
    assert (m.num_in, m.num_out, m.num_relations, m.index_dtype) == (5, 3, 2, torch.int32)
    assert "not materialised" in repr(m)
    # Same pairs, same canonical (relation, out) order as the pair-built map.
    ref = RelationalMap.from_triples(
        torch.tensor([3, 4, 0, 1, 1]), torch.tensor([0, 1, 2, 0, 2]), torch.tensor([0, 0, 0, 1, 1]), 5, 3, 2
    )
    assert m.num_pairs == 5 and m.has_pairs
    assert m.in_index.tolist() == ref.in_index.tolist() and m.out_index.tolist() == ref.out_index.tolist()
    assert m.rel_ptr.tolist() == ref.rel_ptr.tolist() and m.in_index.dtype == torch.int32
    moved = RelationalMap.from_neighbor_table(table, 5).to("cpu")
    assert torch.equal(moved.neighbor_table().cpu(), table.cpu())


def test_map_from_table_checks_its_entries():
    with pytest.raises(ValueError, match="table values must lie in"):
        RelationalMap.from_neighbor_table(_voxel_like_table(), num_in=4)
    with pytest.raises(ValueError, match="table must be int32 or int64"):
        RelationalMap.from_neighbor_table(_voxel_like_table().float(), num_in=5)


def test_table_forward_on_cpu_uses_lazy_pairs():
    from relconv.ops import relational_conv

    m = RelationalMap.from_neighbor_table(_voxel_like_table(), num_in=5)
    x, w = torch.randn(5, 4, dtype=torch.float64), torch.randn(2, 4, 3, dtype=torch.float64)
    out = relational_conv(x, w, m)
    want = torch.stack([x[3] @ w[0] + x[1] @ w[1], x[4] @ w[0], x[0] @ w[0] + x[1] @ w[1]])
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("device", DEVICES)
def test_wrong_unique_slots_claim_raises(device):
    ii, oi, rel = torch.tensor([3, 4, 0]), torch.tensor([0, 0, 2]), torch.tensor([1, 1, 0])
    m = RelationalMap.from_triples(ii, oi, rel, 5, 3, 2).to(device)
    with pytest.raises(ValueError, match="unique_slots=True claims"):
        RelationalMap(m.in_index, m.out_index, m.rel_ptr, 5, 3, unique_slots=True)
    # The same slots under different relations are fine.
    ok = RelationalMap.from_triples(ii, oi, torch.tensor([0, 1, 0]), 5, 3, 2).to(device)
    assert RelationalMap(ok.in_index, ok.out_index, ok.rel_ptr, 5, 3, unique_slots=True).unique_slots


def test_from_triples_returns_its_permutation():
    ii, oi, rel = _triples(seed=3)
    m, perm = RelationalMap.from_triples(ii, oi, rel, 30, 25, 7, return_perm=True)
    assert perm.dtype == torch.int64 and sorted(perm.tolist()) == list(range(200))
    assert torch.equal(m.in_index.long(), ii[perm]) and torch.equal(m.out_index.long(), oi[perm])
    assert torch.equal(m.relation_of_pairs(), rel[perm])


def test_check_index_range_names_the_argument():
    from relconv.core import check_index_range

    check_index_range(("a", torch.tensor([0, 4]), 5), ("b", torch.zeros(0, dtype=torch.long), 0))
    with pytest.raises(ValueError, match=r"b values must lie in \[0, 3\), got \[-1, 2\]"):
        check_index_range(("a", torch.tensor([0, 4]), 5), ("b", torch.tensor([2, -1]), 3))


@pytest.mark.parametrize("device", DEVICES)
def test_check_index_range_reads_every_integer_dtype_exactly(device):
    from relconv.core import check_index_range

    int32 = torch.tensor([0, 2**31 - 1], dtype=torch.int32, device=device)
    int64 = torch.tensor([2**40, 3], device=device)
    uint8 = torch.tensor([255, 7], dtype=torch.uint8, device=device)
    check_index_range(("a", int32, 2**31), ("b", int64, 2**40 + 1), ("c", uint8, 256))
    # Each bound reaches its own check, past the int32 range where an index is int64.
    past = r"b values must lie in \[0, 1099511627776\), got \[3, 1099511627776\]"
    with pytest.raises(ValueError, match=past):
        check_index_range(("a", int32, 2**31), ("b", int64, 2**40), ("c", uint8, 256))
    with pytest.raises(ValueError, match=r"c values must lie in \[0, 255\), got \[7, 255\]"):
        check_index_range(("a", int32, 2**31), ("b", int64, 2**40 + 1), ("c", uint8, 255))
    with pytest.raises(ValueError, match=r"a values must lie in \[0, 2147483647\), got \[0, 2147483647\]"):
        check_index_range(("a", int32, 2**31 - 1))


def _permutation(r: int, seed: int) -> tuple[int, ...]:
    return tuple(torch.randperm(r, generator=torch.Generator().manual_seed(seed)).tolist())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("built_from", ["pairs", "table", "scaled pairs"])
def test_relabeled_map_runs_the_weight_in_its_order(device, built_from):
    """relation j of m.relabeled(order) is relation order[j] of m: W over it is W[argsort(order)]
    over m, forward and both gradients."""
    from relconv.ops import relational_conv

    ii, oi, rel = _triples(seed=3)
    if built_from == "table":
        table = torch.randint(-1, 30, (25, 7), generator=torch.Generator().manual_seed(4))
        m = RelationalMap.from_neighbor_table(table.to(device), 30)
    else:
        scale = torch.rand(200, dtype=torch.float64) if built_from == "scaled pairs" else None
        m = RelationalMap.from_triples(ii, oi, rel, 30, 25, 7, scale=scale).to(device)
    order = _permutation(7, 5)
    x = torch.randn(30, 6, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(7, 6, 4, dtype=torch.float64, device=device, requires_grad=True)
    relabeled = m.relabeled(order)
    got = relational_conv(x, w, relabeled)
    want = relational_conv(x, w[torch.argsort(torch.tensor(order, device=device))], m)
    torch.testing.assert_close(got, want)
    g = torch.randn_like(got)
    for a, b in zip(torch.autograd.grad(got, (x, w), g), torch.autograd.grad(want, (x, w), g), strict=True):
        torch.testing.assert_close(a, b)
    assert relabeled.num_relations == 7 and relabeled.num_pairs == m.num_pairs
    assert m.relabeled(list(order)) is relabeled  # cached per order
    assert m.relabeled(range(7)) is m


def test_relabeled_rejects_an_order_that_is_no_permutation():
    m = RelationalMap.from_triples(*_triples(), 30, 25, 7)
    for bad in ((0, 1, 2), (0, 1, 2, 3, 4, 5, 5), (1, 2, 3, 4, 5, 6, 7)):
        with pytest.raises(ValueError, match="order must be a permutation of the map's 7 relations"):
            m.relabeled(bad)
