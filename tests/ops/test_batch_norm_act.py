"""relconv.ops.batch_norm_act and the relconv::batch_norm_act op against torch's BatchNorm (+ReLU):
output, running statistics and gradients on CPU (the op's CPU kernel and the torch fallback) and
CUDA (the kernels), plus argument errors, double backward, compile, determinism and no host sync."""

import pytest
import torch
import torch.nn.functional as F

from relconv.ops import batch_norm_act
from tests.conftest import DEVICES, no_host_sync

OP = torch.ops.relconv.batch_norm_act.default

# (rtol, atol) of the output and gradients against a float64 torch reference.
TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}


def param_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def make_inputs(n, c, dtype, device, offset=100.0, seed=0):
    """Features of O(offset) with unit-scale spread (the case raw moments get wrong), parameters,
    and running statistics near the batch ones."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, c, generator=g, dtype=torch.float64) * 2 + offset).to(dtype)
    pd = param_dtype(dtype)
    w = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(pd)
    b = torch.randn(c, generator=g, dtype=torch.float64).to(pd)
    rm = (torch.randn(c, generator=g, dtype=torch.float64) + offset).to(pd)
    rv = (torch.rand(c, generator=g, dtype=torch.float64) * 3 + 1).to(pd)
    return [t.to(device) for t in (x, w, b, rm, rv)]


def reference(x, w, b, rm, rv, training, relu, momentum=0.1, eps=1e-5):
    """torch in float64: output, and the running statistics after the call (copies updated)."""
    rm64, rv64 = rm.double().clone(), rv.double().clone()
    out = F.batch_norm(x.double(), rm64, rv64, w.double(), b.double(), training, momentum, eps)
    return (F.relu(out) if relu else out), rm64, rv64


def run_case(fn, n, c, dtype, device, training, relu):
    x, w, b, rm, rv = make_inputs(n, c, dtype, device)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    pre, rm_ref, rv_ref = reference(x64, w64, b64, rm, rv, training, relu=False)
    ref = F.relu(pre) if relu else pre
    grad = torch.randn(n, c, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    out = fn(x, w, b, rm, rv, training, relu)
    out.backward(grad.to(dtype))
    rtol, atol = TOL[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)
    if relu:
        # The ReLU's derivative follows the op's own rounded output: where it and the float64 output
        # fall on different sides of zero the pre-activation is within rounding of zero (a few of
        # 19M elements at C 256), so the reference backward takes the op's mask.
        mask = out.detach() > 0
        flipped = mask != (pre.detach() > 0)
        assert (pre.detach()[flipped].abs() <= atol + rtol * pre.detach().abs().max()).all()
        pre.backward(grad * mask)
    else:
        pre.backward(grad)
    # Running statistics are updated in the parameter dtype (float32 for half x).
    torch.testing.assert_close(rm.double(), rm_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rv.double(), rv_ref, rtol=1e-5, atol=1e-5)
    # Gradients sum over the rows: scale the tolerance with the batch.
    scale = max(1.0, n**0.5 / 10)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=rtol, atol=atol * scale)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=rtol, atol=atol * scale * 10)
    torch.testing.assert_close(b.grad.double(), b64.grad, rtol=rtol, atol=atol * scale * 10)


def via_op(x, w, b, rm, rv, training, relu):
    return OP(x, w, b, rm, rv, training, 0.1, 1e-5, relu)[0]


def via_wrapper(x, w, b, rm, rv, training, relu):
    return batch_norm_act(x, w, b, rm, rv, training, 0.1, 1e-5, relu=relu)


# ---------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("fn", [via_op, via_wrapper], ids=["op", "wrapper"])
def test_cpu_matches_torch(fn, dtype, training, relu):
    run_case(fn, 300, 5, dtype, "cpu", training, relu)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize(
    ("device", "n", "c", "offset"),
    [
        pytest.param("cpu", 9, 3, 0.5, id="cpu"),
        pytest.param("cuda", 13, 5, 0.3, id="cuda", marks=pytest.mark.cuda),
    ],
)
def test_op_gradcheck(device, n, c, offset, training, relu):
    x, w, b, rm, rv = make_inputs(n, c, torch.float64, device, offset=offset)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    # Fresh running statistics per call: gradcheck calls the function many times.
    assert torch.autograd.gradcheck(
        lambda x, w, b: OP(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5, relu)[0], (x, w, b)
    )


def test_cpu_op_without_affine_and_running_stats():
    x = make_inputs(40, 6, torch.float32, "cpu")[0].requires_grad_()
    out, mean, invstd = OP(x, None, None, None, None, True, 0.1, 1e-5, True)
    x64 = x.detach().double().requires_grad_()
    ref = F.relu(F.batch_norm(x64, None, None, training=True))
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mean.double(), x64.mean(0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        invstd.double(), (x64.var(0, unbiased=False) + 1e-5).rsqrt(), rtol=1e-5, atol=1e-5
    )
    g = torch.randn_like(ref)
    out.backward(g.float())
    ref.backward(g)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-4)


def test_cpu_saved_statistics_shapes():
    x, w, b, rm, rv = make_inputs(8, 4, torch.float16, "cpu")
    _, mean, invstd = OP(x, w, b, rm, rv, True, 0.1, 1e-5, False)
    assert mean.shape == invstd.shape == (4,) and mean.dtype == torch.float32
    _, mean, invstd = OP(x, w, b, rm, rv, False, 0.1, 1e-5, False)
    assert mean.shape == invstd.shape == (0,)


def test_running_stats_version_bumped_and_eval_backward_guarded():
    x, w, b, rm, rv = make_inputs(16, 3, torch.float32, "cpu")
    x.requires_grad_()
    version = rm._version
    OP(x, w, b, rm, rv, True, 0.1, 1e-5, False)
    assert rm._version > version
    # An eval call saves the running statistics; a training call changing them before the
    # backward makes that backward fail, as with torch's BatchNorm.
    out = OP(x, w, b, rm, rv, False, 0.1, 1e-5, False)[0]
    OP(x.detach(), w, b, rm, rv, True, 0.1, 1e-5, False)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_double_backward_raises():
    x, w, b, rm, rv = make_inputs(10, 3, torch.float64, "cpu")
    x.requires_grad_()
    out = OP(x, w, b, rm, rv, True, 0.1, 1e-5, False)[0]
    (gx,) = torch.autograd.grad((out * out).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        gx.sum().backward()


def test_needs_input_grad_subsets():
    x, w, b, rm, rv = make_inputs(20, 4, torch.float32, "cpu")
    b.requires_grad_()
    OP(x, w, b, rm, rv, True, 0.1, 1e-5, True)[0].sum().backward()
    assert b.grad is not None and w.grad is None and x.grad is None
    x2, _, b2, rm2, rv2 = make_inputs(20, 4, torch.float32, "cpu")
    x2.requires_grad_()
    ref_out = OP(x2, None, b2, rm2, rv2, True, 0.1, 1e-5, False)[0]
    ref_out.sum().backward()
    # sum over rows of a batch-normalised output has zero gradient in x.
    torch.testing.assert_close(x2.grad, torch.zeros_like(x2), atol=1e-4, rtol=0)


def test_cpu_two_rows():
    run_case(via_op, 2, 3, torch.float32, "cpu", True, True)


def test_cpu_empty_batch():
    x, w, b, rm, rv = make_inputs(0, 3, torch.float32, "cpu")
    rm0 = rm.clone()
    out, _, _ = OP(x.requires_grad_(), w, b, rm, rv, True, 0.1, 1e-5, False)
    assert out.shape == (0, 3)
    assert torch.equal(rm, rm0)
    out.sum().backward()
    assert x.grad.shape == (0, 3)


@pytest.mark.parametrize("fn", [via_op, via_wrapper], ids=["op", "wrapper"])
def test_one_row_in_training_raises_value_error(fn):
    x, w, b, rm, rv = make_inputs(1, 3, torch.float32, "cpu")
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        fn(x, w, b, rm, rv, True, False)
    fn(x, w, b, rm, rv, False, False)  # eval mode takes one row


@pytest.mark.parametrize("fn", [via_op, via_wrapper], ids=["op", "wrapper"])
@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: a.update(w=a["w"][:2]), "weight must have shape"),
        (lambda a: a.update(b=a["b"].reshape(1, 3)), "bias must have shape"),
        (lambda a: a.update(rv=None), "running_mean and running_var must be given together"),
        (lambda a: a.update(rm=None, rv=None, training=False), "required when training=False"),
        (lambda a: a.update(x=a["x"].reshape(-1)), "x must be"),
    ],
)
def test_bad_arguments(fn, change, match):
    x, w, b, rm, rv = make_inputs(6, 3, torch.float32, "cpu")
    args = dict(x=x, w=w, b=b, rm=rm, rv=rv, training=True)
    change(args)
    with pytest.raises(ValueError, match=match):
        fn(args["x"], args["w"], args["b"], args["rm"], args["rv"], args["training"], False)


def test_op_rejects_mismatched_parameter_dtypes():
    x, w, b, rm, rv = make_inputs(6, 3, torch.float32, "cpu")
    with pytest.raises(ValueError, match="weight must be Float"):
        OP(x, w.double(), b, rm, rv, True, 0.1, 1e-5, False)
    xh = x.half()
    with pytest.raises(ValueError, match="bias dtype"):
        OP(xh, w, b.half(), rm, rv, True, 0.1, 1e-5, False)


def test_wrapper_type_errors():
    x, w, b, rm, rv = make_inputs(6, 3, torch.float32, "cpu")
    with pytest.raises(TypeError, match="momentum"):
        batch_norm_act(x, w, b, rm, rv, True, momentum=None)
    with pytest.raises(TypeError, match="weight"):
        batch_norm_act(x, [1.0, 1.0, 1.0], b, rm, rv, True)
    with pytest.raises(ValueError, match="x must be a 2-D tensor"):
        batch_norm_act("x", w, b, rm, rv, True)


def counted_op(x, w, b, rm, rv, training, counter):
    return OP(x, w, b, rm, rv, training, 0.1, 1e-5, False, counter)[0]


def counted_wrapper(x, w, b, rm, rv, training, counter):
    return batch_norm_act(x, w, b, rm, rv, training, num_batches_tracked=counter)


COUNTED = [counted_op, counted_wrapper]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn", COUNTED, ids=["op", "wrapper"])
def test_num_batches_tracked_counts_training_calls(device, fn):
    """torch's BatchNorm counter: +1 per training call (an empty batch too), unchanged in eval."""
    x, w, b, rm, rv = make_inputs(40, 3, torch.float32, device)
    counter = torch.tensor(5, dtype=torch.int64, device=device)
    for _ in range(3):
        fn(x, w, b, rm, rv, True, counter)
    fn(x, w, b, rm, rv, False, counter)
    fn(x[:0], w, b, rm, rv, True, counter)
    assert counter.item() == 9


@pytest.mark.parametrize("fn", COUNTED, ids=["op", "wrapper"])
@pytest.mark.parametrize(
    "counter", [torch.tensor(0.0), torch.zeros(2, dtype=torch.int64)], ids=["float", "two-elements"]
)
def test_bad_num_batches_tracked(fn, counter):
    x, w, b, rm, rv = make_inputs(6, 3, torch.float32, "cpu")
    with pytest.raises(ValueError, match="num_batches_tracked must be an int64 tensor of one element"):
        fn(x, w, b, rm, rv, True, counter)


@pytest.mark.cuda
@pytest.mark.parametrize("fn", COUNTED, ids=["op", "wrapper"])
def test_num_batches_tracked_on_another_device(fn):
    x, w, b, rm, rv = make_inputs(6, 3, torch.float32, "cpu")
    with pytest.raises(ValueError, match="num_batches_tracked must be on cpu"):
        fn(x, w, b, rm, rv, True, torch.zeros((), dtype=torch.int64, device="cuda"))


def test_opcheck_cpu():
    x, w, b, rm, rv = make_inputs(12, 4, torch.float32, "cpu")
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    for training in (True, False):
        torch.library.opcheck(OP, (x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5, True))
        torch.library.opcheck(OP, (x, None, None, rm.clone(), rv.clone(), training, 0.1, 1e-5, False))
        counter = torch.zeros((), dtype=torch.int64)
        torch.library.opcheck(OP, (x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5, False, counter))


@pytest.mark.parametrize("training", [True, False])
def test_compile_matches_eager(training):
    x, w, b, rm, rv = make_inputs(30, 4, torch.float32, "cpu")
    rm_c, rv_c = rm.clone(), rv.clone()

    def f(x, w, b, rm, rv):
        return OP(x, w, b, rm, rv, training, 0.1, 1e-5, True)[0] * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = f(xe, w, b, rm, rv)
    out = compiled(xc, w, b, rm_c, rv_c)
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close(rm_c, rm)
    torch.testing.assert_close(rv_c, rv)
    eager.sum().backward()
    out.sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)


# ---------------------------------------------------------------------------- CUDA

CUDA_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize(
    ("n", "c"),
    # 300k x 16: hundreds of blocks in one channel tile, summed in groups whose last one is short.
    [(2, 1), (7, 3), (1000, 32), (1000, 96), (75_000, 256), (300_000, 16), (1000, 5), (300, 1000)],
)
def test_cuda_matches_torch(n, c, dtype, training, relu):
    run_case(via_wrapper, n, c, dtype, "cuda", training, relu)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_parameters(dtype):
    """Parameters and running statistics in x's half dtype (a .half() model)."""
    x, w, b, rm, rv = make_inputs(500, 16, dtype, "cuda")
    w, b, rm, rv = (t.to(dtype) for t in (w, b, rm, rv))
    ref_rm, ref_rv = rm.clone(), rv.clone()
    out = batch_norm_act(x, w, b, rm, rv, True, relu=True)
    ref = F.relu(F.batch_norm(x, ref_rm, ref_rv, w, b, True))
    torch.testing.assert_close(out, ref, rtol=TOL[dtype][0], atol=TOL[dtype][1])
    torch.testing.assert_close(rm, ref_rm, rtol=1e-2, atol=1e-1)


@pytest.mark.cuda
def test_cuda_unaligned_and_noncontiguous():
    """Rows not 16-byte aligned take the scalar path; a non-contiguous x is made contiguous."""
    x, w, b, rm, rv = make_inputs(401, 33, torch.float32, "cuda")
    base = torch.empty(401 * 33 + 1, device="cuda")
    shifted = base[1:].view(401, 33)
    shifted.copy_(x)
    torch.testing.assert_close(
        batch_norm_act(shifted, w, b, rm.clone(), rv.clone(), True),
        F.batch_norm(x, rm.clone(), rv.clone(), w, b, True),
        rtol=1e-4,
        atol=1e-4,
    )
    xt = x.t().contiguous().t()
    torch.testing.assert_close(
        batch_norm_act(xt, w, b, rm.clone(), rv.clone(), True),
        F.batch_norm(x, rm.clone(), rv.clone(), w, b, True),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.cuda
@pytest.mark.parametrize("n", [0, 1])
def test_cuda_tiny_batches(n):
    x, w, b, rm, rv = make_inputs(n, 8, torch.float32, "cuda")
    if n == 1:
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            batch_norm_act(x, w, b, rm, rv, True)
        out = batch_norm_act(x, w, b, rm, rv, False)
        torch.testing.assert_close(out, F.batch_norm(x, rm, rv, w, b, False))
        return
    rm0 = rm.clone()
    x.requires_grad_()
    out = batch_norm_act(x, w, b, rm, rv, True, relu=True)
    assert out.shape == (0, 8) and torch.equal(rm, rm0)
    out.sum().backward()
    assert x.grad.shape == (0, 8)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_bitwise_reproducible(dtype):
    def run():
        x, w, b, rm, rv = make_inputs(75_000, 64, dtype, "cuda")
        x, w, b = (t.requires_grad_() for t in (x, w, b))
        out = batch_norm_act(x, w, b, rm, rv, True, relu=True)
        out.backward(torch.ones_like(out).mul_(0.01).add_(out.detach()))
        return out, x.grad, w.grad, b.grad, rm, rv

    for first, second in zip(run(), run(), strict=True):
        assert torch.equal(first, second)


@pytest.mark.cuda
@pytest.mark.parametrize("training", [True, False])
def test_cuda_no_host_sync(training):
    x, w, b, rm, rv = make_inputs(5000, 32, torch.float16, "cuda")
    ref, _, _ = reference(x, w, b, rm, rv, training, relu=True)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    grad = torch.randn(5000, 32, device="cuda", dtype=torch.float16)
    with no_host_sync():
        out = batch_norm_act(x, w, b, rm, rv, training, relu=True)
        out.backward(grad)
    rtol, atol = TOL[torch.float16]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)
    assert all(t.grad is not None and t.grad.isfinite().all() for t in (x, w, b))


@pytest.mark.cuda
def test_cuda_autocast_runs_in_x_dtype():
    """As torch's BatchNorm under autocast: x's dtype in, x's dtype out, float32 parameters."""
    for dtype in (torch.float32, torch.float16):
        x, w, b, rm, rv = make_inputs(200, 8, dtype, "cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            out = batch_norm_act(x, w, b, rm.clone(), rv.clone(), True)
            ref = F.batch_norm(x, rm.clone(), rv.clone(), w, b, True)
        assert out.dtype == ref.dtype == dtype
        torch.testing.assert_close(out, ref, rtol=TOL[dtype][0], atol=TOL[dtype][1])


@pytest.mark.cuda
def test_cuda_opcheck():
    x, w, b, rm, rv = make_inputs(64, 16, torch.float32, "cuda")
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    for training in (True, False):
        torch.library.opcheck(OP, (x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5, True))


@pytest.mark.cuda
def test_cuda_streams_and_graph_capture():
    """The reduction tickets are kept per stream and cleared by the kernels themselves: calls that
    alternate between streams, and a CUDA graph captured and replayed, match eager calls bitwise."""
    x, w, b, rm, rv = make_inputs(30_000, 96, torch.float16, "cuda")
    grad = torch.randn_like(x)

    def run(rm, rv):
        xg, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))
        out = batch_norm_act(xg, wg, bg, rm, rv, True, relu=True)
        out.backward(grad)
        return out.detach(), xg.grad, wg.grad, bg.grad

    expected = run(rm.clone(), rv.clone())
    side = torch.cuda.Stream()
    for stream in (side, torch.cuda.current_stream(), side):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            got = run(rm.clone(), rv.clone())
        torch.cuda.current_stream().wait_stream(side)
        for a, e in zip(got, expected, strict=True):
            assert torch.equal(a, e)

    static_x = x.clone()
    rm_g, rv_g = rm.clone(), rv.clone()
    graph = torch.cuda.CUDAGraph()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        batch_norm_act(static_x, w, b, rm_g.clone(), rv_g.clone(), True)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        static_out = batch_norm_act(static_x, w, b, rm_g, rv_g, True, relu=True)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, expected[0])
    assert torch.equal(batch_norm_act(x, w, b, rm.clone(), rv.clone(), True, relu=True), expected[0])


@pytest.mark.cuda
def test_cuda_bad_device():
    x, w, b, rm, rv = make_inputs(6, 3, torch.float32, "cuda")
    with pytest.raises(ValueError, match="weight must be on"):
        batch_norm_act(x, w.cpu(), b, rm, rv, True)
