"""The output order of the CUDA output-stationary kernel (RelationalMap.table_order): a permutation
that groups outputs by their occupied relations, and a schedule only, so the output is bitwise the
same with and without it."""

import pytest
import torch
from voxel_markers import requires_cuda
from voxel_refs import random_voxels

from relconv.ops import Dataflow, relational_conv
from relconv.ops.reference import relational_conv_reference
from relconv.voxel import submanifold_map

pytestmark = requires_cuda

_conv = torch.ops.relconv.relational_conv.default


def _map(index_dtype=torch.int32, n=3000, seed=3):
    x = random_voxels(n, 20, 8, batch=2, seed=seed).to("cuda")
    rmap = submanifold_map(x.coords, (3, 3, 3), (1, 1, 1), (1, 1, 1))
    if index_dtype == torch.int64:
        rmap = type(rmap).from_neighbor_table(rmap.neighbor_table().long(), rmap.num_in, validate=False)
    return rmap


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_order_is_a_permutation_sorted_by_occupancy(index_dtype):
    rmap = _map(index_dtype)
    table, order = rmap.neighbor_table(), rmap.table_order()
    assert order.dtype == table.dtype and order.shape == (rmap.num_out,)
    assert torch.equal(order.sort().values.long(), torch.arange(rmap.num_out, device="cuda"))
    bits = (table >= 0).long() << torch.arange(table.shape[1], device="cuda")
    keys = bits.sum(1)[order.long()]
    assert bool((keys[1:] >= keys[:-1]).all())
    assert rmap.table_order() is order  # cached


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels", [(8, 16), (32, 32), (64, 64), (64, 128), (24, 40), (96, 72)])
def test_output_does_not_depend_on_the_order(dtype, channels):
    cin, cout = channels
    rmap = _map()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rmap.num_in, cin, generator=gen).to("cuda", dtype)
    w = (torch.randn(27, 1, cin, cout, generator=gen) / (27 * cin) ** 0.5).to("cuda", dtype)
    table, order = rmap.neighbor_table(), rmap.table_order()
    none = torch.empty(0, dtype=table.dtype, device="cuda")
    ptr = torch.empty(0, dtype=torch.int64, device="cuda")
    plain = _conv(x, w, none, none, ptr, None, rmap.num_out, table, None)
    ordered = _conv(x, w, none, none, ptr, None, rmap.num_out, table, order)
    assert torch.equal(plain, ordered)
    ref = relational_conv_reference(x.double(), w.double(), rmap)
    err = (ordered.double() - ref).abs().max() / ref.abs().max()
    assert err < {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5}[dtype]


def test_public_op_uses_the_order_and_matches_fetch_on_demand():
    rmap = _map(n=5000, seed=9)
    x = torch.randn(rmap.num_in, 64, device="cuda", dtype=torch.float16)
    w = torch.randn(27, 64, 64, device="cuda", dtype=torch.float16) / 40
    first = relational_conv(x, w, rmap, dataflow=Dataflow.OUTPUT_STATIONARY)
    assert "table_order" not in rmap._cache  # a map used once is not sorted
    table_out = relational_conv(x, w, rmap, dataflow=Dataflow.OUTPUT_STATIONARY)
    assert "table_order" in rmap._cache
    assert torch.equal(first, table_out)
    pairs_out = relational_conv(x, w, rmap, dataflow=Dataflow.FETCH_ON_DEMAND)
    torch.testing.assert_close(table_out.float(), pairs_out.float(), rtol=2e-3, atol=2e-3)


def test_order_out_of_range_entries_are_skipped_not_written():
    """A malformed order must never write outside the output (entries out of range are skipped)."""
    rmap = _map()
    x = torch.randn(rmap.num_in, 16, device="cuda", dtype=torch.float16)
    w = torch.randn(27, 1, 16, 16, device="cuda", dtype=torch.float16)
    table = rmap.neighbor_table()
    bad = torch.full((rmap.num_out,), 1 << 30, dtype=table.dtype, device="cuda")
    bad[0] = -5
    none = torch.empty(0, dtype=table.dtype, device="cuda")
    ptr = torch.empty(0, dtype=torch.int64, device="cuda")
    _conv(x, w, none, none, ptr, None, rmap.num_out, table, bad)
    torch.cuda.synchronize()  # an out-of-bounds write would surface here (and under compute-sanitizer)


def test_order_shape_and_dtype_are_checked():
    rmap = _map()
    x = torch.randn(rmap.num_in, 16, device="cuda", dtype=torch.float16)
    w = torch.randn(27, 1, 16, 16, device="cuda", dtype=torch.float16)
    table = rmap.neighbor_table()
    none = torch.empty(0, dtype=table.dtype, device="cuda")
    ptr = torch.empty(0, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="table_order must have shape"):
        _conv(x, w, none, none, ptr, None, rmap.num_out, table, rmap.table_order()[:-1])
    with pytest.raises(ValueError, match="table_order dtype"):
        _conv(x, w, none, none, ptr, None, rmap.num_out, table, rmap.table_order().long())
    with pytest.raises(ValueError, match="table_order needs a neighbor_table"):
        _conv(x, w, rmap.in_index, rmap.out_index, rmap.rel_ptr, None, rmap.num_out, None, rmap.table_order())
