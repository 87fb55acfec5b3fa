"""relconv.torchsparse.nn.Conv3d / functional.conv3d against dense convolutions over densified
inputs (TorchSparse's kernel layout rearranged) and relconv's native Conv3d: output sites, features,
input and weight gradients."""

from __future__ import annotations

import math

import pytest
import torch

import relconv.torchsparse as torchsparse
import relconv.torchsparse.nn as spnn
import relconv.torchsparse.nn.functional as tsF
import relconv.torchsparse.nn.functional.conv as ts_conv
from relconv.torchsparse._layout import relconv_geometry
from relconv.voxel import Conv3d as VoxelConv3d
from relconv.voxel import VoxelTensor
from tests.compat.torchsparse_refs import dense_conv, dense_transposed, scene, strided_sites
from tests.conftest import DEVICES

GRID, BATCH = 9, 2


def _layer(cin, cout, kernel_size, **kw):
    layer = spnn.Conv3d(cin, cout, kernel_size, **kw).double()
    with torch.no_grad():
        layer.kernel.normal_()
        if layer.bias is not None:
            layer.bias.normal_()
    return layer


@pytest.fixture(params=["relabelled", "converted"])
def kernel_path(request, monkeypatch):
    """Each conv both ways, whatever autograd says: TorchSparse's kernel as it is over the map
    relabelled to its offset order (training's path), and the kernel converted to relconv's order
    (inference's)."""
    forced = request.param == "relabelled"
    monkeypatch.setattr(ts_conv, "relabels", lambda kernel: forced)


def _grads(x, out, ref, layer):
    """Input and kernel gradients of sum(out * g) from the shim and from the dense reference."""
    g = torch.randn_like(out.feats)
    got = torch.autograd.grad((out.feats * g).sum(), (x.feats, layer.kernel))
    want = torch.autograd.grad((ref * g).sum(), (x.feats, layer.kernel))
    return got, want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kernel_size",
    [3, 2, (3, 1, 3), (1, 1, 3), (3, 3, 2), 5, (2, 3, 3)],
    ids=lambda k: str(k),
)
def test_submanifold_matches_dense(device, kernel_size, kernel_path):
    x = scene(device=device)
    x.feats.requires_grad_(True)
    layer = _layer(3, 4, kernel_size, bias=True).to(device)
    out = layer(x)
    assert out.coords is x.coords and out.stride == (1, 1, 1)
    k = layer.kernel_size
    lows = tuple(-((s - 1) // 2) for s in k) if math.prod(k) % 2 else (0, 0, 0)
    ref = dense_conv(x, layer.kernel, k, 1, lows, x.coords, BATCH, GRID) + layer.bias
    torch.testing.assert_close(out.feats, ref)
    got, want = _grads(x, out, ref, layer)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("kernel_size", "stride", "padding"),
    [
        (2, 2, 0),  # MinkUNet / SparseResUNet42 downsampling
        (3, 2, 0),  # SparseResNet21D downsampling: offsets 0..2
        (3, 2, 1),  # centred
        ((1, 3, 1), (1, 2, 1), 0),  # SparseResNet21D's last stage
        (1, 2, 0),  # [1, C_in, C_out] kernel
        (3, 3, 1),
        (2, (2, 1, 2), 1),
        (3, 2, 5),  # padding past the kernel: offsets -5..-3
    ],
    ids=str,
)
def test_strided_matches_dense(device, kernel_size, stride, padding, kernel_path):
    x = scene(device=device)
    x.feats.requires_grad_(True)
    layer = _layer(3, 5, kernel_size, stride=stride, padding=padding).to(device)
    out = layer(x)
    k, s, p = layer.kernel_size, layer.stride, layer.padding
    sites = strided_sites(x.coords, k, s, p)
    assert torch.equal(out.coords.cpu(), sites)
    assert out.stride == s and out.C is out.coords
    ref = dense_conv(x, layer.kernel, k, s, tuple(-v for v in p), out.coords, BATCH, GRID)
    torch.testing.assert_close(out.feats, ref)
    got, want = _grads(x, out, ref, layer)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_strided_drops_the_top_sites_torchsparse_drops():
    # One voxel at x = 8 (even): TorchSparse's bound (8 - 1) // 2 = 3 leaves it without an output.
    coords = torch.tensor([[0, 8, 0, 0], [0, 1, 1, 1]], dtype=torch.int32)
    x = torchsparse.SparseTensor(torch.ones(2, 1), coords)
    out = spnn.Conv3d(1, 1, 2, stride=2)(x)
    assert out.coords.tolist() == [[0, 0, 0, 0]]


def test_spatial_range_bounds_and_propagates():
    x = scene()
    x.spatial_range = (BATCH, 16, 16, 16)
    x = _layer(3, 3, 3)(x)  # a stride-1 conv records (coords, spatial_range) of stride 1, as TorchSparse
    assert x.spatial_range == (BATCH, 16, 16, 16)
    layer = _layer(3, 2, 2, stride=2)
    out = layer(x)
    assert out.spatial_range == (BATCH, 8, 8, 8)
    assert torch.equal(
        out.coords, strided_sites(x.coords, (2, 2, 2), (2, 2, 2), (0, 0, 0), (BATCH, 16, 16, 16))
    )
    # the top site floor(8 / 2) = 4 survives when the range covers it
    assert int(out.coords[:, 1:].max()) == 4
    sub = _layer(2, 2, 3)(out)
    assert sub.spatial_range == (BATCH, 8, 8, 8)
    up = _layer(2, 3, 2, stride=2, transposed=True)(sub)
    assert up.spatial_range == (BATCH, 16, 16, 16) and torch.equal(up.coords, x.coords)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_conv_takes_its_grid_from_the_spatial_range(device):
    # A range equal to the sites' own extent gives the sites and features of the conv without one
    layer = _layer(3, 4, 3, stride=2).to(device)
    x = scene(device=device)
    ranged = scene(device=device)
    ranged.spatial_range = (BATCH, *(int(v) + 1 for v in x.coords[:, 1:].amax(0).tolist()))
    want, got = layer(x), layer(ranged)
    assert torch.equal(got.coords, want.coords)
    torch.testing.assert_close(got.feats, want.feats)
    # sites outside the range are an error, not a silently cropped map
    outside = scene(device=device)
    outside.spatial_range = (BATCH, GRID - 2, GRID, GRID)
    with pytest.raises(ValueError, match="must lie inside spatial_shape"):
        layer(outside)
    too_few_batches = scene(device=device)
    too_few_batches.spatial_range = (BATCH - 1, GRID, GRID, GRID)
    with pytest.raises(ValueError, match="batch indices"):
        layer(too_few_batches)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("kernel_size", "padding"), [(2, 0), (3, 0), (3, 1)])
def test_transposed_reuses_the_strided_map(device, kernel_size, padding, kernel_path):
    x = scene(device=device)
    down = _layer(3, 4, kernel_size, stride=2, padding=padding).to(device)
    coarse = down(x)
    coarse.feats = coarse.feats.detach().requires_grad_(True)
    # The transposed conv's own padding is irrelevant: it runs the strided conv's map.
    up = _layer(4, 3, kernel_size, stride=2, transposed=True).to(device)
    out = up(coarse)
    assert out.coords is x.coords and out.stride == (1, 1, 1)
    lows = (-padding,) * 3
    ref = dense_transposed(coarse, up.kernel, down.kernel_size, 2, lows, x.coords, BATCH, GRID)
    torch.testing.assert_close(out.feats, ref)
    got, want = _grads(coarse, out, ref, up)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_transposed_without_its_strided_conv_raises():
    x = scene()
    x.stride = 2
    with pytest.raises(ValueError, match="map of the strided conv"):
        _layer(3, 3, 2, stride=2, transposed=True)(x)


@pytest.mark.parametrize("kernel_size", [3, (3, 1, 3), 2])
def test_equals_relconv_native_conv_with_reordered_weight(kernel_size):
    x = scene()
    layer = _layer(3, 4, kernel_size)
    out = layer(x)
    k = layer.kernel_size
    native = VoxelConv3d(3, 4, k).double()
    with torch.no_grad():
        if math.prod(k) % 2:  # TorchSparse: x fastest; relconv: z fastest
            w = layer.kernel.reshape(k[2], k[1], k[0], 3, 4).permute(2, 1, 0, 3, 4).reshape(-1, 3, 4)
        else:
            w = layer.kernel
        native.weight.copy_(w)
    want = native(VoxelTensor(x.feats, x.coords))
    torch.testing.assert_close(out.feats, want.feats)


def test_one_by_one_is_a_matmul_with_torchsparse_parameter_shape():
    x = scene()
    layer = _layer(3, 4, 1, bias=True)
    assert layer.kernel.shape == (3, 4)
    out = layer(x)
    torch.testing.assert_close(out.feats, x.feats @ layer.kernel + layer.bias)
    assert out.coords is x.coords
    assert spnn.Conv3d(3, 4, 1, stride=2).kernel.shape == (1, 3, 4)
    assert spnn.Conv3d(3, 4, 3).kernel.shape == (27, 3, 4)


def test_functional_conv3d_equals_the_module():
    x = scene()
    layer = _layer(3, 4, 3, stride=2, bias=True)
    out = layer(x)
    x2 = scene()
    f = tsF.conv3d(x2, layer.kernel, 3, bias=layer.bias, stride=2)
    assert torch.equal(f.coords, out.coords)
    torch.testing.assert_close(f.feats, out.feats)


def test_padding_rule_and_repr():
    layer = spnn.Conv3d(4, 8, (3, 2, 3), stride=(1, 2, 2), padding=(0, 1, 0))
    assert layer.padding == (1, 1, 0)  # odd stride-1 axes are centred, as TorchSparse does
    assert "kernel_size=(3, 2, 3)" in repr(layer) and "bias=False" in repr(layer)


def test_maps_and_sites_are_cached_per_geometry():
    x = scene()
    down = _layer(3, 4, 2, stride=2)
    a = down(x)
    b = down(x)
    assert a.coords is b.coords
    record = x._caches.kmaps[((1, 1, 1), (2, 2, 2), (2, 2, 2), (1, 1, 1))]
    assert record.coords is a.coords
    assert x._caches.cmaps[(2, 2, 2)][0] is a.coords


def test_a_second_geometry_to_the_same_stride_gets_its_own_sites():
    x = scene()
    a = _layer(3, 4, 2, stride=2)(x)
    layer = _layer(3, 4, 3, stride=2)
    b = layer(x)
    assert not torch.equal(a.coords, b.coords) or a.coords.shape != b.coords.shape
    assert torch.equal(b.coords, strided_sites(x.coords, (3, 3, 3), (2, 2, 2), (0, 0, 0)))
    ref = dense_conv(x, layer.kernel, (3, 3, 3), 2, (0, 0, 0), b.coords, BATCH, GRID)
    torch.testing.assert_close(b.feats, ref)
    up = _layer(4, 3, 3, stride=2, transposed=True)(b)
    assert torch.equal(up.coords, x.coords)


def test_inference_weight_cache_follows_in_place_updates():
    x = scene()
    layer = _layer(3, 4, 3)
    with torch.no_grad():
        first = layer(x).feats.clone()
        layer.kernel.mul_(2)
        second = layer(x).feats
    torch.testing.assert_close(second, 2 * first)


def test_training_step_updates_the_kernel():
    x = scene()
    net = torch.nn.Sequential(
        _layer(3, 4, 3), spnn.BatchNorm(4).double(), spnn.ReLU(True), _layer(4, 2, 2, stride=2)
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = net[0].kernel.detach().clone()
    net(x).feats.square().sum().backward()
    opt.step()
    assert not torch.equal(before, net[0].kernel)


def test_bad_arguments():
    with pytest.raises(ValueError, match="in_channels"):
        spnn.Conv3d(0, 4)
    with pytest.raises(ValueError, match="kernel_size"):
        spnn.Conv3d(3, 4, 9)
    with pytest.raises(TypeError, match="kernel_size"):
        spnn.Conv3d(3, 4, (3, 3))
    with pytest.raises(ValueError, match="padding"):
        spnn.Conv3d(3, 4, 3, stride=2, padding=-1)
    with pytest.raises(ValueError, match="stride"):
        spnn.Conv3d(3, 4, 3, stride=0)
    with pytest.raises(ValueError, match="generative=True needs transposed=True"):
        spnn.Conv3d(3, 4, 2, stride=2, generative=True)
    with pytest.raises(NotImplementedError, match="generative"):
        spnn.Conv3d(3, 4, 2, stride=2, transposed=True, generative=True)(scene())
    # Offsets a relconv kernel cannot cover: what a transposed conv off its strided conv's sites
    # would need with padding 5 (strided convs themselves run over grid maps).
    with pytest.raises(NotImplementedError, match="relconv kernel of size"):
        relconv_geometry((3, 3, 3), (-5, -5, -5))
    with pytest.raises(TypeError, match="SparseTensor"):
        spnn.Conv3d(3, 4)(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="channels"):
        spnn.Conv3d(5, 4)(scene())
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        spnn.Conv3d(3, 4)(torchsparse.SparseTensor(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int32)))
    with pytest.raises(ValueError, match="weight must have shape"):
        tsF.conv3d(scene(), torch.zeros(8, 3, 4), 3)
    with pytest.warns(UserWarning, match="dilation"):
        spnn.Conv3d(3, 4, 3, dilation=2)


@pytest.mark.parametrize(
    ("kernel_size", "stride", "padding"),
    [(2, 2, 0), (3, 2, 0), (3, 1, 0), ((3, 3, 2), 1, 0), (3, 3, 1)],
    ids=str,
)
def test_hashmap_kmap_mode_centres_every_kernel(kernel_size, stride, padding):
    x = scene()
    config = tsF.get_default_conv_config().__class__(kmap_mode="hashmap")
    layer = _layer(3, 4, kernel_size, stride=stride, padding=padding, config=config)
    out = layer(x)
    k, s = layer.kernel_size, layer.stride
    lows = tuple(-((v - 1) // 2) for v in k)
    if s == (1, 1, 1):
        sites = x.coords
    elif all(si in (1, ki) for si, ki in zip(s, k, strict=True)):
        step = torch.tensor((1, *s))
        sites = torch.unique(torch.div(x.coords, step, rounding_mode="floor"), dim=0).int()
    else:
        sites = strided_sites(x.coords, k, s, layer.padding)
    assert torch.equal(out.coords, sites)
    ref = dense_conv(x, layer.kernel, k, s, lows, out.coords, BATCH, GRID)
    torch.testing.assert_close(out.feats, ref)


def test_global_conv_config_is_read_and_cleared():
    x = scene()
    tsF.set_global_conv_config({"kmap_mode": "hashmap", "downsample_mode": "minkowski"})
    try:
        assert tsF.get_global_conv_config().dataflow == tsF.Dataflow.ImplicitGEMM  # defaults filled in
        out = _layer(3, 2, 3, stride=2)(x)
    finally:
        tsF.clear_global_conv_config()
    step = torch.tensor((1, 2, 2, 2))
    assert torch.equal(
        out.coords, torch.unique(torch.div(x.coords, step, rounding_mode="floor"), dim=0).int()
    )
    assert tsF.get_global_conv_config() is None
    with pytest.raises(ValueError, match="kmap_mode"):
        _layer(3, 2, 3, config={"kmap_mode": "grid"})(scene())
    with pytest.raises(ValueError, match="downsample_mode"):
        _layer(3, 2, 3, config={"downsample_mode": "grid"})(scene())
    with pytest.raises(ValueError, match="kmap_mode"):
        tsF.set_kmap_mode("grid")
    with pytest.raises(ValueError, match="downsample_mode"):
        tsF.set_downsample_mode("grid")
    with pytest.raises(ValueError, match="conv_mode"):
        tsF.set_conv_mode(5)
    with pytest.raises(TypeError, match="conv_config"):
        tsF.set_global_conv_config("hashmap")


def test_copies_of_a_module_get_their_own_relconv_layers():
    import copy
    import pickle

    x = scene()
    layer = _layer(3, 4, 3)
    want = layer(x).feats
    twin = copy.deepcopy(layer)
    with torch.no_grad():
        twin.kernel.mul_(3)
    torch.testing.assert_close(twin(x).feats, 3 * want)
    torch.testing.assert_close(layer(x).feats, want)
    assert twin._runs is not layer._runs
    loaded = pickle.loads(pickle.dumps(twin))
    torch.testing.assert_close(loaded(x).feats, 3 * want)


@pytest.mark.cuda
def test_maps_on_a_strided_convs_sites_skip_the_coordinate_check(monkeypatch):
    """A strided conv's output sites come from relconv's grid map, unique and checked by it: the
    submanifold maps built on them do not check them again (no wait for a check's error word)."""
    from relconv.ops import coord_ops

    sub, down, coarse = _layer(3, 3, 3).cuda(), _layer(3, 4, 3, stride=2).cuda(), _layer(4, 4, 3).cuda()
    want = coarse(down(sub(scene(device="cuda"))))
    first = sub(scene(device="cuda"))  # checks the input's sites

    def fail(*_):
        raise AssertionError("a map built on a strided conv's output sites checked them")

    monkeypatch.setattr(coord_ops, "check_coords", fail)
    got = coarse(down(first))
    assert torch.equal(got.coords, want.coords)
    torch.testing.assert_close(got.feats, want.feats)
