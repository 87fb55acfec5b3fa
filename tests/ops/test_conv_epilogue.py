"""The op's epilogue: `relational_conv(..., bias, activation="relu")` equals `relu(conv + bias)` on every
path (CPU, CUDA pair lists, CUDA neighbour table), is differentiable in x, weight and bias, and on the
CUDA table path a cached Conv3d with bias and ReLU runs as one kernel."""

import pytest
import torch

from relconv import RelationalMap, relational_conv
from relconv.ops import Dataflow
from relconv.ops.reference import relational_conv_reference
from relconv.voxel import Conv3d, VoxelTensor, submanifold_map
from tests.conftest import cuda_kernels
from tests.ops.maps import TOLERANCE, random_map, rel_error

op = torch.ops.relconv.relational_conv.default


def _tensor(shape, dtype, device="cpu", seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(device, dtype)


def _weight(r, groups, cin, cout, dtype, device="cpu", seed=1):
    shape = (r, cin, cout) if groups == 1 else (r, groups, cin // groups, cout // groups)
    return _tensor(shape, dtype, device, seed, scale=cin**-0.5)


def _unfused(x, w, rmap, groups, bias, relu):
    """The reference the epilogue must reproduce, in float64: relu?(conv + bias)."""
    out = relational_conv_reference(x.double(), w.double(), rmap, groups=groups)
    if bias is not None:
        out = out + bias.double()
    return out.relu() if relu else out


def _voxel_coords(n=3000, size=20, batch=2, seed=3, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    b = torch.randint(0, batch, (n,), generator=gen)
    xyz = torch.randint(0, size, (n, 3), generator=gen)
    return torch.unique(torch.cat([b[:, None], xyz], 1), dim=0).int().to(device)


# ---------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("with_scale", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_cpu_epilogue_is_bitwise_the_unfused_conv(dtype, groups, with_scale, relu):
    # float32/float64 accumulate in their own dtype, so adding the bias to the accumulator is the
    # same arithmetic as adding it to the output afterwards.
    rmap = random_map(37, 29, 6, 400, with_scale=with_scale)
    x, w = _tensor((37, 12), dtype), _weight(6, groups, 12, 10, dtype)
    bias = _tensor(10, dtype, seed=4)
    out = relational_conv(x, w, rmap, groups=groups, bias=bias, activation="relu" if relu else None)
    plain = relational_conv(x, w, rmap, groups=groups) + bias
    assert out.dtype == dtype and torch.equal(out, plain.relu() if relu else plain)
    if relu:
        assert bool((out == 0).any()) and bool((out > 0).any())  # the ReLU did clip something


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cpu_half_epilogue_rounds_once(dtype):
    rmap = random_map(37, 29, 6, 400)
    x, w, bias = _tensor((37, 12), dtype), _weight(6, 1, 12, 10, dtype), _tensor(10, dtype, seed=4)
    out = relational_conv(x, w, rmap, bias=bias, activation="relu")
    assert out.dtype == dtype
    assert rel_error(out, _unfused(x, w, rmap, 1, bias, True)) < TOLERANCE[dtype]


@pytest.mark.parametrize("relu", [False, True])
def test_outputs_without_pairs_get_the_epilogue(relu):
    """Empty map, untouched output rows and num_out == 0: the sum is zero, the output is act(bias)."""
    bias = torch.tensor([-1.5, 0.5, 2.0])
    act = bias.relu() if relu else bias
    activation = "relu" if relu else None
    x, w = _tensor((5, 4), torch.float32), _weight(3, 1, 4, 3, torch.float32)
    empty = random_map(5, 4, 3, 0)
    out = relational_conv(x, w, empty, bias=bias, activation=activation)
    assert torch.equal(out, act.expand(4, 3))
    # Outputs 0 and 3 receive no pairs.
    sparse = RelationalMap.from_triples(
        torch.tensor([0, 1, 2]), torch.tensor([1, 2, 1]), torch.tensor([1, 2, 2]), 5, 4, 3
    )
    out = relational_conv(x, w, sparse, bias=bias, activation=activation)
    assert torch.equal(out[0], act) and torch.equal(out[3], act)
    none = random_map(5, 0, 3, 0)
    assert relational_conv(x, w, none, bias=bias, activation=activation).shape == (0, 3)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("groups", [1, 3])
def test_gradcheck_x_weight_bias(relu, groups):
    rmap = random_map(9, 7, 4, 40, index_dtype=torch.int64)
    x = _tensor((9, 6), torch.float64).requires_grad_()
    w = _weight(4, groups, 6, 3 * groups, torch.float64).requires_grad_()
    # Biases of magnitude >= 0.5 keep every pre-activation well away from the ReLU's kink, where the
    # finite differences of gradcheck would straddle it.
    b = _tensor(3 * groups, torch.float64, seed=5)
    b = (b.sign() * (b.abs() + 0.5)).requires_grad_()
    pre = relational_conv(x.detach(), w.detach(), rmap, groups=groups, bias=b.detach())
    assert pre.abs().min() > 1e-3, "test data: a pre-activation too close to 0 for finite differences"
    activation = "relu" if relu else None
    fn = lambda a, c, d: relational_conv(a, c, rmap, groups=groups, bias=d, activation=activation)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b))
    # Double backward is exact too: the ReLU mask is piecewise constant, so its derivative is zero.
    assert torch.autograd.gradgradcheck(fn, (x, w, b))


def test_bias_gradient_alone_and_relu_mask():
    rmap = random_map(20, 15, 5, 120, with_scale=False)
    x, w = _tensor((20, 8), torch.float32), _weight(5, 1, 8, 6, torch.float32)
    b = _tensor(6, torch.float32, seed=6).requires_grad_()
    out = relational_conv(x, w, rmap, bias=b, activation="relu")
    grad = _tensor(out.shape, torch.float32, seed=7)
    (gb,) = torch.autograd.grad(out, b, grad)
    torch.testing.assert_close(gb, (grad * (out > 0)).sum(0))


def test_opcheck_with_bias_and_relu():
    rmap = random_map(11, 9, 3, 50)
    x = _tensor((11, 8), torch.float32).requires_grad_()
    w = _weight(3, 2, 8, 4, torch.float32).requires_grad_()
    b = _tensor(4, torch.float32, seed=4).requires_grad_()
    scale = rmap.scale.to(torch.float32)
    args = (x, w, rmap.in_index, rmap.out_index, rmap.rel_ptr, scale, rmap.num_out, None, None, b, True)
    torch.library.opcheck(op, args)


def test_autocast_casts_the_bias_with_x_and_weight():
    rmap = random_map(30, 20, 4, 200)
    x, w = _tensor((30, 8), torch.float32), _weight(4, 1, 8, 6, torch.float32)
    b = _tensor(6, torch.float32, seed=4).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = relational_conv(x, w, rmap, bias=b, activation="relu")
    assert out.dtype == torch.bfloat16
    ref = _unfused(x.bfloat16(), w.bfloat16(), rmap, 1, b.detach().bfloat16(), True)
    assert rel_error(out, ref) < TOLERANCE[torch.bfloat16]
    (gb,) = torch.autograd.grad(out.float().sum(), b)
    assert gb.dtype == torch.float32 and torch.equal(gb, (out > 0).float().sum(0))


def test_wrapper_casts_a_bias_of_another_dtype():
    rmap = random_map(10, 8, 3, 40)
    x, w = _tensor((10, 6), torch.float32), _weight(3, 1, 6, 4, torch.float32)
    b64 = _tensor(4, torch.float64, seed=4)
    out = relational_conv(x, w, rmap, bias=b64)
    assert out.dtype == torch.float32
    assert torch.equal(out, relational_conv(x, w, rmap) + b64.float())


def test_bad_bias_and_activation_raise_naming_them():
    rmap = random_map(10, 8, 3, 40, with_scale=False)
    x, w = torch.randn(10, 6), torch.randn(3, 6, 4)
    with pytest.raises(ValueError, match=r"bias must have shape \[C_out\] = \[4\]"):
        relational_conv(x, w, rmap, bias=torch.zeros(5))
    with pytest.raises(ValueError, match="bias must have shape"):
        relational_conv(x, w, rmap, bias=torch.zeros(1, 4))
    with pytest.raises(ValueError, match="bias is on meta"):
        relational_conv(x, w, rmap, bias=torch.zeros(4, device="meta"))
    with pytest.raises(TypeError, match="bias must be a Tensor"):
        relational_conv(x, w, rmap, bias=[0.0] * 4)
    with pytest.raises(ValueError, match="activation must be one of"):
        relational_conv(x, w, rmap, activation="gelu")
    # The op itself (what torch.compile'd or scripted callers reach) checks shape and dtype too.
    w4, ii, oi, rp = w.unsqueeze(1), rmap.in_index, rmap.out_index, rmap.rel_ptr
    with pytest.raises(ValueError, match=r"bias must have shape \[C_out\] = \[4\]"):
        op(x, w4, ii, oi, rp, None, 8, None, None, torch.zeros(3))
    with pytest.raises(ValueError, match="bias must have shape"):
        op(x, w4, ii, oi, rp, None, 8, None, None, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="bias dtype"):
        op(x, w4, ii, oi, rp, None, 8, None, None, torch.zeros(4, dtype=torch.float64))


def test_conv3d_with_bias_and_relu_equals_conv_then_bias_then_relu():
    coords = _voxel_coords(800, 10, device="cpu")
    x = VoxelTensor(_tensor((coords.shape[0], 8), torch.float32), coords)
    conv = Conv3d(8, 6, 3, groups=2, bias=True, activation="relu")
    plain = Conv3d(8, 6, 3, groups=2, bias=False)
    plain.weight = conv.weight
    with torch.no_grad():
        conv.bias.copy_(_tensor(6, torch.float32, seed=4))
        out = conv(x).feats
        ref = (plain(x).feats + conv.bias).relu()
    assert torch.equal(out, ref)


# --------------------------------------------------------------------------------------------- CUDA


def _table_args(rmap):
    table = rmap.neighbor_table()
    none = torch.empty(0, dtype=table.dtype, device="cuda")
    return none, none, torch.empty(0, dtype=torch.int64, device="cuda"), table


# Every tile configuration of the fp16/bf16 and fp32 table kernels, an odd width and a grouped weight.
WIDTHS = [(8, 16, 1), (32, 32, 1), (64, 64, 1), (64, 128, 1), (24, 40, 1), (96, 72, 1), (32, 48, 2)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("cin,cout,groups", WIDTHS)
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("use_order", [False, True])
def test_cuda_table_epilogue_matches_unfused(dtype, cin, cout, groups, relu, use_order):
    rmap = submanifold_map(_voxel_coords(), (3, 3, 3), (1, 1, 1), (1, 1, 1))
    x = _tensor((rmap.num_in, cin), dtype, "cuda")
    w = _weight(27, groups, cin, cout, dtype, "cuda").view(27, groups, cin // groups, cout // groups)
    bias = _tensor(cout, dtype, "cuda", seed=4)
    none, none, ptr, table = _table_args(rmap)
    order = rmap.table_order() if use_order else None
    out = op(x, w, none, none, ptr, None, rmap.num_out, table, order, bias, relu)
    assert out.dtype == dtype
    assert rel_error(out, _unfused(x, w, rmap, groups, bias, relu)) < TOLERANCE[dtype]
    if use_order:  # the order is a schedule only, epilogue included
        assert torch.equal(out, op(x, w, none, none, ptr, None, rmap.num_out, table, None, bias, relu))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_cuda_table_rows_without_inputs_get_act_bias(dtype):
    """An all -1 table runs the kernel (the pair count is unknown) and writes relu(bias) everywhere;
    no input rows at all takes the early return, which must do the same."""
    bias = torch.tensor([-1.5, 0.5, 2.0, -0.25], device="cuda", dtype=dtype)
    w = _weight(27, 1, 8, 4, dtype, "cuda").unsqueeze(1)
    table = torch.full((50, 27), -1, dtype=torch.int32, device="cuda")
    none, ptr = table.new_empty(0), torch.empty(0, dtype=torch.int64, device="cuda")
    for x in (_tensor((10, 8), dtype, "cuda"), _tensor((0, 8), dtype, "cuda")):
        out = op(x, w, none, none, ptr, None, 50, table, None, bias, True)
        assert torch.equal(out, bias.relu().expand(50, 4))
    one = op(_tensor((0, 8), dtype, "cuda"), w, none, none, ptr, None, 1, table[:1], None, bias, True)
    assert one.data_ptr() != bias.data_ptr()  # a copy, never a view of the bias


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("relu", [False, True])
def test_cuda_pair_path_epilogue_matches_unfused(dtype, relu):
    rmap = random_map(500, 400, 27, 6000, "cuda")
    x, w = _tensor((500, 32), dtype, "cuda"), _weight(27, 2, 32, 48, dtype, "cuda")
    bias = _tensor(48, dtype, "cuda", seed=4)
    out = relational_conv(x, w, rmap, groups=2, bias=bias, activation="relu" if relu else None)
    assert out.dtype == dtype
    assert rel_error(out, _unfused(x, w, rmap, 2, bias, relu)) < TOLERANCE[dtype]
    empty = random_map(500, 40, 27, 0, "cuda")
    out = relational_conv(x, w, empty, groups=2, bias=bias, activation="relu" if relu else None)
    assert torch.equal(out, (bias.relu() if relu else bias).expand(40, 48))


@pytest.mark.cuda
@pytest.mark.parametrize("dataflow", [Dataflow.OUTPUT_STATIONARY, Dataflow.FETCH_ON_DEMAND])
def test_cuda_gradients_of_x_weight_bias(dataflow):
    rmap = submanifold_map(_voxel_coords(), (3, 3, 3), (1, 1, 1), (1, 1, 1))
    x = _tensor((rmap.num_in, 16), torch.float32, "cuda").requires_grad_()
    w = _weight(27, 1, 16, 24, torch.float32, "cuda").requires_grad_()
    b = _tensor(24, torch.float32, "cuda", seed=4).requires_grad_()
    out = relational_conv(x, w, rmap, dataflow=dataflow, bias=b, activation="relu")
    ref_in = [t.detach().double().requires_grad_() for t in (x, w, b)]
    ref = _unfused(*ref_in[:2], rmap, 1, ref_in[2], True)
    grad = _tensor(out.shape, torch.float64, "cuda", seed=7)
    got = torch.autograd.grad(out, (x, w, b), grad.float())
    want = torch.autograd.grad(ref, ref_in, grad)
    assert rel_error(out, ref) < 1e-5
    for g, r in zip(got, want, strict=True):
        assert rel_error(g, r) < 1e-5


@pytest.mark.cuda
def test_cuda_bias_gradient_alone_keeps_pairs_unmaterialised():
    rmap = submanifold_map(_voxel_coords(), (3, 3, 3), (1, 1, 1), (1, 1, 1))
    had_pairs = rmap.has_pairs
    x, w = _tensor((rmap.num_in, 16), torch.float16, "cuda"), _weight(27, 1, 16, 16, torch.float16, "cuda")
    b = _tensor(16, torch.float16, "cuda", seed=4).requires_grad_()
    out = relational_conv(x, w, rmap, bias=b, activation="relu")
    (gb,) = torch.autograd.grad(out.float().sum(), b)
    torch.testing.assert_close(gb.float(), (out > 0).float().sum(0), rtol=1e-3, atol=0)
    assert rmap.has_pairs == had_pairs


def _cuda_kernels(fn):
    """Names of the CUDA kernels `fn` launches (memsets and copies left out)."""
    names = cuda_kernels(fn)
    return [n for n in names if "memset" not in n.lower() and "memcpy" not in n.lower()]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cuda_cached_conv_bias_relu_is_one_kernel(dtype):
    coords = _voxel_coords(6000, 24)
    x = VoxelTensor(_tensor((coords.shape[0], 32), dtype, "cuda"), coords)
    conv = Conv3d(32, 32, 3, bias=True, activation="relu").to("cuda", dtype).eval()
    with torch.no_grad():
        for _ in range(3):  # builds the map (a layer this small never sorts it: SORT_WORK)
            ref = conv(x).feats
        kernels = _cuda_kernels(lambda: conv(x))
        rmap = submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1))
        unfused = (relational_conv(x.feats, conv.weight, rmap).float() + conv.bias.float()).relu()
    assert len(kernels) == 1 and "conv_forward_table" in kernels[0], kernels
    torch.testing.assert_close(ref.float(), unfused, rtol=2e-2, atol=2e-2)
