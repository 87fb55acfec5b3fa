"""GPU: CPU <-> CUDA agreement, PyG agreement on CUDA, no host sync in forward, fp16/bf16, compile."""

import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn

import relconv.graph as rg
from tests.conftest import no_host_sync
from tests.graph.graphs import features, random_graph

pytestmark = pytest.mark.cuda

CONFIGS = {
    "mean": {},
    "add": {"aggr": "add"},
    "max": {"aggr": "max"},
    "bases": {"num_bases": 3},
    "blocks": {"num_blocks": 2},
}


def _pair(kwargs, featureless, dtype=torch.float64):
    torch.manual_seed(0)
    cpu = rg.RGCNConv(300 if featureless else 8, 6, 7, **kwargs).to(dtype)
    gpu = rg.RGCNConv(300 if featureless else 8, 6, 7, **kwargs).to("cuda", dtype)
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("featureless", [False, True])
def test_cpu_cuda_agree(config, featureless):
    if featureless and config == "blocks":
        pytest.skip("blocks need features")
    ei, et = random_graph(300, 300, 3000, 7)
    ew = torch.rand(ei.size(1), dtype=torch.float64)
    cpu, gpu = _pair(CONFIGS[config], featureless)
    x = None if featureless else features(300, 8, dtype=torch.float64).requires_grad_()
    xg = None if featureless else x.detach().cuda().requires_grad_()
    out_c = cpu(x, ei, et, ew)
    out_g = gpu(xg, ei.cuda(), et.cuda(), ew.cuda())
    torch.testing.assert_close(out_g.cpu(), out_c)
    g = torch.randn_like(out_c)
    out_c.backward(g)
    out_g.backward(g.cuda())
    for (name, a), (_, b) in zip(cpu.named_parameters(), gpu.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad.cpu(), a.grad, msg=name)
    if x is not None:
        torch.testing.assert_close(xg.grad.cpu(), x.grad)


@pytest.mark.parametrize("aggr", ["mean", "add"])
@pytest.mark.parametrize("pyg_cls", [pyg_nn.RGCNConv, pyg_nn.FastRGCNConv], ids=["RGCNConv", "FastRGCNConv"])
def test_matches_pyg_on_cuda(aggr, pyg_cls):
    ei, et = random_graph(300, 300, 3000, 7)
    ei, et = ei.cuda(), et.cuda()
    torch.manual_seed(0)
    ref = pyg_cls(8, 6, 7, aggr=aggr).cuda()
    ours = rg.RGCNConv(8, 6, 7, aggr=aggr).cuda()
    ours.load_state_dict(ref.state_dict())
    x = features(300, 8).cuda()
    torch.testing.assert_close(ours(x, ei, et), ref(x, ei, et), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("featureless", [False, True])
def test_forward_never_syncs(config, featureless):
    if featureless and config == "blocks":
        pytest.skip("blocks need features")
    ei, et = random_graph(300, 300, 3000, 7)
    ei, et = ei.cuda(), et.cuda()
    _, layer = _pair(CONFIGS[config], featureless, torch.float32)
    x = None if featureless else features(300, 8).cuda()
    ew = torch.rand(ei.size(1), device="cuda")
    expected = layer(x, ei, et, ew)  # builds and caches the map (may sync)
    prebuilt = rg.build_rgcn_map(ei, et, 300, 7, layer.aggr)
    with no_host_sync():
        cached = layer(x, ei, et, ew)
        given = layer(x, prebuilt, None, ew)
    torch.testing.assert_close(cached, expected)
    torch.testing.assert_close(given, expected)


@pytest.mark.parametrize("aggr", ["mean", "add"])
def test_fresh_map_build_waits_only_inside_its_op(aggr):
    """Building a mean or add map (sizes given) is one op whose single host wait, for the range
    check's word, happens inside it: torch sees no synchronising call."""
    ei, et = random_graph(300, 300, 3000, 7)
    ei, et = ei.cuda(), et.cuda()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            m = rg.build_rgcn_map(ei, et, 300, 7, aggr)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # the first use of the debug mode also warns that it is a prototype: not a synchronisation
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    assert syncs == [], [str(w.message) for w in syncs]
    ref = rg.build_rgcn_map(ei.cpu(), et.cpu(), 300, 7, aggr)
    assert torch.equal(m.rmap.rel_ptr.cpu(), ref.rmap.rel_ptr)
    if aggr == "mean":
        torch.testing.assert_close(m.rmap.scale.cpu(), ref.rmap.scale, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("config", ["mean", "max", "bases", "blocks"])
def test_half_precision_and_autocast(dtype, config):
    ei, et = random_graph(300, 300, 3000, 7)
    ei, et = ei.cuda(), et.cuda()
    _, ref = _pair(CONFIGS[config], False, torch.float32)
    x = features(300, 8).cuda()
    expected = ref(x, ei, et)
    half = rg.RGCNConv(8, 6, 7, **CONFIGS[config]).to("cuda", dtype)
    half.load_state_dict(ref.state_dict())
    xh = x.to(dtype).requires_grad_()
    out = half(xh, ei, et)
    assert out.dtype == dtype
    out.float().square().sum().backward()
    assert torch.isfinite(xh.grad).all() and torch.isfinite(half.weight.grad).all()
    torch.testing.assert_close(out.float(), expected, atol=5e-2, rtol=5e-2)
    with torch.autocast("cuda", dtype=dtype):
        out = ref(x, ei, et)
    torch.testing.assert_close(out.float(), expected, atol=5e-2, rtol=5e-2)
    out.float().sum().backward()
    assert ref.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("config", ["mean", "max", "bases", "blocks"])
def test_compile_on_cuda(config):
    torch._dynamo.reset()
    ei, et = random_graph(300, 300, 3000, 7)
    _, layer = _pair(CONFIGS[config], False, torch.float32)
    graph = rg.build_rgcn_map(ei.cuda(), et.cuda(), 300, 7, layer.aggr)
    x = features(300, 8).cuda()
    compiled = torch.compile(layer, fullgraph=True)
    torch.testing.assert_close(compiled(x, graph), layer(x, graph))
