"""The input gradient of a neighbour-table forward over an injective map runs the table kernel.

On CUDA, a forward over a voxel map's neighbour table (output-stationary, no atomics) gets an input
gradient computed the same way: the op over the transposed map's table (`transposed_table`, which
`relational_conv` passes for maps flagged `injective`, as the voxel builders flag theirs) with
W[r]^T. These tests check it against the float64 CPU reference, its bitwise reproducibility,
gradcheck (and double backward) in float64, and, with the profiler, that the backward of a Conv3d
layer launches no atomic pair kernel. A map with unique slots that repeats an input within a
relation has no transposed table: its input gradient must keep the pair path, and stay correct.
"""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from relconv.ops import Dataflow
from relconv.ops.reference import relational_conv_reference
from relconv.ops.relational_conv import relational_conv
from relconv.voxel import Conv3d, VoxelTensor, strided_map, submanifold_map
from tests.ops.maps import TOLERANCE, rel_error
from tests.ops.test_relational_conv_cuda import unique_slot_map

pytestmark = pytest.mark.cuda

TABLE = Dataflow.OUTPUT_STATIONARY
ONE = (1, 1, 1)


def voxel_coords(n: int, size: int, seed: int = 0) -> torch.Tensor:
    """[M, 4] int32 distinct (batch, x, y, z) rows in two batches of a size^3 grid, on CUDA."""
    g = torch.Generator().manual_seed(seed)
    batch = torch.randint(0, 2, (n, 1), generator=g)
    xyz = torch.randint(0, size, (n, 3), generator=g)
    return torch.unique(torch.cat([batch, xyz], 1), dim=0).int().cuda()


def voxel_map(kind: str, coords: torch.Tensor):
    """CUDA table maps: submanifold 3^3, strided 2^3 (each input feeds one output: its transposed
    table is 7/8 empty) and strided 3^3 / 2 (an input feeds several outputs, one per offset)."""
    if kind == "subm3":
        rmap = submanifold_map(coords, (3, 3, 3), ONE, ONE)
    else:
        kernel = (2, 2, 2) if kind == "down2" else (3, 3, 3)
        rmap = strided_map(coords, kernel, (2, 2, 2), ONE, ONE)[0]
    assert rmap.injective and not rmap.has_pairs
    return rmap


def random_weight(num_relations, groups, cin_g, cout_g, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(num_relations, groups, cin_g, cout_g, generator=g, dtype=torch.float64) / cin_g**0.5
    return w.to("cuda", dtype)


def reference_grads(x, w, bias, rmap, groups, grad, mask=None):
    """Float64 CPU gradients of the reference conv (+ bias); `mask` (the op's ReLU mask) gates the
    incoming gradient, since the derivative of the op's ReLU is read from its own output."""
    xr = x.detach().double().cpu().requires_grad_()
    wr = w.detach().double().cpu().requires_grad_()
    out = relational_conv_reference(xr, wr, rmap.to("cpu"), groups=groups)
    inputs = (xr, wr)
    if bias is not None:
        br = bias.detach().double().cpu().requires_grad_()
        out = out + br
        inputs = (xr, wr, br)
    g = grad.detach().double().cpu()
    if mask is not None:
        g = g * mask.cpu()
    return torch.autograd.grad(out, inputs, g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["subm3", "down2", "down3"])
@pytest.mark.parametrize("groups", [1, 2])
# 8/12 per group: one narrow tile; 64/48: the table kernel's wide-K configuration on the input
# gradient's side (its reduction runs over the forward's output channels).
@pytest.mark.parametrize("cin_g,cout_g", [(8, 12), (48, 64)])
def test_table_gradients_match_float64_reference(dtype, kind, groups, cin_g, cout_g):
    coords = voxel_coords(3000, 20)
    rmap = voxel_map(kind, coords)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rmap.num_in, groups * cin_g, generator=g, dtype=torch.float64).to("cuda", dtype)
    w = random_weight(rmap.num_relations, groups, cin_g, cout_g, dtype)
    xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = relational_conv(xo, wo, rmap, groups=groups, dataflow=TABLE)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64).to("cuda", dtype)
    gx, gw = torch.autograd.grad(out, (xo, wo), grad)
    gxr, gwr = reference_grads(x, w, None, rmap, groups, grad)
    assert gx.dtype == dtype and gx.shape == x.shape
    assert rel_error(gx, gxr) < TOLERANCE[dtype]
    assert rel_error(gw, gwr) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_table_gradients_with_bias_and_relu(dtype):
    coords = voxel_coords(3000, 20, seed=3)
    rmap = voxel_map("subm3", coords)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(rmap.num_in, 32, generator=g, dtype=torch.float64).to("cuda", dtype)
    w = random_weight(27, 1, 32, 24, dtype)
    b = (torch.randn(24, generator=g, dtype=torch.float64) * 0.5).to("cuda", dtype)
    xo, wo, bo = (t.clone().requires_grad_() for t in (x, w, b))
    out = relational_conv(xo, wo, rmap, dataflow=TABLE, bias=bo, activation="relu")
    mask = out.detach().gt(0)
    assert 0 < mask.double().mean() < 1, "the ReLU must cut some outputs and keep others"
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64).to("cuda", dtype)
    gx, gw, gb = torch.autograd.grad(out, (xo, wo, bo), grad)
    gxr, gwr, gbr = reference_grads(x, w, b, rmap, 1, grad, mask=mask)
    assert rel_error(gx, gxr) < TOLERANCE[dtype]
    assert rel_error(gw, gwr) < TOLERANCE[dtype]
    assert rel_error(gb, gbr) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_table_input_gradient_is_bitwise_reproducible(dtype):
    # Big enough that an atomic summation order would differ between runs.
    coords = voxel_coords(40000, 40, seed=5)
    rmap = voxel_map("subm3", coords)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(rmap.num_in, 64, generator=g).to("cuda", dtype).requires_grad_()
    w = random_weight(27, 1, 64, 64, dtype)
    grad = torch.randn(rmap.num_out, 64, generator=g).to("cuda", dtype)
    out = relational_conv(x, w, rmap, dataflow=TABLE)
    (first,) = torch.autograd.grad(out, x, grad, retain_graph=True)
    for _ in range(3):
        (again,) = torch.autograd.grad(out, x, grad, retain_graph=True)
        assert torch.equal(again, first)


@pytest.mark.parametrize("kind", ["subm3", "down3"])
def test_table_path_gradcheck_and_double_backward_float64(kind):
    # float64 runs the SIMT table kernel, forward and input gradient; the double backward goes
    # through the input gradient's own table call.
    coords = voxel_coords(60, 4, seed=7)
    rmap = voxel_map(kind, coords)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(rmap.num_in, 2, generator=g, dtype=torch.float64).cuda().requires_grad_()
    w = torch.randn(rmap.num_relations, 2, 1, 2, generator=g, dtype=torch.float64).cuda().requires_grad_()
    b = torch.randn(4, generator=g, dtype=torch.float64).cuda().requires_grad_()

    def conv(x, w, b):
        return relational_conv(x, w, rmap, groups=2, dataflow=TABLE, bias=b)

    # nondet_tol: the weight gradient still sums over the pair list with atomics.
    assert torch.autograd.gradcheck(conv, (x, w, b), nondet_tol=1e-12)
    assert torch.autograd.gradgradcheck(conv, (x, w, b), nondet_tol=1e-12)


def test_frozen_weight_input_gradient_needs_no_pairs():
    # With the weight frozen only the input gradient is taken, and over the transposed table it reads
    # no pairs: the map never materialises them (no host sync), in the forward or the backward.
    coords = voxel_coords(3000, 20, seed=10)
    rmap = voxel_map("down3", coords)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(rmap.num_in, 16, generator=g, dtype=torch.float64).to("cuda", torch.float16)
    w = random_weight(rmap.num_relations, 1, 16, 16, torch.float16)
    xo = x.clone().requires_grad_()
    out = relational_conv(xo, w, rmap, dataflow=TABLE)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64).to("cuda", torch.float16)
    (gx,) = torch.autograd.grad(out, xo, grad)
    assert not rmap.has_pairs
    gxr, _ = reference_grads(x, w, None, rmap, 1, grad)
    assert rel_error(gx, gxr) < TOLERANCE[torch.float16]


def _repeats_an_input_within_a_relation(rmap) -> bool:
    key = rmap.relation_of_pairs() * rmap.num_in + rmap.in_index.long()
    return key.unique().numel() < key.numel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_unique_slot_map_that_is_not_injective_keeps_correct_gradients(dtype):
    # Unique slots (a table forward) but inputs repeated within a relation: the transposed map has
    # several outputs per (input, relation), so no transposed table exists. The input gradient takes
    # the pair path and must still count every pair.
    rmap = unique_slot_map(60, 300, 9, 0.5, torch.int32)
    assert rmap.unique_slots and not rmap.injective and _repeats_an_input_within_a_relation(rmap)
    with pytest.raises(ValueError, match="injective"):
        rmap.transposed_neighbor_table()
    g = torch.Generator().manual_seed(12)
    x = torch.randn(rmap.num_in, 24, generator=g, dtype=torch.float64).to("cuda", dtype)
    w = random_weight(rmap.num_relations, 1, 24, 16, dtype)
    xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = relational_conv(xo, wo, rmap, dataflow=TABLE)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64).to("cuda", dtype)
    gx, gw = torch.autograd.grad(out, (xo, wo), grad)
    gxr, gwr = reference_grads(x, w, None, rmap, 1, grad)
    assert rel_error(gx, gxr) < TOLERANCE[dtype]
    assert rel_error(gw, gwr) < TOLERANCE[dtype]


def _cuda_kernels(prof) -> list[str]:
    return [ev.name for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]


def _pair_kernels(names: list[str]) -> list[str]:
    return [n for n in names if "conv_forward_wmma" in n or "conv_forward_simt" in n]


def test_cached_fp16_layer_backward_launches_the_table_kernel_not_the_pair_kernel():
    coords = voxel_coords(20000, 32, seed=9)
    conv = Conv3d(32, 32, 3).to("cuda", torch.float16)
    feats = torch.randn(coords.shape[0], 32, device="cuda", dtype=torch.float16).requires_grad_()
    x = VoxelTensor(feats, coords)
    # Builds and caches the map, its transposed table and (for the weight grad) its pair lists.
    conv(x).feats.sum().backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = conv(x).feats
        torch.cuda.synchronize()
    assert not any("transpose_table_kernel" in n for n in _cuda_kernels(prof)), "transposed table not cached"
    grad = torch.randn_like(out)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out.backward(grad)
        torch.cuda.synchronize()
    names = _cuda_kernels(prof)
    assert any("conv_forward_table" in n for n in names), names
    assert not _pair_kernels(names), names
    assert feats.grad is not None and conv.weight.grad is not None


def test_not_injective_map_backward_launches_the_pair_kernel():
    # The counterpart of the test above: the same wrapper over a unique-slot map that is not
    # injective gets its input gradient from the pair kernel.
    rmap = unique_slot_map(2000, 4000, 27, 0.3, torch.int32)
    x = torch.randn(rmap.num_in, 32, device="cuda", dtype=torch.float16).requires_grad_()
    w = torch.randn(27, 32, 32, device="cuda", dtype=torch.float16)
    out = relational_conv(x, w, rmap, dataflow=TABLE)
    grad = torch.randn_like(out)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out.backward(grad)
        torch.cuda.synchronize()
    names = _cuda_kernels(prof)
    assert _pair_kernels(names), names
    assert not any("conv_forward_table" in n for n in names), names
