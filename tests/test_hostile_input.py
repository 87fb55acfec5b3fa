"""Hostile input over the public API: each case raises a ValueError/TypeError naming the argument,
and the process (and on CUDA, the CUDA context) keeps working afterwards."""

import pytest
import torch

import relconv
import relconv.graph as rg
from relconv import RelationalMap
from relconv.voxel import Conv3d, VoxelTensor, conv3d, submanifold_map, voxelize
from tests.conftest import DEVICES

ERRORS = (ValueError, TypeError)
# Mismatched devices need a second real device: the GPU tests pair cuda with cpu.
CUDA_ONLY = [pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


def _raises_naming(name: str, fn) -> None:
    with pytest.raises(ERRORS) as info:
        fn()
    assert name in str(info.value), f"error does not name {name!r}: {info.value}"


def _still_works(device: str) -> None:
    """A fresh op after the error: on CUDA this fails if a device-side assert poisoned the context."""
    a = torch.arange(6.0, device=device).view(2, 3)
    assert (a @ a.T).sum().item() == 83.0
    if device == "cuda":
        torch.cuda.synchronize()


def _coords(rows, device):
    return torch.tensor(rows, dtype=torch.int32, device=device)


# ---------------------------------------------------------------------------- voxelize
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_voxelize_non_finite_points(device, bad):
    points = torch.rand(10, 3, device=device)
    points[3, 1] = bad
    _raises_naming("points", lambda: voxelize(points, 0.1))
    _still_works(device)


@pytest.mark.parametrize("device", DEVICES)
def test_voxelize_past_int32(device):
    points = torch.tensor([[0.0, 0.0, 0.0], [3.0e9, 0.0, 0.0]], device=device, dtype=torch.float64)
    _raises_naming("voxel_size", lambda: voxelize(points, 1.0))
    _raises_naming("voxel_size", lambda: voxelize(points.float() * 1e3, 1e-3))
    _still_works(device)


@pytest.mark.parametrize("device", DEVICES)
def test_voxelize_negative_batch(device):
    points = torch.rand(4, 3, device=device)
    batch = torch.tensor([0, 1, -1, 0], device=device)
    _raises_naming("batch", lambda: voxelize(points, 0.1, batch=batch))
    _still_works(device)


@pytest.mark.parametrize("device", DEVICES)
def test_voxelize_empty_and_single(device):
    empty = voxelize(torch.zeros(0, 3, device=device), 0.1)
    assert empty.tensor.feats.shape == (0, 3) and empty.point_to_voxel.shape == (0,)
    one = voxelize(torch.tensor([[0.25, -0.25, 1.0]], device=device), 0.5)
    assert one.tensor.coords.tolist() == [[0, 0, -1, 2]] and one.point_to_voxel.tolist() == [0]


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_voxelize_mismatched_devices(device):
    other = "cpu"
    points = torch.rand(4, 3, device=device)
    _raises_naming(
        "batch", lambda: voxelize(points, 0.1, batch=torch.zeros(4, dtype=torch.long, device=other))
    )
    _raises_naming("feats", lambda: voxelize(points, 0.1, feats=torch.rand(4, 2, device=other)))


# ---------------------------------------------------------------------------- voxel tensors and convs
@pytest.mark.parametrize("device", DEVICES)
def test_voxel_coords_negative_batch(device):
    coords = _coords([[0, 0, 0, 0], [-1, 1, 0, 0]], device)
    feats = torch.rand(2, 4, device=device)
    _raises_naming(
        "batch", lambda: conv3d(VoxelTensor(feats, coords), torch.rand(27, 4, 2, device=device), 3)
    )
    _still_works(device)


@pytest.mark.parametrize("device", DEVICES)
def test_voxel_coords_past_int32(device):
    feats = torch.rand(2, 4, device=device)
    for bad in (2**31 + 5, -(2**31) - 5):
        coords = torch.tensor([[0, 0, 0, 0], [0, bad, 0, 0]], dtype=torch.int64, device=device)
        _raises_naming("coords", lambda coords=coords: VoxelTensor(feats, coords))
    _still_works(device)


@pytest.mark.parametrize("device", DEVICES)
def test_voxel_coords_wrong_dtype(device):
    coords = torch.tensor([[0, 0, 0, 0]], dtype=torch.float32, device=device)
    _raises_naming("coords", lambda: VoxelTensor(torch.rand(1, 4, device=device), coords))


@pytest.mark.parametrize("device", DEVICES)
def test_voxel_conv_empty_and_single(device):
    conv = Conv3d(4, 2, 3).to(device)
    for n in (0, 1):
        x = VoxelTensor(torch.rand(n, 4, device=device), _coords([[0, 5, -3, 7]][:n], device).view(n, 4))
        y = conv(x)
        assert y.feats.shape == (n, 2)
        y.feats.sum().backward()
    _still_works(device)


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_voxel_conv_mismatched_devices(device):
    other = "cpu"
    x = VoxelTensor(
        torch.rand(3, 4, device=device), _coords([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], device)
    )
    _raises_naming("weight", lambda: conv3d(x, torch.rand(27, 4, 2, device=other), 3))
    _still_works(device)


@pytest.mark.parametrize("device", DEVICES)
def test_submanifold_map_negative_batch(device):
    coords = _coords([[0, 0, 0, 0], [-2, 0, 0, 0]], device)
    _raises_naming("batch", lambda: submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1)))
    _still_works(device)


# ---------------------------------------------------------------------------- relational maps and op
@pytest.mark.parametrize("device", DEVICES)
def test_relational_map_out_of_range(device):
    idx = torch.tensor([0, 5], device=device)
    rel = torch.tensor([0, 1], device=device)
    _raises_naming("in_index", lambda: RelationalMap.from_triples(idx, idx.flip(0), rel, 3, 6, 2))
    _raises_naming("relation", lambda: RelationalMap.from_triples(idx, idx, rel + 1, 6, 6, 2))
    _still_works(device)


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_relational_conv_mismatched_devices(device):
    other = "cpu"
    idx = torch.tensor([0, 1], device=device)
    rmap = RelationalMap.from_triples(idx, idx, torch.tensor([0, 1], device=device), 2, 2, 2)
    x = torch.rand(2, 3, device=device)
    _raises_naming(
        "x", lambda: relconv.relational_conv(x.to(other), torch.rand(2, 3, 4, device=device), rmap)
    )
    _raises_naming("weight", lambda: relconv.relational_conv(x, torch.rand(2, 3, 4, device=other), rmap))
    _still_works(device)


@pytest.mark.parametrize("device", DEVICES)
def test_relational_conv_empty_and_single(device):
    w = torch.rand(2, 3, 4, device=device, requires_grad=True)
    none = torch.zeros(0, dtype=torch.long, device=device)
    empty = RelationalMap.from_triples(none, none, none, 0, 0, 2)
    assert relconv.relational_conv(torch.rand(0, 3, device=device), w, empty).shape == (0, 4)
    one = torch.zeros(1, dtype=torch.long, device=device)
    single = RelationalMap.from_triples(one, one, one + 1, 1, 1, 2)
    x = torch.rand(1, 3, device=device)
    out = relconv.relational_conv(x, w, single)
    torch.testing.assert_close(out, x @ w[1])
    out.sum().backward()
    assert w.grad[0].abs().sum() == 0


# ---------------------------------------------------------------------------- RGCNConv
@pytest.mark.parametrize("device", DEVICES)
def test_rgcn_edge_type_out_of_range(device):
    conv = rg.RGCNConv(4, 3, num_relations=3).to(device)
    x = torch.rand(5, 4, device=device)
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]], device=device)
    _raises_naming("edge_type", lambda: conv(x, ei, torch.tensor([0, 3, 1], device=device)))
    _raises_naming("edge_type", lambda: conv(x, ei, torch.tensor([0, -1, 1], device=device)))
    _still_works(device)
    out = conv(x, ei, torch.tensor([0, 2, 1], device=device))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("device", DEVICES)
def test_rgcn_edge_index_out_of_range(device):
    conv = rg.RGCNConv(4, 3, num_relations=2).to(device)
    x = torch.rand(5, 4, device=device)
    et = torch.tensor([0, 1], device=device)
    _raises_naming("edge_index", lambda: conv(x, torch.tensor([[0, 5], [1, 2]], device=device), et))
    _raises_naming("edge_index", lambda: conv(x, torch.tensor([[0, 1], [-1, 2]], device=device), et))
    _still_works(device)


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_rgcn_mismatched_devices(device):
    other = "cpu"
    conv = rg.RGCNConv(4, 3, num_relations=2).to(device)
    x = torch.rand(3, 4, device=device)
    ei = torch.tensor([[0, 1], [1, 2]], device=device)
    et = torch.tensor([0, 1], device=device)
    _raises_naming("x", lambda: conv(x.to(other), ei, et))
    _raises_naming("edge_type", lambda: conv(x, ei, et.to(other)))
    _raises_naming("edge_index", lambda: conv(x, ei.to(other), et.to(other)))
    _still_works(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("aggr", ["mean", "add", "max"])
def test_rgcn_empty_and_single(device, aggr):
    conv = rg.RGCNConv(4, 3, num_relations=2, aggr=aggr).to(device)
    x = torch.rand(2, 4, device=device)
    no_edges = conv(
        x, torch.zeros(2, 0, dtype=torch.long, device=device), torch.zeros(0, dtype=torch.long, device=device)
    )
    torch.testing.assert_close(no_edges, x @ conv.root + conv.bias)
    one = conv(x, torch.tensor([[0], [1]], device=device), torch.tensor([1], device=device))
    torch.testing.assert_close(one[1], x[1] @ conv.root + conv.bias + x[0] @ conv.weight[1])
    empty = conv(
        torch.zeros(0, 4, device=device),
        torch.zeros(2, 0, dtype=torch.long, device=device),
        torch.zeros(0, dtype=torch.long, device=device),
    )
    assert empty.shape == (0, 3)
