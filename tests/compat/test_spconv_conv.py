"""relconv.spconv's convolutions against dense torch convs: values, output sites, gradients, 2-D and 3-D."""

import pytest
import torch

import relconv.spconv as spconv
from relconv.voxel import Conv3d, VoxelTensor
from tests.compat.spconv_refs import (
    at_sites,
    conv_nd,
    conv_transpose_nd,
    dense_transposed_weight,
    dense_weight,
    densify,
    occupancy,
    random_tensor,
    site_set,
)
from tests.conftest import DEVICES, cyclic_garbage

SHAPES = {3: [7, 6, 5], 2: [9, 8]}

# (kernel_size, stride, padding, dilation) of regular convs, incl. OpenPCDet's and Pointcept's.
REGULAR = [
    (3, 2, 1, 1),
    (2, 2, 0, 1),
    ("k311", "s211", 0, 1),
    (3, 1, 0, 1),
    (3, 2, 0, 2),
    (3, 1, 1, 1),
]


def _axes(value, ndim):
    # "k311"-style per-axis values for 3-D, their first two axes for 2-D.
    if isinstance(value, str):
        vals = [int(c) for c in value[1:]]
        return vals[:ndim]
    return value


def _regular_layer(ndim, k, s, p, d, bias=True, transposed=False):
    cls = {
        (3, False): spconv.SparseConv3d,
        (2, False): spconv.SparseConv2d,
        (3, True): spconv.SparseConvTranspose3d,
        (2, True): spconv.SparseConvTranspose2d,
    }[(ndim, transposed)]
    return cls(3, 4, _axes(k, ndim), stride=_axes(s, ndim), padding=p, dilation=d, bias=bias)


def _support(x, layer, transposed):
    occ = occupancy(x.indices, x.spatial_shape, x.batch_size)
    ones = torch.ones(1, 1, *layer.kernel_size, dtype=occ.dtype, device=occ.device)
    ndim = layer.ndim
    if transposed:
        sup = conv_transpose_nd(ndim)(occ, ones, stride=layer.stride, padding=layer.padding)
    else:
        sup = conv_nd(ndim)(occ, ones, stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
    return site_set((sup[:, 0] > 0).nonzero().int())


def _check_against_dense(x, layer, reference, rtol=1e-9, atol=1e-9):
    """Forward and backward of `layer` on x against `reference(dense_input)` sampled at the output sites."""
    feats = x.features.detach().clone().requires_grad_(True)
    xs = x.replace_feature(feats)
    out = layer(xs)
    g = torch.randn_like(out.features)
    out.features.mul(g).sum().backward()
    dense_feats = x.features.detach().clone().requires_grad_(True)
    w_ref = layer.weight.detach().clone().requires_grad_(True)
    b_ref = None if layer.bias is None else layer.bias.detach().clone().requires_grad_(True)
    dense = densify(dense_feats, x.indices, x.spatial_shape, x.batch_size)
    ref = at_sites(reference(dense, w_ref, b_ref), out.indices)
    ref.mul(g).sum().backward()
    torch.testing.assert_close(out.features, ref, rtol=rtol, atol=atol)
    torch.testing.assert_close(feats.grad, dense_feats.grad, rtol=rtol, atol=atol)
    torch.testing.assert_close(layer.weight.grad, w_ref.grad, rtol=rtol, atol=atol)
    if b_ref is not None:
        torch.testing.assert_close(layer.bias.grad, b_ref.grad, rtol=rtol, atol=atol)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ndim", [3, 2])
@pytest.mark.parametrize("k,d", [(3, 1), (5, 1), (3, 2), ("k313", 1)])
def test_subm_matches_dense_conv(ndim, k, d, device):
    x = random_tensor(SHAPES[ndim], 2, 50, 3, dtype=torch.float64, device=device)
    layer = (spconv.SubMConv3d if ndim == 3 else spconv.SubMConv2d)(3, 4, _axes(k, ndim), dilation=d)
    layer = layer.double().to(device)
    ks = layer.kernel_size
    pad = [dd * (kk - 1) // 2 for kk, dd in zip(ks, layer.dilation, strict=True)]

    def reference(dense, w, b):
        return conv_nd(ndim)(dense, dense_weight(w), b, padding=pad, dilation=layer.dilation)

    out = _check_against_dense(x, layer, reference)
    assert out.indices is x.indices
    assert out.spatial_shape == x.spatial_shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ndim", [3, 2])
@pytest.mark.parametrize("k,s,p,d", REGULAR)
def test_regular_conv_matches_dense_conv_and_its_support(ndim, k, s, p, d, device):
    x = random_tensor(SHAPES[ndim], 2, 45, 3, seed=3, dtype=torch.float64, device=device)
    layer = _regular_layer(ndim, k, s, p, d).double().to(device)

    def reference(dense, w, b):
        return conv_nd(ndim)(
            dense, dense_weight(w), b, stride=layer.stride, padding=layer.padding, dilation=d
        )

    out = _check_against_dense(x, layer, reference)
    assert site_set(out.indices) == _support(x, layer, transposed=False)
    expected = conv_nd(ndim)(
        densify(x.features, x.indices, x.spatial_shape, 2),
        dense_weight(layer.weight.detach()),
        stride=layer.stride,
        padding=layer.padding,
        dilation=d,
    )
    assert out.spatial_shape == list(expected.shape[2:])
    assert out.indices.dtype == torch.int32 and out.indices.shape[1] == ndim + 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ndim", [3, 2])
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 2, 0), (3, 1, 1), (3, 2, 0)])
def test_transposed_conv_matches_dense_conv_transpose(ndim, k, s, p, device):
    x = random_tensor(SHAPES[ndim], 2, 30, 3, seed=5, dtype=torch.float64, device=device)
    layer = _regular_layer(ndim, k, s, p, 1, transposed=True).double().to(device)

    def reference(dense, w, b):
        return conv_transpose_nd(ndim)(dense, dense_transposed_weight(w), b, stride=s, padding=p)

    out = _check_against_dense(x, layer, reference)
    assert site_set(out.indices) == _support(x, layer, transposed=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ndim", [3, 2])
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 2, 0), ("k311", "s211", 0)])
def test_inverse_conv_restores_the_strided_layers_sites(ndim, k, s, p, device):
    x = random_tensor(SHAPES[ndim], 2, 45, 3, seed=7, dtype=torch.float64, device=device)
    down = _regular_layer(ndim, k, s, p, 1).double().to(device)
    down.indice_key = "down"
    inverse_cls = spconv.SparseInverseConv3d if ndim == 3 else spconv.SparseInverseConv2d
    up = inverse_cls(4, 3, _axes(k, ndim), indice_key="down").double().to(device)
    coarse = down(x)
    coarse = coarse.replace_feature(coarse.features.detach())

    # conv_transpose crops `padding` on both sides; output_padding grows it back to the fine grid.
    grown = [
        n - ((c - 1) * st - 2 * pd + kk)
        for n, c, st, pd, kk in zip(
            x.spatial_shape, coarse.spatial_shape, down.stride, down.padding, down.kernel_size, strict=True
        )
    ]

    def reference(dense, w, b):
        return conv_transpose_nd(ndim)(
            dense,
            dense_transposed_weight(w),
            b,
            stride=down.stride,
            padding=down.padding,
            output_padding=[max(g, 0) for g in grown],
        )

    out = _check_against_dense(coarse, up, reference)
    assert torch.equal(out.indices, x.indices)  # same rows in the same order: features line up with x
    assert out.spatial_shape == x.spatial_shape


def test_a_strided_map_and_its_inverse_go_without_the_cycle_collector():
    # The inverse conv runs over the transpose of its strided layer's map: both go with the call.
    torch.manual_seed(0)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(3, 4, 3, indice_key="fine"),
        spconv.SparseConv3d(4, 8, 3, 2, 1, indice_key="down"),
        spconv.SparseInverseConv3d(8, 4, 3, indice_key="down"),
    )

    def step():
        net(random_tensor([8, 8, 8], 2, 80, 3, seed=11)).features.sum().backward()

    step()
    assert cyclic_garbage(step) == []


def test_subm_equals_relconvs_native_conv3d():
    x = random_tensor([8, 8, 8], 2, 80, 5, seed=11)
    layer = spconv.SubMConv3d(5, 6, 3, bias=False)
    native = Conv3d(5, 6, 3)
    with torch.no_grad():
        native.weight.copy_(layer.weight.permute(1, 2, 3, 4, 0).reshape(27, 5, 6))
    out = layer(x)
    ref = native(VoxelTensor(x.features, x.indices))
    torch.testing.assert_close(out.features, ref.feats)


def test_conv1x1_multiplies_by_the_reshaped_weight_as_spconv_does():
    x = random_tensor([6, 6, 6], 1, 30, 3, seed=2)
    for layer in (spconv.SubMConv3d(3, 5, 1, padding=1), spconv.SparseConv3d(3, 5, 1)):
        out = layer(x)
        expected = x.features @ layer.weight.reshape(3, 5) + layer.bias
        torch.testing.assert_close(out.features, expected)
        assert out.indices is x.indices


def test_weight_layout_and_state_dict_load_unchanged():
    layer = spconv.SparseConv3d(3, 8, (3, 1, 2), stride=2, bias=True)
    assert tuple(layer.weight.shape) == (8, 3, 1, 2, 3)
    other = spconv.SparseConv3d(3, 8, (3, 1, 2), stride=2)
    other.load_state_dict(layer.state_dict())
    x = random_tensor([7, 6, 5], 2, 40, 3)
    torch.testing.assert_close(other(x).features, layer(x).features)


def test_cached_kernel_view_follows_weight_updates():
    x = random_tensor([7, 6, 5], 2, 40, 3)
    layer = spconv.SubMConv3d(3, 4, 3)
    with torch.no_grad():
        first = layer(x).features
        layer.weight.mul_(2)
        second = layer(x).features
    torch.testing.assert_close(second - layer.bias, 2 * (first - layer.bias))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_features_with_float32_weights(dtype):
    x = random_tensor([7, 6, 5], 2, 40, 3)
    half = x.replace_feature(x.features.to(dtype))
    for layer in (spconv.SubMConv3d(3, 4, 3), spconv.SparseConv3d(3, 4, 3, 2, 1), spconv.SubMConv3d(3, 4, 1)):
        ref = layer(x).features
        out = layer(half).features
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_runs_layers_in_half_precision(device):
    dtype = torch.bfloat16 if device == "cpu" else torch.float16
    x = random_tensor([7, 6, 5], 2, 40, 3, device=device)
    layer = spconv.SparseSequential(spconv.SubMConv3d(3, 4, 3), spconv.SparseConv3d(4, 4, 3, 2, 1)).to(device)
    ref = layer(x).features
    with torch.autocast(device, dtype=dtype):
        out = layer(x).features
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("device", [p for p in DEVICES if p.id == "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_layers_match_cpu(device, dtype):
    x = random_tensor([20, 18, 9], 2, 600, 16, seed=13)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(16, 32, 3, indice_key="s1"),
        spconv.SparseConv3d(32, 32, 3, 2, 1, indice_key="d1"),
        spconv.SubMConv3d(32, 32, 3, indice_key="s2"),
        spconv.SparseConv3d(32, 32, (3, 1, 1), (2, 1, 1)),
        spconv.SparseConvTranspose3d(32, 16, 3, 2, 1),
        spconv.SparseMaxPool3d(2, 2),
    )
    ref = net(x)
    gpu = net.to(device)(
        spconv.SparseConvTensor(x.features.to(device, dtype), x.indices.to(device), x.spatial_shape, 2)
    )
    assert site_set(gpu.indices.cpu()) == site_set(ref.indices)
    order = {s: i for i, s in enumerate(map(tuple, ref.indices.tolist()))}
    rows = torch.tensor([order[tuple(s)] for s in gpu.indices.cpu().tolist()])
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(gpu.features.float().cpu(), ref.features[rows], rtol=tol, atol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("device", [p for p in DEVICES if p.id == "cuda"])
def test_cuda_forward_over_built_maps_does_not_sync(device):
    from tests.conftest import no_host_sync

    x = random_tensor([20, 18, 9], 2, 600, 16, seed=13, device=device, dtype=torch.float16)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(16, 32, 3, indice_key="s1"),
        torch.nn.BatchNorm1d(32),
        spconv.SparseConv3d(32, 32, 3, 2, 1, indice_key="d1"),
        spconv.SubMConv3d(32, 32, 3),
        spconv.SparseInverseConv3d(32, 16, 3, indice_key="d1"),
    ).to(device)
    with torch.autocast("cuda", dtype=torch.float16):
        net(x)  # builds and caches every map on x's sites
        with no_host_sync():
            out = net(x)
    assert out.features.shape == (x.indices.shape[0], 16)


@pytest.mark.cuda
def test_maps_on_a_regular_convs_sites_skip_the_coordinate_check(monkeypatch):
    """A regular conv's output sites come from relconv's grid map, unique and checked by it: the
    submanifold maps built on them do not check them again (no wait for a check's error word)."""
    from relconv.ops import coord_ops

    x = random_tensor([12, 12, 12], 2, 300, 3, seed=5, device="cuda")
    net = spconv.SparseSequential(
        spconv.SubMConv3d(3, 4, 3, indice_key="a"),  # checks the input's sites
        spconv.SparseConv3d(4, 5, 3, stride=2, padding=1),
        spconv.SubMConv3d(5, 5, 3, indice_key="b"),
    ).cuda()
    want = net(x)
    fresh = spconv.SparseConvTensor(x.features, x.indices, x.spatial_shape, 2)
    first = net[0](fresh)

    def fail(*_):
        raise AssertionError("a map built on a regular conv's output sites checked them")

    monkeypatch.setattr(coord_ops, "check_coords", fail)
    got = net[2](net[1](first))
    assert torch.equal(got.indices, want.indices)
    torch.testing.assert_close(got.features, want.features)
