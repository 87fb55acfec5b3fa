"""Pairs of a table map built on the device without a host sync (`RelationalMap.kernel_pairs`).

A CUDA map built from its neighbour table passes its pairs to the kernels that need them (weight
gradient, the fp32 fetch-on-demand forward) as `relconv::table_pairs` lists padded to num_out * R
entries, so neither a training step nor an fp32 forward synchronises to size them. Checked: the
padded lists hold exactly the materialised pairs, in order, then -1; the ops give the same results
over them as over the exact lists (bitwise for the deterministic weight gradient); and no host sync.
"""

import pytest
import torch

from relconv import RelationalMap
from relconv.core.relational_map import pairs_from_table
from relconv.ops.relational_conv import relational_conv, relational_conv_weight_grad
from tests.conftest import no_host_sync
from tests.ops.maps import rel_error
from tests.ops.test_table_backward import voxel_coords, voxel_map

pytestmark = pytest.mark.cuda


def _random_table(rows, cols, dtype, fill=0.4, seed=0):
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, 1000, (rows, cols), generator=g)
    table[torch.rand(rows, cols, generator=g) > fill] = -1
    return table.to("cuda", dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize(
    "rows,cols,fill", [(700, 27, 0.4), (1, 8, 1.0), (300, 1, 0.0), (0, 27, 0.5), (2000, 8, 0.9)]
)
def test_padded_pairs_are_the_pairs_then_padding(dtype, rows, cols, fill):
    table = _random_table(rows, cols, dtype, fill)
    in_p, out_p, ptr_p = torch.ops.relconv.table_pairs(table)
    in_e, out_e, ptr_e = pairs_from_table(table)
    assert in_p.dtype == out_p.dtype == dtype and ptr_p.dtype == torch.int64
    assert in_p.numel() == out_p.numel() == rows * cols
    assert torch.equal(ptr_p, ptr_e)
    count = in_e.numel()
    assert torch.equal(in_p[:count], in_e) and torch.equal(out_p[:count], out_e)
    assert bool((in_p[count:] == -1).all()) and bool((out_p[count:] == -1).all())


def test_table_pairs_checks_its_argument():
    with pytest.raises(ValueError, match="table must have shape"):
        torch.ops.relconv.table_pairs(torch.zeros(3, device="cuda", dtype=torch.int32))
    with pytest.raises(ValueError, match="table must be int32 or int64"):
        torch.ops.relconv.table_pairs(torch.zeros(3, 2, device="cuda"))


@pytest.mark.parametrize("kind", ["subm3", "down2"])
def test_ops_over_padded_pairs_match_exact_pairs(kind):
    rmap = voxel_map(kind, voxel_coords(4000, 18))
    exact = RelationalMap.from_neighbor_table(rmap.neighbor_table(), rmap.num_in, injective=True)
    assert exact.num_pairs > 0  # materialises the exact lists, on this twin only
    assert not rmap.has_pairs and exact.has_pairs
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rmap.num_in, 32, generator=g).cuda()
    grad = torch.randn(rmap.num_out, 48, generator=g).cuda()
    w = torch.randn(rmap.num_relations, 32, 48, generator=g).cuda() / 6
    # fp32 forward runs fetch-on-demand over the pairs (atomics: equal up to summation order).
    assert rel_error(relational_conv(x, w, rmap), relational_conv(x, w, exact)) < 1e-6
    torch.use_deterministic_algorithms(True)
    try:
        for dtype in (torch.float32, torch.float16):
            got = relational_conv_weight_grad(x.to(dtype), grad.to(dtype), rmap)
            want = relational_conv_weight_grad(x.to(dtype), grad.to(dtype), exact)
            assert torch.equal(got, want)  # same tiles, same order: bitwise equal
    finally:
        torch.use_deterministic_algorithms(False)
    assert not rmap.has_pairs  # the ops never materialised the exact lists


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_training_step_over_a_new_table_map_does_not_synchronise(dtype):
    rmap = voxel_map("subm3", voxel_coords(4000, 18))  # building it validated the coordinates
    x = torch.randn(rmap.num_in, 32, device="cuda", dtype=dtype, requires_grad=True)
    w = (torch.randn(rmap.num_relations, 32, 32, device="cuda") / 6).to(dtype).requires_grad_()
    with no_host_sync():
        out = relational_conv(x, w, rmap)
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    assert x.grad is not None and w.grad is not None and not rmap.has_pairs
