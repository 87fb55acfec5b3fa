"""RelationalMap's `injective` flag (one input per (output, relation) AND one output per
(input, relation)) and the transposed neighbour table it allows."""

import pytest
import torch

from relconv import RelationalMap
from relconv.voxel import generative_map, strided_map, submanifold_map, transposed_map
from tests.conftest import DEVICES


def _injective_table():
    """[num_out = 3, R = 2] over 5 inputs; no input twice in a column."""
    return torch.tensor([[3, 1], [4, -1], [0, 2]], dtype=torch.int32)


def _slot_unique_table():
    """Unique slots, but input 1 feeds outputs 0 and 2 in relation 1: not injective."""
    return torch.tensor([[3, 1], [4, -1], [0, 1]], dtype=torch.int32)


def _triples_of(m):
    return zip(m.in_index.tolist(), m.out_index.tolist(), m.relation_of_pairs().tolist(), strict=True)


# The transposed table of _injective_table: the output each input feeds per relation.
TRANSPOSED = [[2, -1], [-1, 0], [-1, 2], [0, -1], [1, -1]]


@pytest.mark.parametrize("device", DEVICES)
def test_flag_implies_unique_slots_and_survives_moves(device):
    m = RelationalMap.from_neighbor_table(_injective_table().to(device), 5, injective=True)
    assert m.injective and m.unique_slots
    assert not RelationalMap.from_neighbor_table(_injective_table().to(device), 5).injective
    other = "cpu" if device == "cuda" else device
    assert m.to(other).injective
    paired = RelationalMap(m.in_index, m.out_index, m.rel_ptr, 5, 3, injective=True)
    assert paired.injective and paired.unique_slots and paired.to(other).injective
    assert paired.with_scale(None).injective


@pytest.mark.parametrize("device", DEVICES)
def test_injective_claim_is_validated(device):
    table = _slot_unique_table().to(device)
    with pytest.raises(ValueError, match="injective=True claims"):
        RelationalMap.from_neighbor_table(table, 5, injective=True)
    # Empty slots (-1) repeat freely; validate=False trusts the caller.
    RelationalMap.from_neighbor_table(
        torch.full((4, 2), -1, dtype=torch.int32, device=device), 5, injective=True
    )
    assert RelationalMap.from_neighbor_table(table, 5, validate=False, injective=True).injective
    m = RelationalMap.from_neighbor_table(table, 5)
    with pytest.raises(ValueError, match="injective=True claims"):
        RelationalMap(m.in_index, m.out_index, m.rel_ptr, 5, 3, injective=True)
    # The same input under different relations is fine.
    ok = RelationalMap.from_neighbor_table(_injective_table().to(device), 5)
    assert RelationalMap(ok.in_index, ok.out_index, ok.rel_ptr, 5, 3, injective=True).injective


@pytest.mark.parametrize("device", DEVICES)
def test_transposed_neighbor_table(device):
    m = RelationalMap.from_neighbor_table(_injective_table().to(device), 5, injective=True)
    t = m.transposed_neighbor_table()
    assert t.dtype == torch.int32 and t.device.type == device and t.tolist() == TRANSPOSED
    assert m.transposed_neighbor_table() is t
    for not_injective in (
        RelationalMap.from_neighbor_table(_slot_unique_table().to(device), 5),
        RelationalMap.from_neighbor_table(_injective_table().to(device), 5),
    ):
        with pytest.raises(ValueError, match="injective"):
            not_injective.transposed_neighbor_table()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("built_from", ["table", "pairs"])
def test_transpose_of_an_injective_map_is_injective_and_shares_tables(device, built_from):
    m = RelationalMap.from_neighbor_table(_injective_table().to(device), 5, injective=True)
    if built_from == "pairs":
        m = RelationalMap(m.in_index, m.out_index, m.rel_ptr, 5, 3, injective=True)
    t = m.transpose()
    assert t.injective and t.unique_slots and (t.num_in, t.num_out) == (3, 5)
    assert t.neighbor_table().tolist() == TRANSPOSED
    assert torch.equal(t.transposed_neighbor_table(), m.neighbor_table())
    swapped = {(o, i, r) for i, o, r in _triples_of(m)}
    got = set(_triples_of(t))
    assert got == swapped and t.transpose() is m
    # A map that repeats an input within a relation has no unique slots once transposed.
    plain = RelationalMap.from_neighbor_table(_slot_unique_table().to(device), 5).transpose()
    assert not plain.unique_slots and not plain.injective


@pytest.mark.cuda
def test_transposed_table_order_from_the_second_use_on():
    m = RelationalMap.from_neighbor_table(_injective_table().cuda(), 5, injective=True)
    assert m.transposed_table_order() is None
    order = m.transposed_table_order()
    assert order.dtype == torch.int32 and sorted(order.tolist()) == list(range(5))
    assert m.transposed_table_order() is order


@pytest.mark.parametrize("device", DEVICES)
def test_voxel_builders_flag_their_maps_injective(device):
    g = torch.Generator().manual_seed(0)
    coords = torch.randint(0, 6, (150, 4), generator=g)
    coords[:, 0] = coords[:, 0] % 2  # two batches
    coords = torch.unique(coords, dim=0).int().to(device)
    one = (1, 1, 1)
    sub = submanifold_map(coords, (3, 3, 3), one, one)
    down, coarse = strided_map(coords, (3, 3, 3), (2, 2, 2), one, one)
    up = transposed_map(down)
    gen, _ = generative_map(coarse, (2, 2, 2), (2, 2, 2), one, (2, 2, 2))
    for m in (sub, down, up, gen):
        assert m.injective and m.unique_slots
        # The claim holds on the data: validation of the same pairs with the flag passes.
        RelationalMap(m.in_index, m.out_index, m.rel_ptr, m.num_in, m.num_out, injective=True)
    assert up is down.transpose()
    assert torch.equal(up.neighbor_table(), down.transposed_neighbor_table())
