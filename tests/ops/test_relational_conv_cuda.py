"""GPU-only properties: CPU parity, no host synchronisation, CUDA-graph capture."""

import pytest
import torch

from relconv import RelationalMap, _ext, relational_conv
from relconv.ops.map_views import table_order
from relconv.ops.planning import persistent_table_kernel
from relconv.ops.reference import relational_conv_reference
from relconv.ops.relational_conv import conv_call, prepare, run_conv
from tests.conftest import allow_tf32, cuda_kernels, no_host_sync
from tests.ops.maps import TF32_TOLERANCE, TOLERANCE, random_map, rel_error

pytestmark = pytest.mark.cuda
CONV = torch.ops.relconv.relational_conv.default


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
# (68, 132, 1): a K tail of half a slab and a ragged channel tile in the float4 kernel (C_out >= 64);
# (256, 256, 2): its grouped 128-wide tiles.
@pytest.mark.parametrize(
    "cin,cout,groups",
    [(16, 16, 1), (64, 64, 1), (32, 48, 4), (7, 5, 1), (128, 96, 1), (68, 132, 1), (256, 256, 2)],
)
def test_cpu_cuda_parity(dtype, cin, cout, groups):
    cpu_map = random_map(500, 400, 27, 6000, "cpu")
    gpu_map = cpu_map.to("cuda")
    x = torch.randn(500, cin, dtype=torch.float64).to(dtype)
    shape = (27, cin, cout) if groups == 1 else (27, groups, cin // groups, cout // groups)
    w = (torch.randn(shape, dtype=torch.float64) / cin**0.5).to(dtype)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    xg, wg = x.cuda().requires_grad_(), w.cuda().requires_grad_()
    out_c = relational_conv(xc, wc, cpu_map, groups=groups)
    out_g = relational_conv(xg, wg, gpu_map, groups=groups)
    assert rel_error(out_g, out_c) < TOLERANCE[dtype]
    grad = torch.randn_like(out_c)
    gxc, gwc = torch.autograd.grad(out_c, (xc, wc), grad)
    gxg, gwg = torch.autograd.grad(out_g, (xg, wg), grad.cuda())
    assert rel_error(gxg, gxc) < TOLERANCE[dtype]
    assert rel_error(gwg, gwc) < TOLERANCE[dtype]


def test_forward_and_backward_do_not_synchronise():
    rmap = random_map(1000, 900, 27, 20000, "cuda")
    x = torch.randn(1000, 32, device="cuda", requires_grad=True)
    w = torch.randn(27, 32, 32, device="cuda", requires_grad=True)
    with no_host_sync():
        out = relational_conv(x, w, rmap)
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    xr, wr = (t.detach().double().requires_grad_() for t in (x, w))
    ref = relational_conv_reference(xr, wr, rmap)
    ref.backward(torch.ones_like(ref))
    assert rel_error(out, ref) < TOLERANCE[torch.float32]
    assert rel_error(x.grad, xr.grad) < TOLERANCE[torch.float32]
    assert rel_error(w.grad, wr.grad) < TOLERANCE[torch.float32]


def test_forward_is_cuda_graph_capturable():
    rmap = random_map(800, 700, 27, 15000, "cuda")
    x = torch.randn(800, 64, device="cuda", dtype=torch.float16)
    w = torch.randn(27, 64, 64, device="cuda", dtype=torch.float16) / 8
    expected = relational_conv(x, w, rmap)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        relational_conv(x, w, rmap)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = relational_conv(x, w, rmap)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_error(captured, relational_conv(x, w, rmap)) < TOLERANCE[torch.float16]
    assert rel_error(captured, expected) > 0.1  # the replay really recomputed on the new input


def test_atomic_collisions_many_pairs_per_slot():
    # Graph-like: 50 inputs feed every (out, relation) slot, stressing the accumulation.
    n_out, fan_in = 64, 50
    oi = torch.arange(n_out).repeat_interleave(fan_in * 2)
    rel = torch.arange(2).repeat_interleave(fan_in).repeat(n_out)
    ii = torch.randint(0, 300, (oi.numel(),))
    cpu_map = RelationalMap.from_triples(ii, oi, rel, 300, n_out, 2)
    x = torch.randn(300, 40, dtype=torch.float32)
    w = torch.randn(2, 40, 24, dtype=torch.float32)
    ref = relational_conv(x, w, cpu_map)
    assert rel_error(relational_conv(x.cuda(), w.cuda(), cpu_map.to("cuda")), ref) < 1e-5


# ---------------------------------------------------------------------------- neighbour-table path
# Maps with at most one input per (output, relation) slot carry `unique_slots`; the CUDA forward
# then runs output-stationary over `rmap.neighbor_table()` (no atomics). The backward still runs the
# pair-list kernels, so the gradient checks cover the mix.
def unique_slot_map(
    num_in: int, num_out: int, num_relations: int, density: float, index_dtype: torch.dtype, seed: int = 0
) -> RelationalMap:
    """Random unique-slot map on CUDA: each (relation, output) slot holds one random input with
    probability `density`. Relation 0 is empty and relation 1 only feeds the first 10 outputs, so
    whole output tiles have no neighbour in some relations (the kernel's skip path)."""
    g = torch.Generator().manual_seed(seed)
    filled = torch.rand(num_relations, num_out, generator=g) < density
    filled[0] = False
    filled[1, 10:] = False
    relation, out = filled.nonzero(as_tuple=True)  # grouped by relation, sorted by output
    inp = torch.randint(0, num_in, (out.numel(),), generator=g)
    rel_ptr = torch.zeros(num_relations + 1, dtype=torch.int64)
    torch.cumsum(filled.sum(1), 0, out=rel_ptr[1:])
    rmap = RelationalMap(
        inp.to(index_dtype), out.to(index_dtype), rel_ptr, num_in, num_out, unique_slots=True
    )
    return rmap.to("cuda")


@pytest.fixture
def deterministic():
    """Deterministic mode routes every dtype of a unique-slot map through the neighbour table
    (fp32/fp64 otherwise take the faster atomic path). warn_only: the float64 reference's
    index_add_ has no deterministic CUDA implementation."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(False)


def grouped_weight(num_relations, groups, cin_g, cout_g, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    shape = (num_relations, cin_g, cout_g) if groups == 1 else (num_relations, groups, cin_g, cout_g)
    return (torch.randn(shape, generator=g, dtype=torch.float64) / cin_g**0.5).to("cuda", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("groups", [1, 2])
# Per-group channels: odd widths (scalar loads), 64 (16-byte / cp.async loads), 40 (vector loads
# with a partial last K chunk), 130 (two output-channel tiles, partial K chunk), 128 and 256 (the
# whole-tile 128 x 128 tensor-core configurations).
@pytest.mark.parametrize(
    "cin_g,cout_g", [(3, 17), (17, 3), (64, 64), (40, 24), (130, 130), (128, 128), (64, 256), (256, 256)]
)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_neighbor_table_forward_and_gradients(deterministic, dtype, index_dtype, groups, cin_g, cout_g):
    rmap = unique_slot_map(300, 333, 27, 0.3, index_dtype)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(300, groups * cin_g, generator=g, dtype=torch.float64).to("cuda", dtype)
    w = grouped_weight(27, groups, cin_g, cout_g, dtype)
    xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    out = relational_conv(xo, wo, rmap, groups=groups)
    ref = relational_conv_reference(xr, wr, rmap, groups=groups)
    assert out.dtype == dtype and out.shape == (333, groups * cout_g)
    assert rel_error(out, ref) < TOLERANCE[dtype]
    # Outputs without any neighbour are written as exact zeros (there is no zero-filled buffer).
    assert not out[rmap.neighbor_table().lt(0).all(1)].any()
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64).to("cuda")
    gxo, gwo = torch.autograd.grad(out, (xo, wo), grad.to(dtype))
    gxr, gwr = torch.autograd.grad(ref, (xr, wr), grad)
    assert rel_error(gxo, gxr) < TOLERANCE[dtype]
    assert rel_error(gwo, gwr) < TOLERANCE[dtype]


@pytest.mark.parametrize(
    ("dtype", "tf32"),
    [(torch.float32, False), (torch.float32, True), (torch.float16, False), (torch.bfloat16, False)],
    ids=["fp32", "tf32", "fp16", "bf16"],
)
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("num_relations", [27, 125])  # one relation chunk, and four with a ragged last
@pytest.mark.parametrize("cin_g", [1, 2, 4, 8, 16])  # rows of 2 to 64 bytes: packed where 4 to 32
@pytest.mark.parametrize("misaligned", [False, True], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("cout_g", [16, 32])  # the 16-column tile takes 128-byte K steps
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_small_input_channels_pack_relations(
    deterministic, dtype, tf32, groups, num_relations, cin_g, misaligned, cout_g
):
    """Stems' few input channels and C16: the table kernel packs several relations into one K step
    (x rows aligned to their 4, 8, 16 or 32 bytes), else pads one relation per step; both against
    float64."""
    rmap = unique_slot_map(400, 450, num_relations, 0.3, torch.int32)
    g = torch.Generator().manual_seed(5)
    x64 = torch.randn(400, groups * cin_g, generator=g, dtype=torch.float64)
    x = x64.to("cuda", dtype)
    if misaligned:  # one element into its storage: rows no longer start on their 4 to 32 bytes
        x = torch.empty(x.numel() + 1, dtype=dtype, device="cuda")[1:].view(x.shape).copy_(x)
    w = grouped_weight(num_relations, groups, cin_g, cout_g, dtype)
    with allow_tf32(tf32):
        out = relational_conv(x, w, rmap, groups=groups)
    ref = relational_conv_reference(x64.cuda(), w.double(), rmap, groups=groups)
    tolerance = TF32_TOLERANCE if tf32 else TOLERANCE[dtype]
    assert rel_error(out, ref) < tolerance
    assert not out[rmap.neighbor_table().lt(0).all(1)].any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_c16_tables_from_600k_rows_take_the_tall_tiles(deterministic, dtype):
    """C16 -> 16 on 600,005 output rows (kPacked16TallRows and a partial last 128-row tile) from
    650,000 input rows, with and without the table's order, and the input gradient over the
    transposed table: against float64."""
    num_in, num_out = 650_000, 600_005
    assert (
        _ext._C.kernel_choice(
            "table",
            str(dtype).split(".")[1],
            (9, 0),
            132,
            cin_g=16,
            cout_g=16,
            num_in=num_in,
            num_out=num_out,
            num_relations=27,
        )["config"]
        == "table_mma_packed_16_tall"
    )
    rmap = unique_slot_map(num_in, num_out, 27, 0.3, torch.int32)
    g = torch.Generator().manual_seed(11)
    x64 = torch.randn(num_in, 16, generator=g, dtype=torch.float64).cuda()
    w64 = grouped_weight(27, 1, 16, 16, torch.float64)
    x, w = x64.to(dtype).requires_grad_(), w64.to(dtype)
    table, pairs = rmap.neighbor_table(), rmap.kernel_pairs()
    plain = CONV(x.detach(), w, *pairs, None, num_out, table)
    assert torch.equal(CONV(x.detach(), w, *pairs, None, num_out, table, table_order(rmap)), plain)
    ref = relational_conv_reference(x64, w64, rmap)
    assert rel_error(plain, ref) < TOLERANCE[dtype]
    up = torch.randn(num_out, 16, generator=g, dtype=torch.float64).cuda()
    (gx,) = torch.autograd.grad(relational_conv(x, w, rmap), x, up.to(dtype))
    (gx_ref,) = torch.autograd.grad(relational_conv_reference(x64.requires_grad_(), w64, rmap), x64, up)
    assert rel_error(gx, gx_ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("num_relations", [3, 8, 9, 27])  # odd counts: one block of entries a tile
@pytest.mark.parametrize("num_out", [1, 63, 333])  # partial tiles; rows * R not a multiple of 4
@pytest.mark.parametrize("channels", [16, 64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_table_rows_as_they_are_through_an_order_or_in_its_sequence(
    deterministic, dtype, num_relations, num_out, channels, index_dtype
):
    """A table without an order, with one, and copied into its order's row sequence
    (sorted_tables): the same output, bit for bit, and against float64."""
    rmap = unique_slot_map(300, num_out, num_relations, 0.4, index_dtype)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(300, channels, generator=g, dtype=torch.float64).to("cuda", dtype)
    w = grouped_weight(num_relations, 1, channels, channels, dtype)
    table, pairs = rmap.neighbor_table(), rmap.kernel_pairs()
    order = table_order(rmap)
    plain = CONV(x, w, *pairs, None, num_out, table)
    assert torch.equal(CONV(x, w, *pairs, None, num_out, table, order), plain)
    in_order = table.index_select(0, order)
    assert torch.equal(CONV(x, w, *pairs, None, num_out, in_order, order, sorted_tables=True), plain)
    ref = relational_conv_reference(x.double(), w.double(), rmap)
    assert rel_error(plain, ref) < TOLERANCE[dtype]


def injective_map(n, num_relations, density, seed=0):
    """Map on n rows, injective per relation both ways: each relation's outputs take distinct inputs."""
    g = torch.Generator().manual_seed(seed)
    filled = torch.rand(num_relations, n, generator=g) < density
    outs = [row.nonzero().flatten() for row in filled]
    ins = [torch.randperm(n, generator=g)[: out.numel()] for out in outs]
    rel_ptr = torch.zeros(num_relations + 1, dtype=torch.int64)
    torch.cumsum(filled.sum(1), 0, out=rel_ptr[1:])
    return RelationalMap(torch.cat(ins).int(), torch.cat(outs).int(), rel_ptr, n, n, injective=True).to(
        "cuda"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_prepared_call_passes_the_tables_in_order(deterministic, dtype):
    """A prepared call sorts the map and passes copies of both tables in their orders' row
    sequence: forward and gradients equal to those of the unsorted call, bit for bit."""
    rmap = injective_map(2000, 27, 0.3)
    x = torch.randn(2000, 64, device="cuda").to(dtype).requires_grad_()
    w = grouped_weight(27, 1, 64, 64, dtype).requires_grad_()
    up = torch.randn(2000, 64, device="cuda").to(dtype)
    args, _ = conv_call(x, w, rmap)
    assert args.table_order is None and not args.sorted_tables
    run = prepare(args, rmap)
    assert "table_in_order" in rmap._cache and "transposed_table_in_order" in rmap._cache
    results = []
    for out in (run_conv((args, (x, w, None))), run(x, w, None)):
        results.append((out, *torch.autograd.grad(out, (x, w), up)))
    for a, b in zip(results[1], results[0], strict=True):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_prepared_call_for_the_persistent_kernel_keeps_the_tables_as_they_are(deterministic):
    """Where the persistent warp-specialised kernel runs (fp16, C_out 128, sm_90a), a prepared call
    passes the map's tables through their orders, with no copies; the same output as unprepared."""
    rmap = injective_map(60000, 27, 0.3)
    x = torch.randn(60000, 64, device="cuda").half()
    w = grouped_weight(27, 1, 64, 128, torch.float16)
    args, _ = conv_call(x, w, rmap)
    persistent = persistent_table_kernel(rmap, x, w, transposed=False)
    assert persistent == (torch.cuda.get_device_capability() == (9, 0))
    run = prepare(args, rmap)
    assert ("table_in_order" in rmap._cache) != persistent
    assert torch.equal(run(x, w, None), run_conv((args, (x, w, None))))
    kernels = cuda_kernels(lambda: run(x, w, None))
    assert any("conv_forward_table_ws" in k for k in kernels) == persistent


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_neighbor_table_forward_is_deterministic_and_matches_pair_lists(deterministic, dtype):
    rmap = unique_slot_map(4000, 5000, 27, 0.25, torch.int32)
    x = torch.randn(4000, 64, device="cuda").to(dtype)
    w = grouped_weight(27, 1, 64, 96, dtype)
    first = relational_conv(x, w, rmap)
    for _ in range(3):
        assert torch.equal(relational_conv(x, w, rmap), first)
    # The same pairs without the table take the atomic pair-list kernel.
    pairs = RelationalMap(rmap.in_index, rmap.out_index, rmap.rel_ptr, rmap.num_in, rmap.num_out)
    assert rel_error(first, relational_conv(x, w, pairs)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_neighbor_table_sparse_and_degenerate_maps(deterministic, dtype):
    # Strided/transposed-like density: most (tile, relation) steps are skipped.
    rmap = unique_slot_map(500, 700, 27, 0.02, torch.int64)
    x = torch.randn(500, 32, device="cuda").to(dtype)
    w = grouped_weight(27, 1, 32, 32, dtype)
    ref = relational_conv_reference(x.double(), w.double(), rmap)
    assert rel_error(relational_conv(x, w, rmap), ref) < TOLERANCE[dtype]
    # No pairs at all: zeros; no outputs: an empty result.
    empty = unique_slot_map(500, 700, 27, 0.0, torch.int32)
    out = relational_conv(x, w, empty)
    assert out.shape == (700, 32) and not out.any()
    none = unique_slot_map(500, 0, 27, 0.5, torch.int32)
    assert relational_conv(x, w, none).shape == (0, 32)
