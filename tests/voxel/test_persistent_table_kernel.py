"""The warp-specialized persistent wgmma table kernel (csrc/cuda/conv_forward_table_ws.cuh), which
takes fp16 / bf16 layers with C_in_g a multiple of 64 and C_out_g of 128 on tables of any size large
enough to fill the GPU without a relation split (the 3000-row tables of test_wide_table_kernel stay
on the split kernel, C_out_g 64 on the mma.sync one).
Checked against the float64 reference with the epilogue, groups, both column-tile widths, the
schedule order, many relation chunks, tiles without a neighbour and the input gradient; on other
GPUs the same tests cover the mma.sync kernel that takes these shapes there."""

import pytest
import torch
from voxel_refs import random_voxels

from relconv.ops import relational_conv
from relconv.ops.reference import relational_conv_reference
from relconv.voxel import submanifold_map
from tests.conftest import cuda_kernels

pytestmark = pytest.mark.cuda

_conv = torch.ops.relconv.relational_conv.default
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _map(kernel=3, seed=3, points=60000, extent=60):
    # ~50k rows: 400 row tiles of 128, past the point where the launcher splits tiles over CTAs.
    coords = random_voxels(points, extent, 4, seed=seed).coords.to("cuda")
    return submanifold_map(coords, (kernel,) * 3, (1, 1, 1), (1, 1, 1))


def _inputs(rmap, groups, cin, cout, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rmap.num_in, cin, generator=gen).to("cuda", dtype)
    w = torch.randn(rmap.num_relations, groups, cin // groups, cout // groups, generator=gen)
    w = (w / (rmap.num_relations * cin) ** 0.5).to("cuda", dtype)
    bias = (torch.randn(cout, generator=gen) / 4).to("cuda", dtype)
    return x, w, bias


def _run(x, w, table, order, bias, num_out, sorted_tables=False):
    none = torch.empty(0, dtype=table.dtype, device="cuda")
    ptr = torch.empty(0, dtype=torch.int64, device="cuda")
    return _conv(x, w, none, none, ptr, None, num_out, table, order, bias, True, sorted_tables=sorted_tables)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("groups, cin, cout", [(1, 64, 64), (1, 128, 128), (1, 64, 256), (2, 128, 256)])
def test_large_tables_match_the_reference(dtype, groups, cin, cout):
    rmap = _map()
    assert rmap.num_out % 128  # a partial last tile
    x, w, bias = _inputs(rmap, groups, cin, cout, dtype)
    table = rmap.neighbor_table()
    plain = _run(x, w, table, None, bias, rmap.num_out)
    # A schedule only: every output row sums the same relations in the same order either way.
    order = rmap.table_order()
    assert torch.equal(plain, _run(x, w, table, order, bias, rmap.num_out))
    # The table copied into the order's row sequence: tile rows read their table rows by position.
    in_order = table.index_select(0, order)
    assert torch.equal(plain, _run(x, w, in_order, order, bias, rmap.num_out, sorted_tables=True))
    ref = (relational_conv_reference(x.double(), w.double(), rmap, groups) + bias.double()).relu()
    assert (plain.double() - ref).abs().max() / ref.abs().max() < TOLERANCE[dtype]
    if torch.cuda.get_device_capability() == (9, 0):
        kernels = cuda_kernels(lambda: _run(x, w, table, None, bias, rmap.num_out))
        assert any("conv_forward_table_ws" in k for k in kernels) == ((cout // groups) % 128 == 0)


@pytest.mark.parametrize("cout", [128, 256])
def test_tables_past_100k_rows_match_the_reference(cout):
    """~181k rows: the persistent kernel also takes the tables the single-role one leaves to mma.sync."""
    rmap = _map(seed=7, points=200000, extent=100)
    assert rmap.num_out > 100000
    x, w, bias = _inputs(rmap, 1, 64, cout, torch.float16, seed=4)
    table, order = rmap.neighbor_table(), rmap.table_order()
    got = _run(x, w, table, order, bias, rmap.num_out)
    in_order = table.index_select(0, order)
    assert torch.equal(got, _run(x, w, in_order, order, bias, rmap.num_out, sorted_tables=True))
    ref = (relational_conv_reference(x.double(), w.double(), rmap) + bias.double()).relu()
    assert (got.double() - ref).abs().max() / ref.abs().max() < TOLERANCE[torch.float16]
    if torch.cuda.get_device_capability() == (9, 0):
        kernels = cuda_kernels(lambda: _run(x, w, rmap.neighbor_table(), None, bias, rmap.num_out))
        assert any("conv_forward_table_ws" in k for k in kernels)


def test_many_relation_chunks_and_tiles_without_neighbours():
    """5^3 = 125 relations (four chunks of 32 table columns), and the first 300 rows emptied: two
    whole tiles with no step at all and a third partly empty. Empty rows get the epilogue of zero."""
    rmap = _map(kernel=5, seed=4)
    x, w, bias = _inputs(rmap, 1, 64, 128, torch.float16, seed=1)
    table = rmap.neighbor_table().clone()
    table[:300] = -1
    got = _run(x, w, table, None, bias, rmap.num_out).double()
    ref = (relational_conv_reference(x.double(), w.double(), rmap) + bias.double()).relu()
    ref[:300] = bias.double().relu()
    assert torch.equal(got[:300], ref[:300])
    assert (got - ref).abs().max() / ref.abs().max() < TOLERANCE[torch.float16]


@pytest.mark.parametrize("c", [64, 128, 256])
def test_input_gradient_of_a_large_layer_matches_the_reference(c):
    """The input gradient runs the same kernel over the transposed table, reading W^T as stored."""
    rmap = _map(seed=5)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(rmap.num_in, c, generator=gen).to("cuda", torch.float16).requires_grad_()
    w = (torch.randn(27, c, c, generator=gen) / (27 * c) ** 0.5).to("cuda", torch.float16).requires_grad_()
    up = torch.randn(rmap.num_out, c, generator=gen).to("cuda", torch.float16)
    relational_conv(x, w, rmap).backward(up)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    relational_conv_reference(xd, wd, rmap).backward(up.double())
    assert (x.grad.double() - xd.grad).abs().max() / xd.grad.abs().max() < TOLERANCE[torch.float16]


def test_work_counters_reset_across_launches_streams_and_graphs():
    """CTAs draw their tiles from a per-stream counter that each launch leaves zeroed: repeated
    launches, a second stream and replays of a captured graph (whose counter is made per launch)
    all compute every tile, the same bits each time."""
    rmap = _map(seed=6)
    x, w, bias = _inputs(rmap, 1, 128, 128, torch.float16, seed=3)
    table, order = rmap.neighbor_table(), rmap.table_order()
    first = _run(x, w, table, order, bias, rmap.num_out)
    for _ in range(3):
        assert torch.equal(_run(x, w, table, order, bias, rmap.num_out), first)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        runs = [_run(x, w, table, order, bias, rmap.num_out) for _ in range(2)]
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(r, first) for r in runs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _run(x, w, table, order, bias, rmap.num_out)
    for _ in range(2):
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, first)
    assert torch.equal(_run(x, w, table, order, bias, rmap.num_out), first)
