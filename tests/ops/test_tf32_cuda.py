"""fp32 on TF32 tensor cores: the output-stationary kernel's TF32 mode.

When torch allows TF32 matmuls (`torch.backends.cuda.matmul.allow_tf32`), AUTO runs fp32 voxel maps
output-stationary and the kernel rounds its operands to TF32 (fp32 accumulation), as torch's own
matmuls do; with TF32 off the same dataflow stays exact. Checked against the float64 reference for
every tile configuration (channel widths), partial tiles, groups and both index dtypes, with the
input gradient (the same kernel over the transposed table) and the weight gradient (the tensor-core
weight-gradient kernel in TF32, with and without a pair scale) included.
"""

import pytest
import torch

from relconv.ops import Dataflow
from relconv.ops.reference import relational_conv_reference
from relconv.ops.relational_conv import relational_conv, relational_conv_weight_grad
from tests.conftest import allow_tf32
from tests.ops.maps import TF32_TOLERANCE, random_map, rel_error
from tests.ops.test_table_backward import random_weight, voxel_coords, voxel_map

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize(
    "cin,cout,groups",
    [
        (16, 16, 1),
        (32, 32, 1),
        (64, 64, 1),
        (128, 128, 1),
        (256, 256, 1),
        (64, 256, 1),
        (4, 32, 1),
        (7, 5, 1),
        (64, 96, 1),
        (32, 48, 4),
    ],
)
@pytest.mark.parametrize("kind", ["subm3", "down2"])
def test_tf32_forward_and_gradients_match_reference(cin, cout, groups, kind):
    rmap = voxel_map(kind, voxel_coords(3000, 16))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rmap.num_in, cin, generator=g, dtype=torch.float64).float().cuda().requires_grad_()
    w = random_weight(rmap.num_relations, groups, cin // groups, cout // groups, torch.float32)
    w.requires_grad_()
    with allow_tf32(True):
        out = relational_conv(x, w, rmap, groups=groups)
        grad = torch.randn_like(out)
        gx, gw = torch.autograd.grad(out, (x, w), grad)
    xr = x.detach().double().cpu().requires_grad_()
    wr = w.detach().double().cpu().requires_grad_()
    ref = relational_conv_reference(xr, wr, rmap.to("cpu"), groups=groups)
    gx_ref, gw_ref = torch.autograd.grad(ref, (xr, wr), grad.double().cpu())
    err = rel_error(out, ref)
    assert err < TF32_TOLERANCE
    assert rel_error(gx, gx_ref) < TF32_TOLERANCE
    assert rel_error(gw, gw_ref) < TF32_TOLERANCE
    if cin >= 16:
        assert err > 1e-6  # the tensor cores ran: exact fp32 would be ~1e-7


@pytest.mark.parametrize("deterministic", [False, True])
def test_tf32_weight_grad_with_pair_scale(deterministic):
    # A graph map (repeated slots, per-pair scale): the forward runs fetch-on-demand (exact), the
    # weight gradient on TF32 tensor cores with the scale applied to its fragments.
    rmap = random_map(600, 500, 9, 8000, "cuda")
    x = torch.randn(600, 64, device="cuda")
    grad = torch.randn(500, 64, device="cuda")
    torch.use_deterministic_algorithms(deterministic)
    try:
        with allow_tf32(True):
            gw = relational_conv_weight_grad(x, grad, rmap).squeeze(1)
            again = relational_conv_weight_grad(x, grad, rmap).squeeze(1)
    finally:
        torch.use_deterministic_algorithms(False)
    xr = x.double().cpu().requires_grad_()
    wr = torch.zeros(9, 64, 64, dtype=torch.float64, requires_grad=True)
    ref = relational_conv_reference(xr, wr, rmap.to("cpu"))
    (gw_ref,) = torch.autograd.grad(ref, wr, grad.double().cpu())
    assert rel_error(gw, gw_ref) < TF32_TOLERANCE
    assert rel_error(gw, gw_ref) > 1e-6  # the tensor cores ran
    if deterministic:
        assert torch.equal(gw, again)


def test_tf32_off_stays_exact_on_the_same_dataflow():
    rmap = voxel_map("subm3", voxel_coords(3000, 16))
    x = torch.randn(rmap.num_in, 64, device="cuda")
    w = random_weight(rmap.num_relations, 1, 64, 64, torch.float32)
    ref = relational_conv_reference(x.double().cpu(), w.double().cpu(), rmap.to("cpu"))
    with allow_tf32(False):
        exact = relational_conv(x, w, rmap, dataflow=Dataflow.OUTPUT_STATIONARY)
    assert rel_error(exact, ref) < 1e-5


def test_tf32_int64_tables_and_bias_relu_epilogue():
    coords = voxel_coords(2000, 14)
    rmap = voxel_map("subm3", coords)
    table64 = type(rmap).from_neighbor_table(rmap.neighbor_table().long(), rmap.num_in, injective=True)
    x = torch.randn(rmap.num_in, 32, device="cuda")
    w = random_weight(rmap.num_relations, 1, 32, 64, torch.float32)
    bias = torch.randn(64, device="cuda")
    with allow_tf32(True):
        out = relational_conv(x, w, table64, bias=bias, activation="relu")
    ref = relational_conv_reference(x.double().cpu(), w.double().cpu(), rmap.to("cpu"))
    ref = (ref + bias.double().cpu()).relu()
    assert rel_error(out, ref) < TF32_TOLERANCE
