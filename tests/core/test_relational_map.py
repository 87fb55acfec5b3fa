"""RelationalMap: sorting, CSR offsets, derived layouts, device moves."""

import pytest
import torch

from relconv import RelationalMap
from relconv.core import index_dtype_for
from tests.conftest import DEVICES


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
