"""CUDA kernel-map engine against the torch reference (CPU) maps, compared in coordinate space."""

import pytest
import torch

from relconv.ops import coord_ops, relational_conv
from relconv.voxel import Conv3d, VoxelTensor
from relconv.voxel import kernel_map as km
from relconv.voxel.kernel_map import layer_map
from tests.conftest import no_host_sync

pytestmark = pytest.mark.cuda


def scene(n=2000, size=12, batch=2, stride=1, seed=0):
    """Distinct int32 coordinates around the origin (negative ones included), shuffled rows."""
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, batch, (n,), generator=g)
    xyz = torch.randint(-size, size, (n, 3), generator=g) * stride
    coords = torch.unique(torch.cat([b[:, None], xyz], 1), dim=0)
    return coords[torch.randperm(coords.shape[0], generator=g)].int()


def coord_triples(rmap, in_coords, out_coords):
    """{(input coordinate, output coordinate, offset)}: independent of row order."""
    rmap = rmap.to("cpu")
    ci, co = in_coords.cpu().tolist(), out_coords.cpu().tolist()
    rel = rmap.relation_of_pairs().tolist()
    pairs = zip(rmap.in_index.tolist(), rmap.out_index.tolist(), rel, strict=True)
    return {(tuple(ci[i]), tuple(co[o]), r) for i, o, r in pairs}


KERNELS = [(3, 3, 3), (2, 2, 2), (5, 1, 3), (4, 3, 2)]
GEOMETRY = [((1, 1, 1), 1), ((2, 1, 3), 1), ((1, 1, 1), 2)]  # (dilation, tensor stride)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dilation,ts", GEOMETRY)
def test_submanifold_matches_reference(kernel, dilation, ts):
    coords = scene(stride=ts)
    t3 = (ts, ts, ts)
    ref = km.submanifold_map(coords, kernel, dilation, t3)
    got = km.submanifold_map(coords.cuda(), kernel, dilation, t3)
    assert got.unique_slots and got.num_in == got.num_out == coords.shape[0]
    assert not got.has_pairs  # built as a table; pairs come on demand
    assert torch.equal(got.neighbor_table().cpu().long(), ref.neighbor_table().long())
    assert coord_triples(got, coords, coords) == coord_triples(ref, coords, coords)
    assert got.num_pairs == ref.num_pairs and torch.equal(got.rel_ptr.cpu(), ref.rel_ptr)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("stride", [2, 3])
@pytest.mark.parametrize("dilation,ts", GEOMETRY)
def test_strided_matches_reference(kernel, stride, dilation, ts):
    coords = scene(stride=ts, seed=stride)
    s3, t3 = (stride,) * 3, (ts, ts, ts)
    ref, ref_out = km.strided_map(coords, kernel, s3, dilation, t3)
    got, got_out = km.strided_map(coords.cuda(), kernel, s3, dilation, t3)
    assert got_out.dtype == torch.int32 and got_out.shape == ref_out.shape
    assert set(map(tuple, got_out.cpu().tolist())) == set(map(tuple, ref_out.tolist()))
    # Output order is the first occurrence of each coarse site in input row order.
    step = torch.tensor([1, stride * ts, stride * ts, stride * ts])
    coarse = torch.div(coords.long(), step, rounding_mode="floor") * step
    first = []
    seen = set()
    for row in map(tuple, coarse.tolist()):
        if row not in seen:
            seen.add(row)
            first.append(row)
    assert got_out.cpu().tolist() == [list(r) for r in first]
    assert coord_triples(got, coords, got_out) == coord_triples(ref, coords, ref_out)
    # Given the output coordinates, the map is the same (and no coarse step runs).
    again, same_out = km.strided_map(coords.cuda(), kernel, s3, dilation, t3, out_coords=got_out)
    assert same_out is got_out and torch.equal(again.neighbor_table(), got.neighbor_table())


@pytest.mark.parametrize("kernel", [(2, 2, 2), (3, 3, 3)])
def test_transposed_table_is_the_transposed_pair_set(kernel):
    coords = scene(seed=5)
    fwd, out = km.strided_map(coords.cuda(), kernel, (2, 2, 2), (1, 1, 1), (1, 1, 1))
    tr = km.transposed_map(fwd)
    assert tr.unique_slots and not tr.has_pairs and (tr.num_in, tr.num_out) == (fwd.num_out, fwd.num_in)
    want = {(o, i, r) for i, o, r in coord_triples(fwd, coords, out)}
    assert coord_triples(tr, out, coords) == want
    expected = torch.full((fwd.num_in, fwd.num_relations), -1, dtype=torch.int64)
    fwd_cpu = fwd.to("cpu")
    expected[fwd_cpu.in_index.long(), fwd_cpu.relation_of_pairs()] = fwd_cpu.out_index.long()
    assert torch.equal(tr.neighbor_table().cpu().long(), expected)


@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_single_voxel(n):
    coords = torch.tensor([[0, -3, 4, 7]], dtype=torch.int32)[:n]
    sub = km.submanifold_map(coords.cuda(), (3, 3, 3), (1, 1, 1), (1, 1, 1))
    assert sub.neighbor_table().shape == (n, 27) and sub.num_pairs == n
    down, out = km.strided_map(coords.cuda(), (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    ref, ref_out = km.strided_map(coords, (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    assert torch.equal(out.cpu(), ref_out) and down.num_pairs == ref.num_pairs == n
    assert km.transposed_map(down).neighbor_table().shape == (n, 8)


def test_extreme_coordinates_miss_instead_of_overflowing():
    big = 2**31 - 1
    coords = torch.tensor([[0, big, -(2**31), 0], [0, big - 1, -(2**31), 0]], dtype=torch.int32)
    ref = km.submanifold_map(coords.to(torch.int64), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    got = km.submanifold_map(coords.cuda(), (3, 3, 3), (1, 1, 1), (1, 1, 1))
    # Centre offset (13) finds itself; x -/+ 1 finds the neighbour; nothing crosses int32.
    table = got.neighbor_table().cpu()
    assert table[:, 13].tolist() == [0, 1] and table[0, 4].tolist() == 1 and table[1, 22].tolist() == 0
    assert (table >= 0).sum() == 4 and ref.num_pairs == 2


@pytest.mark.parametrize("kernel", [(3, 3, 3), (2, 2, 2)])
def test_fresh_submanifold_map_is_one_op_call(monkeypatch, kernel):
    """A set with no hash gets its hash, table and check from hashed_submanifold_table alone; the
    index keeps the hash for the set's later maps, which take the split ops with no sync."""
    coords = scene(n=500, seed=14)
    index = km.CoordIndex(coords.cuda())

    def split_op(*_):
        raise AssertionError("a fresh set's map took the split ops")

    with monkeypatch.context() as m:
        m.setattr(coord_ops, "coord_hash", split_op)
        m.setattr(coord_ops, "kernel_map_table", split_op)
        got = km.submanifold_map(index.coords, kernel, (1, 1, 1), (1, 1, 1), index=index)
    assert index.validated and index.hashed
    ref = km.submanifold_map(coords, kernel, (1, 1, 1), (1, 1, 1))
    assert torch.equal(got.neighbor_table().cpu().long(), ref.neighbor_table().long())
    with no_host_sync():
        again = km.submanifold_map(index.coords, (5, 5, 5), (1, 1, 1), (1, 1, 1), index=index)
    ref5 = km.submanifold_map(coords, (5, 5, 5), (1, 1, 1), (1, 1, 1))
    assert torch.equal(again.neighbor_table().cpu().long(), ref5.neighbor_table().long())


@pytest.mark.parametrize("kernel", [(3, 3, 3), (2, 2, 2)])
def test_one_buffer_table_and_hash_equal_the_split_ones(kernel):
    """hashed_submanifold_table with one allocation for table, hash and error word gives the table
    and a hash that later maps of the set use, as with separate allocations."""
    op = torch.ops.relconv.hashed_submanifold_table.default
    table_op = torch.ops.relconv.kernel_map_table.default
    coords = scene(n=700, seed=15).cuda()
    ref = km.submanifold_map(coords.cpu(), (5, 5, 5), (1, 1, 1), (1, 1, 1)).neighbor_table().long()
    tables = []
    for one_buffer in (False, True):
        slots, table, error, ticket = op(coords, kernel, (1, 1, 1), True, one_buffer)
        assert ticket == -1  # checked inside the op: no ticket left to the caller
        torch.ops.relconv.check_coords(error)  # the word of a good set: no problem recorded
        tables.append(table.cpu())
        later = table_op(coords, slots, coords, (5, 5, 5), (1, 1, 1), torch.int32)
        assert torch.equal(later.cpu().long(), ref)
    assert torch.equal(tables[0], tables[1]) and tables[1].dtype == torch.int32
    empty = coords[:0]
    slots, table, _, _ = op(empty, (3, 3, 3), (1, 1, 1), True, True)
    assert table.shape == (0, 27) and slots.numel() > 0


@pytest.mark.parametrize("bad", [None, "duplicate"])
def test_large_set_takes_the_split_kernels_and_agrees(bad):
    """Past 2^18 rows a one-buffer submanifold map is a memset and two kernels instead of the one
    cooperative launch of smaller sets: same table as the split ops, same check of the rows."""
    op = torch.ops.relconv.hashed_submanifold_table.default
    coords = scene(n=330_000, size=60, seed=21).cuda()
    assert coords.shape[0] > 2**18
    if bad is None:
        slots, table, error, ticket = op(coords, (3, 3, 3), (1, 1, 1), True, True)
        assert ticket == -1
        ref_slots, _ = torch.ops.relconv.coord_hash(coords)
        ref = torch.ops.relconv.kernel_map_table(coords, ref_slots, coords, (3, 3, 3), (1, 1, 1), torch.int32)
        assert torch.equal(table, ref)
        small = coords[:5000]
        part = op(small, (3, 3, 3), (1, 1, 1), True, True)[1]  # the fused kernel
        small_slots, _ = torch.ops.relconv.coord_hash(small)
        want = torch.ops.relconv.kernel_map_table(
            small, small_slots, small, (3, 3, 3), (1, 1, 1), torch.int32
        )
        assert torch.equal(part, want)
    else:
        dup = torch.cat([coords, coords[-1:]])
        with pytest.raises(ValueError, match="duplicate"):
            op(dup, (3, 3, 3), (1, 1, 1), True, True)
        _, _, error, ticket = op(dup, (3, 3, 3), (1, 1, 1), False, True, True)
        with pytest.raises(ValueError, match="duplicate"):
            torch.ops.relconv.check_coords(error, ticket)


@pytest.mark.parametrize("one_buffer", [False, True])
def test_deferred_checks_read_the_published_word_and_survive_a_reused_slot(one_buffer):
    """With `early_read` the op has its error word published to the host and returns its ticket;
    check_coords with the ticket raises exactly as with the device word alone. A ticket whose slot
    newer ones have taken (the ring holds 64), or one already read, falls back to the device word."""
    op = torch.ops.relconv.hashed_submanifold_table.default
    good = scene(n=400, seed=18).cuda()
    dup = torch.cat([good, good[:1]])
    neg = good.clone()
    neg[3, 0] = -1
    for coords, match in ((good, None), (dup, "duplicate"), (neg, "non-negative")):
        _, _, error, ticket = op(coords, (3, 3, 3), (1, 1, 1), False, one_buffer, True)
        assert ticket >= 0
        for t in (ticket, ticket, -1):  # the published copy, then twice the device word
            if match is None:
                torch.ops.relconv.check_coords(error, t)
            else:
                with pytest.raises(ValueError, match=match):
                    torch.ops.relconv.check_coords(error, t)
    _, _, old_error, old_ticket = op(dup, (3, 3, 3), (1, 1, 1), False, one_buffer, True)
    for _ in range(64):
        _, _, error, ticket = op(good, (3, 3, 3), (1, 1, 1), False, one_buffer, True)
    torch.ops.relconv.check_coords(error, ticket)
    with pytest.raises(ValueError, match="duplicate"):
        torch.ops.relconv.check_coords(old_error, old_ticket)
    assert op(good, (3, 3, 3), (1, 1, 1), False, one_buffer)[3] == -1  # no published word asked for


@pytest.mark.parametrize("bad", ["duplicate", "negative_batch"])
@pytest.mark.parametrize("builder", ["submanifold", "strided"])
def test_bad_coordinates_raise_and_cuda_survives(bad, builder):
    coords = scene(n=300, seed=9)
    if bad == "duplicate":
        coords = torch.cat([coords, coords[:1]])
        match = "duplicate"
    else:
        coords[5, 0] = -1
        match = "non-negative"
    with pytest.raises(ValueError, match=match):
        if builder == "submanifold":
            km.submanifold_map(coords.cuda(), (3, 3, 3), (1, 1, 1), (1, 1, 1))
        else:
            km.strided_map(coords.cuda(), (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    good = scene(n=300, seed=10).cuda()
    rmap = km.submanifold_map(good, (3, 3, 3), (1, 1, 1), (1, 1, 1))
    assert rmap.num_pairs >= good.shape[0]
    torch.cuda.synchronize()


@pytest.mark.parametrize("bad", ["duplicate", "negative_batch"])
def test_strided_map_onto_known_sites_checks_its_input(bad):
    """With its coarse sites given (cached on the tensor), a strided map of unchecked coordinates is
    checked by its table op, which raises on bad rows as the coarsening op does."""
    coords = scene(n=300, seed=12)
    sites = km.strided_output_coords(coords, (2, 2, 2), (1, 1, 1)).cuda()  # of the valid rows
    if bad == "duplicate":
        coords, match = torch.cat([coords, coords[:1]]), "duplicate"
    else:
        coords[7, 0], match = -1, "non-negative"
    with pytest.raises(ValueError, match=match):
        km.strided_map(coords.cuda(), (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1), out_coords=sites)
    torch.cuda.synchronize()


def test_strided_sites_leaving_int32_raise():
    """floor(-2^31 / 3) * 3 is below the int32 range: a clear error, and CUDA keeps working."""
    coords = torch.tensor([[0, -(2**31), 0, 0], [0, 5, 0, 0]], dtype=torch.int32).cuda()
    with pytest.raises(ValueError, match="int32 range"):
        km.strided_map(coords, (3, 3, 3), (3, 3, 3), (1, 1, 1), (1, 1, 1))
    good = scene(n=300, seed=13).cuda()
    down, out = km.strided_map(good, (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    assert down.num_pairs == good.shape[0] and out.shape[0] <= good.shape[0]


def test_validated_subm_map_and_table_forward_do_not_sync():
    coords = scene(n=4000, seed=3).cuda()
    x = VoxelTensor(torch.randn(coords.shape[0], 16, device="cuda", dtype=torch.float16), coords)
    first = layer_map(x, (3, 3, 3), (1, 1, 1), (1, 1, 1))  # validates the coordinates: one sync
    x.cache.maps.clear()  # force fresh builds of the other maps on the same coordinate set
    w = torch.randn(27, 16, 16, device="cuda", dtype=torch.float16)
    with no_host_sync(), torch.no_grad():
        lm = layer_map(x, (3, 3, 3), (1, 1, 1), (2, 2, 2))
        lm5 = layer_map(x, (5, 5, 5), (1, 1, 1), (1, 1, 1))
        out = relational_conv(x.feats, w, lm.rmap)
    assert not lm.rmap.has_pairs and not lm5.rmap.has_pairs and first.rmap is not lm.rmap
    ref = relational_conv(x.feats.float().cpu(), w.float().cpu(), lm.rmap.to("cpu"))
    torch.testing.assert_close(out.float().cpu(), ref, atol=2e-2, rtol=2e-2)


def test_strided_step_syncs_once_and_its_output_is_trusted():
    coords = scene(n=4000, seed=4).cuda()
    x = VoxelTensor(torch.randn(coords.shape[0], 8, device="cuda"), coords)
    layer_map(x, (3, 3, 3), (1, 1, 1), (1, 1, 1))
    down = layer_map(x, (2, 2, 2), (2, 2, 2), (1, 1, 1))
    index = x.cache.indexes[(2, 2, 2)]
    assert index.coords is down.out_coords and index.validated
    feats = torch.zeros(down.out_coords.shape[0], 8, device="cuda")
    coarse = VoxelTensor(feats, down.out_coords, 2, down.out_cache)
    with no_host_sync():
        sub = layer_map(coarse, (3, 3, 3), (1, 1, 1), (1, 1, 1))
        up = layer_map(coarse, (2, 2, 2), (2, 2, 2), (1, 1, 1), transposed=True)
    assert not sub.rmap.has_pairs and up.out_coords is coords


def test_table_map_gradients_match_pair_map():
    coords = scene(n=1500, seed=6)
    feats = torch.randn(coords.shape[0], 8, dtype=torch.float16)
    w = torch.randn(27, 8, 16, dtype=torch.float16) / 4
    ref_map = km.submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1)).to("cuda")
    got_map = km.submanifold_map(coords.cuda(), (3, 3, 3), (1, 1, 1), (1, 1, 1))
    grads = []
    for rmap in (ref_map, got_map):
        x = feats.cuda().requires_grad_()
        wc = w.cuda().requires_grad_()
        relational_conv(x, wc, rmap).float().square().sum().backward()
        grads.append((x.grad.float(), wc.grad.float()))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=2e-2)


def test_large_sets_release_their_hash_and_rebuild_it(monkeypatch):
    """A set at RELEASE_ROWS gives its hash back after each map; later maps rebuild it and match the
    reference, and an unchecked set still raises from its kept error word."""
    coords = scene(n=3000, seed=11)
    monkeypatch.setattr(km.CoordIndex, "RELEASE_ROWS", 1000)
    index = km.CoordIndex(coords.cuda())
    sub = km.submanifold_map(index.coords, (3, 3, 3), (1, 1, 1), (1, 1, 1), index=index)
    assert index._slots is None and index.validated
    down, down_out = km.strided_map(index.coords, (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1), index=index)
    assert index._slots is None
    ref = km.submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1))
    ref_down, ref_out = km.strided_map(coords, (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    assert coord_triples(sub, coords, coords) == coord_triples(ref, coords, coords)
    assert coord_triples(down, coords, down_out) == coord_triples(ref_down, coords, ref_out)

    dup = torch.cat([coords, coords[:1]]).cuda()
    bad = km.CoordIndex(dup)
    km.submanifold_map(dup, (3, 3, 3), (1, 1, 1), (1, 1, 1), index=bad, validate=False)
    assert bad._slots is None and bad.pending_error() is not None
    with pytest.raises(ValueError, match="duplicate"):
        bad.ensure_valid()


@pytest.mark.parametrize("bad", ["duplicate", "negative_batch"])
def test_a_fresh_conv_checks_its_coordinates_before_its_launch(bad):
    """Conv3d leaves a new set's check to just before its launch (layer_map(defer_check=True)): bad
    coordinates still raise, before the conv is queued, and again on the next call; a good set is
    checked once, and its conv equals the CPU one."""
    coords = scene(n=300, seed=16)
    if bad == "duplicate":
        coords, match = torch.cat([coords, coords[:1]]), "duplicate"
    else:
        coords[7, 0], match = -1, "non-negative"
    conv = Conv3d(4, 8, 3).cuda()
    x = VoxelTensor(torch.randn(len(coords), 4, device="cuda"), coords.cuda())
    for _ in range(2):
        with pytest.raises(ValueError, match=match):
            conv(x)
    good = scene(n=300, seed=17)
    feats = torch.randn(len(good), 4)
    y = conv(VoxelTensor(feats.cuda(), good.cuda()))
    assert y.cache.indexes[(1, 1, 1)].validated
    again = y.replace_feature(feats.cuda())
    with no_host_sync():
        conv(again)
    want = conv.cpu()(VoxelTensor(feats, good))
    torch.testing.assert_close(y.feats.cpu(), want.feats, rtol=1e-4, atol=1e-4)
