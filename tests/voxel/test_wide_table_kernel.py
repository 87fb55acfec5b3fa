"""The Hopper wgmma table kernel (csrc/cuda/conv_forward_table_wgmma.cuh): fp16 / bf16 layers with
C_in_g and C_out_g multiples of 64 (C_out_g 64 aside) on tables under 100k rows.
Checked against the float64 reference with the epilogue, groups, partial last tiles and the schedule
order, in the forward and through the input gradient (the same kernel over the transposed table); on
other GPUs the same tests cover the mma.sync kernel that takes these shapes there."""

import pytest
import torch
from voxel_refs import fused_table_layer, random_voxels

from relconv.ops import relational_conv
from relconv.ops.reference import relational_conv_reference
from relconv.voxel import submanifold_map
from tests.conftest import cuda_kernels

pytestmark = pytest.mark.cuda

_conv = torch.ops.relconv.relational_conv.default
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _map(n=3000, seed=3):
    coords = random_voxels(n, 20, 8, batch=2, seed=seed).coords.to("cuda")
    return submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1))


def _hopper() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "groups, cin, cout",
    [(1, 64, 64), (1, 64, 128), (1, 128, 256), (1, 192, 384), (2, 128, 256), (2, 128, 128)],
)
def test_wide_layers_match_the_reference(dtype, groups, cin, cout):
    rmap = _map()
    assert rmap.num_out % 128  # a partial last tile
    run, ref = fused_table_layer(rmap, dtype, groups, cin, cout)
    plain = run(None)
    # A schedule only: every output row sums the same relations in the same order either way.
    assert torch.equal(plain, run(rmap.table_order()))
    err = (plain.double() - ref).abs().max() / ref.abs().max()
    assert err < TOLERANCE[dtype]
    # C_out_g 64 takes the mma.sync kernel, faster there (conv_launch_wgmma.cu).
    if _hopper():
        wgmma = any("conv_forward_table_wgmma" in k for k in cuda_kernels(lambda: run(None)))
        assert wgmma == (cout // groups != 64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c", [64, 256])
def test_input_gradient_of_a_wide_layer_matches_the_reference(dtype, c):
    rmap = _map(seed=4)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rmap.num_in, c, generator=gen).to("cuda", dtype).requires_grad_()
    w = (torch.randn(27, c, c, generator=gen) / (27 * c) ** 0.5).to("cuda", dtype).requires_grad_()
    up = torch.randn(rmap.num_out, c, generator=gen).to("cuda", dtype)
    relational_conv(x, w, rmap).backward(up)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    relational_conv_reference(xd, wd, rmap).backward(up.double())
    for got, want in ((x.grad, xd.grad), (w.grad, wd.grad)):
        assert (got.double() - want).abs().max() / want.abs().max() < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
# whole: the channels fill whole tiles of the 16-bit kernels (C_out 48 does not).
@pytest.mark.parametrize(
    "groups, cin, cout, whole",
    [(1, 64, 64, True), (1, 128, 256, True), (2, 128, 128, True), (1, 32, 32, True), (1, 64, 48, False)],
)
def test_a_transposed_weight_view_runs_as_its_copy(dtype, groups, cin, cout, whole):
    """The input gradient passes W^T as a view (autograd.cpp): the 16-bit whole-tile kernels (wgmma
    and mma.sync) read it as stored, other kernels get one transpose launch (contiguous_weight);
    either way the output is the one of the contiguous copy, bit for bit."""
    rmap = _map(seed=5)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(rmap.num_in, cin, generator=gen).to("cuda", dtype)
    stored = torch.randn(27, groups, cout // groups, cin // groups, generator=gen).to("cuda", dtype)
    views = [stored.transpose(-2, -1)]
    if groups == 1:
        views.append(stored.squeeze(1).transpose(-2, -1))
    table = rmap.neighbor_table()
    none = torch.empty(0, dtype=table.dtype, device="cuda")
    ptr = torch.empty(0, dtype=torch.int64, device="cuda")

    def run(w):
        return _conv(x, w, none, none, ptr, None, rmap.num_out, table, None, None, False)

    for w in views:
        assert not w.is_contiguous()
        assert torch.equal(run(w), run(w.contiguous()))
    in_place = whole and dtype in (torch.float16, torch.bfloat16)
    kernels = cuda_kernels(lambda: run(views[0]))
    assert any("transpose_matrices" in k for k in kernels) != in_place


def test_other_strided_weights_run_as_their_copy():
    """A non-contiguous weight that is not a transpose (a slice) takes aten's copy: same output."""
    rmap = _map(seed=6)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(rmap.num_in, 64, generator=gen).to("cuda", torch.float16)
    w = torch.randn(27, 64, 128, generator=gen).to("cuda", torch.float16)[:, :, ::2]
    table = rmap.neighbor_table()
    none = torch.empty(0, dtype=table.dtype, device="cuda")
    ptr = torch.empty(0, dtype=torch.int64, device="cuda")
    got = _conv(x, w, none, none, ptr, None, rmap.num_out, table, None, None, False)
    want = _conv(x, w.contiguous(), none, none, ptr, None, rmap.num_out, table, None, None, False)
    assert torch.equal(got, want)
