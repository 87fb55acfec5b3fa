"""The op takes a groups == 1 weight as [R, C_in, C_out] as well as [R, 1, C_in, C_out].

The front end passes a 3-D parameter to the op as it is: a view to 4-D in Python would be an autograd
node (UnsqueezeBackward0) per conv per training step, host time the small layers cannot spare. The op
views it below autograd instead. These tests check that the 3-D weight computes exactly what its 4-D
view does (forward, input and weight gradients, the weight gradient in the weight's own shape), that
the public wrapper records no view node, gradcheck, the errors for other ranks, and the fake kernel.
"""

import contextlib

import pytest
import torch

from relconv import RelationalMap, relational_conv
from relconv.ops import Dataflow
from relconv.ops import map_views as views
from tests.conftest import DEVICES
from tests.ops.maps import TOLERANCE, random_map, rel_error

op = torch.ops.relconv.relational_conv.default
NONDET_TOL = {"cpu": 0.0, "cuda": 1e-12}


def injective_map(num_in: int, num_out: int, num_relations: int, device: str, seed: int = 0) -> RelationalMap:
    """A table map injective per relation both ways (like a voxel map), so that on CUDA the forward
    and the input gradient can both run the table kernel (no atomics: bitwise reproducible)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.full((num_out, num_relations), -1, dtype=torch.int32)
    for r in range(num_relations):
        inputs = torch.randperm(num_in, generator=g)[:num_out].int()
        keep = torch.rand(num_out, generator=g) < 0.6
        table[:, r] = torch.where(keep, inputs, -1)
    return RelationalMap.from_neighbor_table(table, num_in, injective=True).to(device)


@contextlib.contextmanager
def deterministic(device: str):
    """On CUDA, the deterministic weight gradient (per-tile partials, no atomics); warn_only since
    nothing here needs torch's own ops to refuse."""
    if device != "cuda":
        yield
        return
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def _tensors(rmap, cin, cout, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rmap.num_in, cin, generator=g, dtype=torch.float64).to(device, dtype)
    w = torch.randn(rmap.num_relations, cin, cout, generator=g, dtype=torch.float64) / cin**0.5
    w = w.to(device, dtype)
    grad = torch.randn(rmap.num_out, cout, generator=g, dtype=torch.float64).to(device, dtype)
    bias = torch.randn(cout, generator=g, dtype=torch.float64).to(device, dtype)
    return x, w, grad, bias


def _forward_and_grads(x, w, rmap, grad, bias, dataflow):
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    out = relational_conv(x, w, rmap, bias=bias, activation="relu", dataflow=dataflow)
    gx, gw = torch.autograd.grad(out, (x, w), grad)
    return out, gx, gw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize("dataflow", [Dataflow.FETCH_ON_DEMAND, Dataflow.OUTPUT_STATIONARY], ids=str)
def test_3d_weight_equals_its_4d_view(device, dtype, dataflow):
    rmap = injective_map(60, 50, 7, device)
    x, w, grad, bias = _tensors(rmap, 16, 12, dtype, device)
    with deterministic(device):
        out3, gx3, gw3 = _forward_and_grads(x, w, rmap, grad, bias, dataflow)
        out4, gx4, gw4 = _forward_and_grads(x, w.unsqueeze(1), rmap, grad, bias, dataflow)
    assert gw3.shape == w.shape and gw4.shape == (7, 1, 16, 12)
    assert gw3.dtype == dtype and gx3.shape == x.shape
    if device == "cuda" and dataflow is Dataflow.FETCH_ON_DEMAND:
        # Atomics: the same sums in a run-dependent order.
        tol = TOLERANCE[dtype]
        assert rel_error(out3, out4) < tol and rel_error(gx3, gx4) < tol
        assert rel_error(gw3, gw4.squeeze(1)) < tol
    else:
        assert torch.equal(out3, out4)
        assert torch.equal(gx3, gx4)
        assert torch.equal(gw3, gw4.squeeze(1))


@pytest.mark.parametrize("device", DEVICES)
def test_3d_weight_through_the_raw_op_and_a_scaled_map(device):
    """The op itself (what compiled callers reach), over a map with repeated slots and a scale."""
    rmap = random_map(30, 20, 5, 200, device)
    x, w, grad, _ = _tensors(rmap, 8, 6, torch.float64, device)
    args = (rmap.in_index, rmap.out_index, rmap.rel_ptr, rmap.scale, rmap.num_out)
    x = x.requires_grad_()
    w3 = w.clone().requires_grad_()
    w4 = w.clone().unsqueeze(1).requires_grad_()
    out3, out4 = op(x, w3, *args), op(x, w4, *args)
    gx3, gw3 = torch.autograd.grad(out3, (x, w3), grad)
    gx4, gw4 = torch.autograd.grad(out4, (x, w4), grad)
    assert gw3.shape == w3.shape
    tol = NONDET_TOL[device]
    assert rel_error(out3, out4) <= tol and rel_error(gx3, gx4) <= tol
    assert rel_error(gw3, gw4.squeeze(1)) <= tol


def _graph_node_names(out: torch.Tensor) -> list[str]:
    stack, seen, names = [out.grad_fn], set(), []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.append(type(fn).__name__)
        stack.extend(f for f, _ in fn.next_functions)
    return names


@pytest.mark.parametrize("device", DEVICES)
def test_public_op_records_no_view_of_a_3d_weight(device):
    rmap = injective_map(40, 30, 5, device)
    x, w, _, bias = _tensors(rmap, 8, 4, torch.float32, device)
    x.requires_grad_()
    w.requires_grad_()
    bias.requires_grad_()
    out = relational_conv(x, w, rmap, bias=bias, activation="relu")
    names = _graph_node_names(out)
    assert not any("Unsqueeze" in n or "View" in n for n in names), names
    # The op's node reaches the weight's leaf directly, one edge away.
    leaves = [getattr(f, "variable", None) for f, _ in out.grad_fn.next_functions if f is not None]
    assert any(v is w for v in leaves)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64_3d_weight(device):
    rmap = random_map(9, 7, 4, 40, device, torch.int64)
    x, w, _, bias = _tensors(rmap, 6, 5, torch.float64, device)
    inputs = (x.requires_grad_(), w.requires_grad_(), bias.requires_grad_())
    args = (rmap.in_index, rmap.out_index, rmap.rel_ptr, rmap.scale, rmap.num_out)
    fn = lambda a, b, c: op(a, b, *args, bias=c)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, nondet_tol=NONDET_TOL[device])
    assert torch.autograd.gradgradcheck(fn, inputs, nondet_tol=NONDET_TOL[device])


# On the CPU only: the checks run before any kernel, the same for every device, and the GPU host's
# extension build crashes on C++ errors whose message formats numbers (tests/gpu_host).
@pytest.mark.parametrize("shape", [(4, 6), (4, 1, 1, 6, 5)], ids=["2d", "5d"])
def test_weight_of_other_rank_raises(shape):
    device = "cpu"
    rmap = random_map(10, 8, 4, 40, device, with_scale=False)
    x = torch.randn(10, 6, device=device)
    w = torch.randn(shape, device=device)
    with pytest.raises(ValueError, match=r"weight must be \[R, C_in, C_out\] or \[R, groups"):
        relational_conv(x, w, rmap)
    both = r"weight must be 3-D \[R, C_in, C_out\] \(groups = 1\) or 4-D \[R, groups, C_in/groups, C_out/gr"
    args = (rmap.in_index, rmap.out_index, rmap.rel_ptr, None, rmap.num_out)
    with pytest.raises(ValueError, match=both):
        op(x, w, *args)
    # Meta tensors reach the fake kernel, which must refuse the same weights.
    meta = [t.to("meta") for t in args[:3]]
    with pytest.raises(ValueError, match=both):
        op(x.to("meta"), w.to("meta"), *meta, None, rmap.num_out)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_3d_weight(device):
    rmap = random_map(11, 9, 3, 50, device)
    x, w, _, bias = _tensors(rmap, 8, 4, torch.float32, device)
    scale = rmap.scale.to(torch.float32)
    args = (x.requires_grad_(), w.requires_grad_(), rmap.in_index, rmap.out_index, rmap.rel_ptr, scale, 9)
    torch.library.opcheck(op, args)
    torch.library.opcheck(op, args, {"bias": bias.requires_grad_(), "relu": True})


def test_fake_kernel_output_shape_for_3d_and_4d_weights():
    ii = torch.empty(5, dtype=torch.int32, device="meta")
    rp = torch.empty(4, dtype=torch.int64, device="meta")
    x = torch.empty(10, 6, device="meta")
    assert op(x, torch.empty(3, 6, 4, device="meta"), ii, ii, rp, None, 8).shape == (8, 4)
    assert op(x, torch.empty(3, 2, 3, 5, device="meta"), ii, ii, rp, None, 8).shape == (8, 10)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_3d_weight_matches_eager(device):
    torch._dynamo.reset()
    rmap = random_map(40, 30, 5, 300, device)
    x, w, grad, _ = _tensors(rmap, 8, 3, torch.float32, device)
    x.requires_grad_()
    w.requires_grad_()

    def layer(x, w):
        return relational_conv(x, w, rmap) * 2.0

    out_c = torch.compile(layer, fullgraph=True, backend="aot_eager")(x, w)
    out_e = layer(x, w)
    assert rel_error(out_c, out_e) < 1e-6
    gc = torch.autograd.grad(out_c, (x, w), grad)
    ge = torch.autograd.grad(out_e, (x, w), grad)
    assert gc[1].shape == w.shape
    assert all(rel_error(a, b) < 1e-6 for a, b in zip(gc, ge, strict=True))


def test_table_work_reads_either_layout():
    """table_work counts a relation's multiply-adds per row, G * C_in/G * C_out/G, in both layouts."""
    w3 = torch.empty(27, 8, 6, device="meta")
    for w in (w3, w3.unsqueeze(1)):
        assert views.table_work(100, w) == 100 * 8 * 6
    grouped = torch.empty(27, 2, 4, 3, device="meta")  # C_in 8, C_out 6 in 2 groups: half the work
    assert views.table_work(200, grouped) == 100 * 8 * 6
