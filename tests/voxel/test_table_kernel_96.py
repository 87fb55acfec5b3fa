"""The 96-wide mma.sync table tiles (common/kernel_choice.h: C_out_g 65-96, 64-row tiles below
kTallTileRows, 128-row tiles from it on; 6 and 12 warps, whose table loads end in a partial round).
Checked against the float64 reference with the epilogue, groups, partial last tiles and the schedule
order, whole tiles (C_in_g a multiple of 32) and the general kernel (C_out_g 80), in the
forward and through the input gradient, which reads W^T in place at C_in 96."""

import pytest
import torch
from voxel_refs import fused_table_layer, random_voxels

from relconv.ops import relational_conv
from relconv.ops.reference import relational_conv_reference
from relconv.voxel import submanifold_map
from tests.conftest import allow_tf32, cuda_kernels

pytestmark = pytest.mark.cuda

TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 4e-3}
# kTallTileRows: the row count from which the 128-row tiles run
TALL_ROWS = 100_000


def _map(n: int, size: int, seed: int):
    coords = random_voxels(n, size, 1, batch=2, seed=seed).coords.to("cuda")
    return submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1))


def _tile_name(rows: int) -> str:
    # conv_forward_table_mma<T, Idx, BM, BN, ...>
    return f", {128 if rows >= TALL_ROWS else 64}, 96, "


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tall", [False, True], ids=["64-row", "128-row"])
@pytest.mark.parametrize(
    "groups, cin, cout", [(1, 96, 96), (1, 128, 96), (1, 160, 96), (1, 64, 80), (2, 192, 192)]
)
def test_96_wide_tiles_match_the_reference(dtype, tall, groups, cin, cout):
    rmap = _map(260_000, 60, 7) if tall else _map(3000, 20, 3)
    assert (rmap.num_out >= TALL_ROWS) == tall and rmap.num_out % 128
    run, ref = fused_table_layer(rmap, dtype, groups, cin, cout)
    with allow_tf32(True):
        plain = run(None)
        # A schedule only: every output row sums the same relations in the same order either way.
        assert torch.equal(plain, run(rmap.table_order()))
        kernels = cuda_kernels(lambda: run(None))
    assert any("conv_forward_table_mma" in k and _tile_name(rmap.num_out) in k for k in kernels), kernels
    err = (plain.double() - ref).abs().max() / ref.abs().max()
    assert err < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tall", [False, True], ids=["64-row", "128-row"])
def test_input_gradient_of_a_96_wide_layer_reads_the_weight_in_place(dtype, tall):
    rmap = _map(260_000, 60, 8) if tall else _map(3000, 20, 4)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rmap.num_in, 96, generator=gen).to("cuda", dtype).requires_grad_()
    w = (torch.randn(27, 96, 96, generator=gen) / (27 * 96) ** 0.5).to("cuda", dtype).requires_grad_()
    up = torch.randn(rmap.num_out, 96, generator=gen).to("cuda", dtype)
    out = relational_conv(x, w, rmap)
    kernels = cuda_kernels(lambda: out.backward(up))
    # The whole-tile kernel reads W^T as stored: no transposed copy of the weight.
    assert not any("transpose_matrices" in k for k in kernels), kernels
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    relational_conv_reference(xd, wd, rmap).backward(up.double())
    for got, want in ((x.grad, xd.grad), (w.grad, wd.grad)):
        assert (got.double() - want).abs().max() / want.abs().max() < TOLERANCE[dtype]
