"""The output order of the CUDA output-stationary kernel (RelationalMap.table_order): a permutation
that groups outputs by their occupied relations, and a schedule only, so the output is bitwise the
same with and without it."""

import pytest
import torch
from voxel_refs import random_voxels

from relconv.ops import Dataflow, relational_conv
from relconv.ops import map_views as views
from relconv.ops.reference import relational_conv_reference
from relconv.voxel import submanifold_map, voxelize
from relconv.voxel.synthetic import raycast_scan
from tests.conftest import allow_tf32
from tests.ops.maps import TF32_TOLERANCE

pytestmark = pytest.mark.cuda

_conv = torch.ops.relconv.relational_conv.default
_order = torch.ops.relconv.neighbor_table_order.default


def _map(index_dtype=torch.int32, n=3000, seed=3):
    x = random_voxels(n, 20, 8, batch=2, seed=seed).to("cuda")
    rmap = submanifold_map(x.coords, (3, 3, 3), (1, 1, 1), (1, 1, 1))
    if index_dtype == torch.int64:
        rmap = type(rmap).from_neighbor_table(rmap.neighbor_table().long(), rmap.num_in, validate=False)
    return rmap


def _masks(table):
    """Occupancy mask of each row over the first 31 relations (bit r = relation r)."""
    hit = (table[:, :31] >= 0).long()
    return (hit << torch.arange(hit.shape[1], device=hit.device)).sum(1)


def _reference_key(table):
    """The documented sort key: bit r of the mask moves to the number of relations used by more rows
    (or by as many, with a smaller index), and the word becomes its rank in the reflected Gray sequence."""
    hit = (table[:, :31] >= 0).long()
    counts = hit.sum(0)
    q = torch.arange(hit.shape[1], device=hit.device)
    before = (counts[None, :] > counts[:, None]) | (
        (counts[None, :] == counts[:, None]) & (q[None, :] < q[:, None])
    )
    word = (hit << before.sum(1)).sum(1)
    for shift in (1, 2, 4, 8, 16):
        word = word ^ (word >> shift)
    return word


def _busy_tiles(table, order, tile=64):
    """(tile, relation) steps the output-stationary kernel runs over `order`."""
    hit = table[order.long()] >= 0
    pad = (-hit.shape[0]) % tile
    return int(torch.cat([hit, hit.new_zeros(pad, hit.shape[1])]).view(-1, tile, hit.shape[1]).any(1).sum())


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_order_is_the_stable_sort_by_the_documented_key(index_dtype):
    rmap = _map(index_dtype)
    table, order = rmap.neighbor_table(), rmap.table_order()
    assert order.dtype == table.dtype and order.shape == (rmap.num_out,)
    expected = torch.sort(_reference_key(table), stable=True).indices
    assert torch.equal(order.long(), expected)
    # Rows with the same occupied relations stay contiguous: each mask is one run of the order.
    masks = _masks(table)[order.long()]
    runs = torch.unique_consecutive(masks)
    assert runs.numel() == torch.unique(masks).numel()
    assert rmap.table_order() is order  # cached


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("relations", [1, 5, 8, 27, 31, 40])
def test_order_of_any_table_matches_the_reference(index_dtype, relations):
    """Tables beyond voxel maps: relations with very different use, and more than the 31 key bits
    (relations 31 and up do not take part in the key)."""
    gen = torch.Generator().manual_seed(relations)
    use = torch.rand(relations, generator=gen)
    table = torch.where(torch.rand(4000, relations, generator=gen) < use, 7, -1).to("cuda", index_dtype)
    order = _order(table)
    assert order.dtype == index_dtype
    assert torch.equal(order.long(), torch.sort(_reference_key(table), stable=True).indices)


def test_order_ranks_relations_by_use_and_walks_masks_in_gray_order():
    """Relation 0 is used by 3 rows, relation 2 by 2, relation 1 by 1, so they take key bits 0, 1, 2;
    Gray order then places {0, 2} right after {0} (one relation apart), where a plain mask sort
    would put {1} there."""
    used = [{0}, {1}, {0, 2}, set(), {0}, {2}]
    table = torch.tensor([[5 if r in u else -1 for r in range(3)] for u in used], dtype=torch.int32)
    order = _order(table.cuda())
    assert order.tolist() == [3, 0, 4, 2, 5, 1]
    assert torch.sort(_masks(table), stable=True).indices.tolist() == [3, 0, 4, 1, 5, 2]


def test_order_cuts_tile_work_on_a_lidar_scan():
    """What the key is for: fewer (64-row tile, relation) steps than a plain sort by mask on a
    ray-cast scan (about 12% fewer on this one, 11-15% on the benchmark scenes)."""
    points, _ = raycast_scan(beams=32, seed=0, azimuth_steps=720)
    coords = voxelize(torch.from_numpy(points).cuda(), 0.1).tensor.coords
    table = submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1)).neighbor_table()
    plain = torch.sort(_masks(table), stable=True).indices
    assert _busy_tiles(table, _order(table)) <= 0.95 * _busy_tiles(table, plain)


def test_order_of_an_empty_table():
    for shape in ((0, 27), (6, 0)):
        table = torch.full(shape, -1, dtype=torch.int32, device="cuda")
        assert torch.equal(_order(table).long(), torch.arange(shape[0], device="cuda"))


@pytest.mark.parametrize("tf32", [False, True], ids=["", "tf32"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "channels",
    [
        (1, 16),
        (2, 16),
        (4, 32),
        (8, 16),
        (16, 16),
        (16, 32),
        (32, 32),
        (64, 64),
        (64, 128),
        (24, 40),
        (96, 72),
    ],
)
def test_output_does_not_depend_on_the_order(dtype, channels, tf32):
    """Stems (1-8 input channels) and C16 pack several relations into a K step; which ones share a
    step depends on the tile's rows, so on the order, and the sum must not."""
    if tf32 and dtype != torch.float32:
        pytest.skip("TF32 is a mode of fp32")
    with allow_tf32(tf32):
        _check_order_invariance(dtype, channels)


def _check_order_invariance(dtype, channels):
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
    tolerance = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5}[dtype]
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        tolerance = TF32_TOLERANCE
    assert err < tolerance


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels", [(64, 64), (128, 48)])
def test_tall_tiles_of_large_tables_match_the_reference(dtype, channels):
    """Tables of at least 100k rows take 128-row tiles at C_out <= 64 (kTallTileRows)."""
    cin, cout = channels
    coords = random_voxels(130000, 64, 1, batch=2, seed=5).coords.to("cuda")
    rmap = submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1))
    assert rmap.num_out >= 100000
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rmap.num_in, cin, generator=gen).to("cuda", dtype)
    w = (torch.randn(27, 1, cin, cout, generator=gen) / (27 * cin) ** 0.5).to("cuda", dtype)
    table = rmap.neighbor_table()
    none = torch.empty(0, dtype=table.dtype, device="cuda")
    ptr = torch.empty(0, dtype=torch.int64, device="cuda")
    plain = _conv(x, w, none, none, ptr, None, rmap.num_out, table, None)
    assert torch.equal(plain, _conv(x, w, none, none, ptr, None, rmap.num_out, table, rmap.table_order()))
    ref = relational_conv_reference(x.double(), w.double(), rmap)
    err = (plain.double() - ref).abs().max() / ref.abs().max()
    assert err < {torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]


def test_public_op_uses_the_order_and_matches_fetch_on_demand(monkeypatch):
    rmap = _map(n=5000, seed=9)
    x = torch.randn(rmap.num_in, 64, device="cuda", dtype=torch.float16)
    w = torch.randn(27, 64, 64, device="cuda", dtype=torch.float16) / 40
    monkeypatch.setattr(
        views, "SORT_WORK", 2 * views.table_work(rmap.num_out, w)
    )  # sorted by the second call
    first = relational_conv(x, w, rmap, dataflow=Dataflow.OUTPUT_STATIONARY)
    assert "table_order" not in rmap._cache
    table_out = relational_conv(x, w, rmap, dataflow=Dataflow.OUTPUT_STATIONARY)
    assert "table_order" in rmap._cache
    assert torch.equal(first, table_out)
    pairs_out = relational_conv(x, w, rmap, dataflow=Dataflow.FETCH_ON_DEMAND)
    torch.testing.assert_close(table_out.float(), pairs_out.float(), rtol=2e-3, atol=2e-3)


def test_a_map_is_sorted_once_its_layers_work_adds_up(monkeypatch):
    """table_work against SORT_WORK: a table feeding enough work is sorted by its first forward (and
    the transposed table by the first input gradient); a smaller one once its forwards add up to it;
    the result is the same as unsorted."""
    rmap, small = _map(n=5000, seed=9), _map(n=5000, seed=9)
    x = torch.randn(rmap.num_in, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    w = torch.randn(27, 64, 64, device="cuda", dtype=torch.float16) / 40
    unsorted = relational_conv(x, w, small, dataflow=Dataflow.OUTPUT_STATIONARY)
    assert "table_order" not in small._cache and "transposed_table_order" not in small._cache
    work = views.table_work(rmap.num_out, w)
    monkeypatch.setattr(views, "SORT_WORK", work)
    out = relational_conv(x, w, rmap, dataflow=Dataflow.OUTPUT_STATIONARY)
    assert "table_order" in rmap._cache and "transposed_table_order" in rmap._cache
    assert torch.equal(out, unsorted)
    monkeypatch.setattr(views, "SORT_WORK", 2.5 * work)
    again = _map(n=5000, seed=9)
    for _ in range(2):
        relational_conv(x.detach(), w, again, dataflow=Dataflow.OUTPUT_STATIONARY)
    assert "table_order" not in again._cache
    assert torch.equal(relational_conv(x.detach(), w, again, dataflow=Dataflow.OUTPUT_STATIONARY), unsorted)
    assert "table_order" in again._cache


@pytest.mark.parametrize("tf32", [False, True])
def test_exact_fp32_work_weighs_more_towards_the_sort(monkeypatch, tf32):
    """Exact fp32 runs on CUDA cores, so its table work counts EXACT_SORT_WEIGHT times: a map whose
    first exact forward does a quarter of SORT_WORK is sorted by it; in TF32 it is not."""
    rmap, plain = _map(n=5000, seed=4), _map(n=5000, seed=4)
    x = torch.randn(rmap.num_in, 32, device="cuda")
    w = torch.randn(27, 32, 32, device="cuda") / 30
    assert views.EXACT_SORT_WEIGHT >= 4
    monkeypatch.setattr(views, "SORT_WORK", 4 * views.table_work(rmap.num_out, w))
    with allow_tf32(tf32):
        out = relational_conv(x, w, rmap, dataflow=Dataflow.OUTPUT_STATIONARY)
        assert ("table_order" in rmap._cache) is not tf32
        monkeypatch.setattr(views, "SORT_WORK", float("inf"))
        unsorted = relational_conv(x, w, plain, dataflow=Dataflow.OUTPUT_STATIONARY)
    assert "table_order" not in plain._cache
    assert torch.equal(out, unsorted)


def test_order_out_of_range_entries_are_skipped_not_written():
    """A malformed order never writes outside the output: its entries out of range are skipped and
    every row it lists in range comes out as under the valid order (an out-of-bounds write would
    surface at the synchronize, and under compute-sanitizer)."""
    rmap = _map()
    x = torch.randn(rmap.num_in, 16, device="cuda", dtype=torch.float16)
    w = torch.randn(27, 1, 16, 16, device="cuda", dtype=torch.float16)
    table, order = rmap.neighbor_table(), rmap.table_order()
    bad = order.clone()
    bad[0], bad[rmap.num_out // 2], bad[-1] = -5, 1 << 30, rmap.num_out
    none = torch.empty(0, dtype=table.dtype, device="cuda")
    ptr = torch.empty(0, dtype=torch.int64, device="cuda")
    ref = _conv(x, w, none, none, ptr, None, rmap.num_out, table, order)
    out = _conv(x, w, none, none, ptr, None, rmap.num_out, table, bad)
    torch.cuda.synchronize()
    listed = bad[(bad >= 0) & (bad < rmap.num_out)].long()
    assert listed.numel() == rmap.num_out - 3
    assert torch.equal(out[listed], ref[listed])


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
