"""torch.export and AOTInductor of a MinkUNet and an R-GCN: the exported programs equal eager."""

import pytest
import torch

from relconv.export import GraphExport, export_minkunet, export_rgcn, voxel_export_check
from relconv.graph import RGCNConv
from relconv.voxel import VoxelTensor
from relconv.voxel.models import MinkUNet
from relconv.voxel.nn import inference_folding
from tests.conftest import DEVICES


class RGCN(torch.nn.Module):
    """Two RGCNConv layers over one graph (its `RGCNMap`)."""

    def __init__(self, channels: int, hidden: int, classes: int, relations: int) -> None:
        super().__init__()
        self.conv1 = RGCNConv(channels, hidden, relations)
        self.conv2 = RGCNConv(hidden, classes, relations)

    def forward(self, x, graph):
        return self.conv2(self.conv1(x, graph).relu(), graph)


def _scene(num_points: int, extent: int, device: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    xyz = torch.unique(torch.randint(-extent, extent, (num_points, 3), generator=g), dim=0)
    batch = torch.randint(0, 2, (xyz.shape[0], 1), generator=g)
    coords = torch.unique(torch.cat([batch, xyz], 1), dim=0).int().to(device)
    feats = torch.randn(coords.shape[0], 4, generator=g).to(device)
    return feats, coords


def _graph(num_nodes: int, num_edges: int, relations: int, device: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, 8, generator=g).to(device)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=g).to(device)
    edge_type = torch.randint(0, relations, (num_edges,), generator=g).to(device)
    return x, edge_index, edge_type


def _minkunet(device: str) -> MinkUNet:
    torch.manual_seed(0)
    model = MinkUNet(4, 5, width=0.25).to(device).eval()
    for m in model.modules():  # non-trivial running statistics
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model


def _eager_voxel(model, feats, coords):
    with torch.no_grad(), inference_folding(False):
        return model(VoxelTensor(feats, coords))


def _rgcn(device: str) -> RGCN:
    torch.manual_seed(0)
    return RGCN(8, 16, 5, 4).to(device).eval()


def _eager_graph(model, x, edge_index, edge_type):
    with torch.no_grad():
        return GraphExport(model, 4)(x, edge_index, edge_type)


def _eager_graph_pyg_style(model, x, edge_index, edge_type):
    """The same stack called as RGCNConv is called in eager code: edge_index and edge_type."""
    with torch.no_grad():
        h = model.conv1(x, edge_index, edge_type).relu()
        return model.conv2(h, edge_index, edge_type)


@pytest.mark.parametrize("device", DEVICES)
def test_export_minkunet_matches_eager_on_new_scenes(device):
    model = _minkunet(device)
    ep = export_minkunet(model, *_scene(500, 12, device, seed=0))
    run = ep.module()
    for seed, points in ((1, 300), (2, 900)):  # other voxel counts and coarse levels
        feats, coords = _scene(points, 14, device, seed)
        voxel_export_check(coords)
        torch.testing.assert_close(
            run(feats, coords), _eager_voxel(model, feats, coords), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("device", DEVICES)
def test_export_rgcn_matches_eager_on_new_graphs(device):
    model = _rgcn(device)
    ep = export_rgcn(model, *_graph(40, 150, 4, device, seed=0), num_relations=4)
    run = ep.module()
    for seed, (n, e) in ((1, (30, 90)), (2, (70, 400))):
        args = _graph(n, e, 4, device, seed)
        expected = _eager_graph_pyg_style(model, *args)
        torch.testing.assert_close(run(*args), expected, rtol=1e-5, atol=1e-5)


def test_voxel_export_check_rejects_what_the_exported_builder_assumes_away():
    feats, coords = _scene(50, 5, "cpu", seed=0)
    with pytest.raises(ValueError, match="duplicate"):
        voxel_export_check(torch.cat([coords, coords[:1]]))
    far = coords.clone()
    far[0, 1] = 1 << 20
    with pytest.raises(ValueError, match="extent"):
        voxel_export_check(far)
    bad = coords.clone()
    bad[0, 0] = -1
    with pytest.raises(ValueError, match="batch"):
        voxel_export_check(bad)


def _aoti(ep, tmp_path, name):
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    path = aoti_compile_and_package(ep, package_path=str(tmp_path / f"{name}.pt2"))
    return aoti_load_package(path)


# These load the packages in Python, on the CPU. CUDA packages run from C++ (test_cpp_loader.py):
# torch 2.11's Python loader (`aoti_load_package`) segfaults on every CUDA package on the GPU host
# (a plain nn.Linear package as well), while libtorch's loader runs them.
# AOTInductor compiles C++ kernels: ~2 min on a 2-core CPU host.
@pytest.mark.slow
def test_aoti_rgcn_matches_eager_cpu(tmp_path):
    device = "cpu"
    model = _rgcn(device)
    run = _aoti(export_rgcn(model, *_graph(40, 150, 4, device, seed=0), num_relations=4), tmp_path, "rgcn")
    args = _graph(70, 400, 4, device, seed=2)
    torch.testing.assert_close(run(*args), _eager_graph_pyg_style(model, *args), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_aoti_minkunet_matches_eager_cpu(tmp_path):
    device = "cpu"
    model = _minkunet(device)
    run = _aoti(export_minkunet(model, *_scene(500, 12, device, seed=0)), tmp_path, "minkunet")
    feats, coords = _scene(900, 14, device, seed=2)
    torch.testing.assert_close(run(feats, coords), _eager_voxel(model, feats, coords), rtol=1e-5, atol=1e-5)
