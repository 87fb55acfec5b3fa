"""Dataflow as a public choice: AUTO's rule, forced choices, and the maps a choice cannot run."""

import pytest
import torch

from relconv import RelationalMap, relational_conv
from relconv.ops import Dataflow, resolve_dataflow
from relconv.ops.reference import relational_conv_reference
from tests.conftest import allow_tf32
from tests.ops.maps import TOLERANCE, random_map, rel_error


def _voxel_like_map(device="cpu"):
    """A unique-slot map: every (relation, output) slot holds at most one input."""
    g = torch.Generator().manual_seed(0)
    filled = torch.rand(5, 40, generator=g) < 0.6
    relation, out = filled.nonzero(as_tuple=True)
    inp = torch.randint(0, 30, (out.numel(),), generator=g)
    rel_ptr = torch.zeros(6, dtype=torch.int64)
    torch.cumsum(filled.sum(1), 0, out=rel_ptr[1:])
    return RelationalMap(inp.int(), out.int(), rel_ptr, 30, 40, unique_slots=True).to(device)


@pytest.mark.parametrize(
    "dtype,unique,scale,deterministic,tf32,expected",
    [
        (torch.float16, True, False, False, False, Dataflow.OUTPUT_STATIONARY),
        (torch.bfloat16, True, False, False, False, Dataflow.OUTPUT_STATIONARY),
        (torch.float32, True, False, False, False, Dataflow.FETCH_ON_DEMAND),
        (torch.float32, True, False, False, True, Dataflow.OUTPUT_STATIONARY),
        (torch.float32, True, True, False, True, Dataflow.FETCH_ON_DEMAND),
        (torch.float64, True, False, False, True, Dataflow.FETCH_ON_DEMAND),
        (torch.float32, True, False, True, False, Dataflow.OUTPUT_STATIONARY),
        (torch.float16, False, False, False, False, Dataflow.FETCH_ON_DEMAND),
        (torch.float16, True, True, True, False, Dataflow.FETCH_ON_DEMAND),
    ],
)
def test_auto_rule(dtype, unique, scale, deterministic, tf32, expected):
    torch.use_deterministic_algorithms(deterministic)
    try:
        with allow_tf32(tf32):
            assert resolve_dataflow(Dataflow.AUTO, dtype, unique, scale) is expected
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("channels, expected", [(16, True), (32, True), (33, False), (None, False)])
def test_narrow_exact_fp32_layers_run_output_stationary(channels, expected):
    with allow_tf32(False):
        flow = resolve_dataflow(Dataflow.AUTO, torch.float32, True, False, channels)
        assert (flow is Dataflow.OUTPUT_STATIONARY) is expected
        # Not for maps the table cannot hold, nor for float64.
        pairs = Dataflow.FETCH_ON_DEMAND
        assert resolve_dataflow(Dataflow.AUTO, torch.float32, False, False, channels) is pairs
        assert resolve_dataflow(Dataflow.AUTO, torch.float64, True, False, channels) is pairs


def test_forced_choice_is_kept_and_checked():
    assert resolve_dataflow(Dataflow.FETCH_ON_DEMAND, torch.float16, True, False) is Dataflow.FETCH_ON_DEMAND
    assert (
        resolve_dataflow(Dataflow.OUTPUT_STATIONARY, torch.float32, True, False) is Dataflow.OUTPUT_STATIONARY
    )
    with pytest.raises(ValueError, match="dataflow=OUTPUT_STATIONARY needs a map"):
        resolve_dataflow(Dataflow.OUTPUT_STATIONARY, torch.float16, False, False)
    with pytest.raises(ValueError, match="no per-pair scale"):
        resolve_dataflow(Dataflow.OUTPUT_STATIONARY, torch.float16, True, True)
    with pytest.raises(TypeError, match="dataflow must be a relconv.ops.Dataflow"):
        resolve_dataflow("output_stationary", torch.float16, True, False)


def test_op_checks_the_choice_on_cpu_too():
    graph = random_map(9, 7, 3, 30)  # repeated slots and a scale: no output-stationary path
    x, w = torch.randn(9, 4), torch.randn(3, 4, 2)
    with pytest.raises(ValueError, match="dataflow=OUTPUT_STATIONARY"):
        relational_conv(x, w, graph, dataflow=Dataflow.OUTPUT_STATIONARY)
    rmap = _voxel_like_map()
    x, w = torch.randn(30, 4, dtype=torch.float64), torch.randn(5, 4, 2, dtype=torch.float64)
    ref = relational_conv_reference(x, w.unsqueeze(1), rmap)
    for flow in Dataflow:
        assert rel_error(relational_conv(x, w, rmap, dataflow=flow), ref) <= TOLERANCE[torch.float64]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_every_dataflow_agrees_on_cuda(dtype):
    rmap = _voxel_like_map("cuda")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 64, generator=g, dtype=torch.float64)
    w = torch.randn(5, 64, 32, generator=g, dtype=torch.float64) / 8
    ref = relational_conv_reference(x, w.unsqueeze(1), rmap.to("cpu"))
    xc, wc = x.to("cuda", dtype), w.to("cuda", dtype)
    for flow in Dataflow:
        out = relational_conv(xc, wc, rmap, dataflow=flow)
        assert rel_error(out, ref) <= TOLERANCE[dtype], flow
    a = relational_conv(xc, wc, rmap, dataflow=Dataflow.OUTPUT_STATIONARY)
    b = relational_conv(xc, wc, rmap, dataflow=Dataflow.OUTPUT_STATIONARY)
    assert torch.equal(a, b)  # no atomics: bitwise reproducible


@pytest.mark.cuda
@pytest.mark.parametrize("cin, cout", [(16, 32), (64, 32), (32, 64)])
def test_narrow_exact_fp32_layer_trains_like_the_reference(cin, cout):
    """AUTO runs a narrow exact fp32 forward over the table; an input gradient wider than
    EXACT_TABLE_MAX_CHANNELS goes back to the pairs, a narrow one stays on the table."""
    rmap = _voxel_like_map("cuda")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(30, cin, generator=g, dtype=torch.float64)
    w = torch.randn(5, cin, cout, generator=g, dtype=torch.float64) / 8
    up = torch.randn(40, cout, generator=g, dtype=torch.float64)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    relational_conv_reference(xr, wr.unsqueeze(1), rmap.to("cpu")).backward(up)
    with allow_tf32(False):
        xc = x.to("cuda", torch.float32).requires_grad_()
        wc = w.to("cuda", torch.float32).requires_grad_()
        out = relational_conv(xc, wc, rmap)
        out.backward(up.to("cuda", torch.float32))
    ref = relational_conv_reference(x, w.unsqueeze(1), rmap.to("cpu"))
    for got, want in ((out, ref), (xc.grad, xr.grad), (wc.grad, wr.grad)):
        assert rel_error(got, want) <= TOLERANCE[torch.float32]
