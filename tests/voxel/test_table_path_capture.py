"""The fp16/bf16 neighbour-table path (the voxel default on CUDA) under CUDA-graph capture,
torch.compile(fullgraph=True) and sync-debug mode: a forward over a cached map never synchronises."""

import pytest
import torch
from voxel_refs import random_voxels

from relconv.ops import Dataflow, relational_conv, resolve_dataflow
from relconv.voxel import Conv3d, submanifold_map
from tests.conftest import no_host_sync

pytestmark = pytest.mark.cuda

HALF = [torch.float16, torch.bfloat16]
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _scene(dtype, channels=16):
    x = random_voxels(4000, 24, channels, batch=2, seed=7).to("cuda")
    return x.replace_feature(x.feats.to(dtype))


def _table_map(x):
    rmap = submanifold_map(x.coords, (3, 3, 3), (1, 1, 1), (1, 1, 1))
    channels = x.feats.shape[1]
    flow = resolve_dataflow(Dataflow.AUTO, x.feats.dtype, rmap.unique_slots, rmap.scale is not None, channels)
    assert flow is Dataflow.OUTPUT_STATIONARY, "the table path must be the one tested"
    return rmap


def _close(a, b, dtype):
    torch.testing.assert_close(a.float(), b.float(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", HALF)
def test_table_forward_under_cuda_graph_capture(dtype):
    x = _scene(dtype)
    rmap = _table_map(x)
    w = torch.randn(27, 16, 32, device="cuda", dtype=dtype) / 8
    static = x.feats.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        relational_conv(static, w, rmap)  # warm-up: builds and caches the neighbour table
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = relational_conv(static, w, rmap)
    fresh = torch.randn_like(static)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    _close(captured, relational_conv(fresh, w, rmap), dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_conv3d_module_under_cuda_graph_capture(dtype):
    """The front end too: with its maps cached on the tensor, a Conv3d forward is capturable."""
    x = _scene(dtype)
    conv = Conv3d(16, 32, 3).to("cuda", dtype)
    static = x.feats.clone()
    xs = x.replace_feature(static)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        conv(xs)  # warm-up: builds the kernel map and its neighbour table
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        captured = conv(xs).feats
    static.copy_(torch.randn_like(static))
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        _close(captured, conv(xs).feats, dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_table_path_compiles_fullgraph(dtype):
    x = _scene(dtype)
    rmap = _table_map(x)
    w = (torch.randn(27, 16, 32, device="cuda", dtype=dtype) / 8).requires_grad_()
    feats = x.feats.clone().requires_grad_()

    def step(f, weight):
        return relational_conv(f, weight, rmap)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    out_c = compiled(feats, w)
    out_e = step(feats, w)
    _close(out_c, out_e, dtype)
    g = torch.randn_like(out_e)
    grads_c = torch.autograd.grad(out_c, (feats, w), g)
    grads_e = torch.autograd.grad(out_e, (feats, w), g)
    for a, b in zip(grads_c, grads_e, strict=True):
        _close(a, b, dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_forward_over_cached_map_does_not_sync(dtype):
    x = _scene(dtype)
    rmap = _table_map(x)
    w = torch.randn(27, 16, 32, device="cuda", dtype=dtype) / 8
    conv = Conv3d(16, 32, 3).to("cuda", dtype)
    with torch.no_grad():
        relational_conv(x.feats, w, rmap)
        conv(x)  # builds and caches the front end's map
    with no_host_sync(), torch.no_grad():
        out = relational_conv(x.feats, w, rmap)
        y = conv(x)
    ref = relational_conv(x.feats.float().cpu(), w.float().cpu(), rmap.to("cpu"))
    _close(out.cpu(), ref, dtype)
    assert y.feats.shape == (len(x), 32) and y.feats.dtype == dtype
