"""relconv.convert: every layout against an independent reading of its definition.

Each layout gets its own reference here, written with explicit loops, never through the converter:
`ENTRIES` lists the (per-axis kernel index, [C_in, C_out] matrix) pairs a weight holds, in the
layout's order, and `LOWS` the offset at which the library's layer reads kernel index 0 per axis
(offset = index + low). A dense `conv3d` built from both is the ground truth a relconv `Conv3d`
loaded with converted weights must match wherever the library reads every index at relconv's
offset; where it does not (TorchSparse's even-volume kernels with an odd axis, its strided convs
at padding 0), the converted native layer is shown to differ, as relconv.convert documents.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from relconv.convert import LAYOUTS, convert_state_dict, convert_weight, kernel_sizes_of
from relconv.voxel import Conv3d, Sequential, VoxelTensor

DT = torch.float64


def _native_lows(ks, stride):
    """relconv, WarpConvNet, MinkowskiEngine (kernel_region.hpp): odd sizes centred, even from 0."""
    return tuple(-(k // 2) if k % 2 else 0 for k in ks)


def _spconv_lows(ks, stride):
    """i = o * s - padding + index: submanifold (odd kernels) centred; strided with the usual
    padding (k - 1) / 2 for odd sizes and 0 for even ones."""
    return tuple(-(k // 2) if k % 2 else 0 for k in ks)


def _torchsparse_lows(ks, stride):
    """TorchSparse 2.1's default map builder: at stride 1 every axis centred for an odd kernel
    volume and from 0 for an even one; strided convs read o * s - padding + index (padding 0)."""
    if stride == 1 and math.prod(ks) % 2:
        return tuple(-(k // 2) for k in ks)
    return (0, 0, 0)


LOWS = {
    "relconv": _native_lows,
    "warpconvnet": _native_lows,
    "minkowski": _native_lows,
    "spconv": _spconv_lows,
    "torchsparse": _torchsparse_lows,
}


def _with_offsets(entries, layout, ks, stride):
    lows = LOWS[layout](ks, stride)
    return [(tuple(i + lo for i, lo in zip(idx, lows, strict=True)), m) for idx, m in entries]


def _as_3d(w):
    return w.unsqueeze(0) if w.dim() == 2 else w


def _entries_relconv(w, ks, stride=1):
    out, k = [], 0
    for i0 in range(ks[0]):
        for i1 in range(ks[1]):
            for i2 in range(ks[2]):
                out.append(((i0, i1, i2), w[k]))
                k += 1
    return out


def _entries_warpconvnet(w, ks, stride=1):
    axes = [torch.arange(k) for k in ks]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
    return [(tuple(int(v) for v in grid[k]), w[k]) for k in range(grid.shape[0])]


def _entries_spconv(w, ks, stride=1):
    if math.prod(ks) == 1 and stride == 1:
        # spconv 2.3's conv1x1 path (FILTER_HWIO off): features @ weight.view(C_in, C_out)
        return [((0, 0, 0), w.reshape(w.shape[4], w.shape[0]))]
    return [
        ((i0, i1, i2), w[:, i0, i1, i2, :].T) for i0, i1, i2 in itertools.product(*(range(k) for k in ks))
    ]


def _entries_axis0_fastest(w, ks):
    out, k = [], 0
    for i2 in range(ks[2]):
        for i1 in range(ks[1]):
            for i0 in range(ks[0]):
                out.append(((i0, i1, i2), w[k]))
                k += 1
    return out


def _entries_minkowski(w, ks, stride=1):
    # kernel_region.hpp, HYPER_CUBE: index % k0 is axis 0, then / k0, % k1 is axis 1, ...
    return _entries_axis0_fastest(_as_3d(w), ks)


def _entries_torchsparse(w, ks, stride=1):
    w = _as_3d(w)
    if math.prod(ks) % 2:
        return _entries_axis0_fastest(w, ks)
    return _entries_relconv(w, ks)


ENTRIES = {
    "relconv": _entries_relconv,
    "warpconvnet": _entries_warpconvnet,
    "spconv": _entries_spconv,
    "torchsparse": _entries_torchsparse,
    "minkowski": _entries_minkowski,
}


def _shape(layout, ks, stride, c_in, c_out):
    k = math.prod(ks)
    if layout == "spconv":
        return (c_out, *ks, c_in)
    if layout in ("torchsparse", "minkowski") and k == 1 and stride == 1:
        return (c_in, c_out)
    return (k, c_in, c_out)


def _random(layout, ks, stride=1, c_in=3, c_out=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(_shape(layout, ks, stride, c_in, c_out), generator=g, dtype=DT)


def _voxels(n=60, size=6, c=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, 2, (n, 1), generator=g)
    xyz = torch.randint(0, size, (n, 3), generator=g)
    coords = torch.unique(torch.cat([b, xyz], 1), dim=0).int()
    return VoxelTensor(torch.randn(coords.shape[0], c, generator=g, dtype=DT), coords)


def _dense_conv(x: VoxelTensor, entries, stride: int, bias=None) -> VoxelTensor:
    """out[q] = sum over entries (d, M) of x[q + d] @ M, q = floor(p / stride) * stride, via conv3d."""
    offs = torch.tensor([d for d, _ in entries])
    lo, hi = offs.min(0).values, offs.max(0).values
    span = (hi - lo + 1).tolist()
    c_in, c_out = entries[0][1].shape
    dense_w = torch.zeros(c_out, c_in, *span, dtype=DT)
    for d, m in entries:
        a = [d[i] - int(lo[i]) for i in range(3)]
        dense_w[:, :, a[0], a[1], a[2]] = m.T
    coords = x.coords.long()
    size = (coords[:, 1:].max(0).values + 1).tolist()
    batch = int(coords[:, 0].max()) + 1
    grid = torch.zeros(batch, c_in, *size, dtype=DT)
    grid[coords[:, 0], :, coords[:, 1], coords[:, 2], coords[:, 3]] = x.feats
    pad = []
    for i in (2, 1, 0):
        pad += [-int(lo[i]), int(hi[i])]
    y = F.conv3d(F.pad(grid, pad), dense_w, stride=stride)
    out_coords = torch.unique(torch.cat([coords[:, :1], coords[:, 1:] // stride * stride], 1), dim=0)
    j = out_coords[:, 1:] // stride
    feats = y[out_coords[:, 0], :, j[:, 0], j[:, 1], j[:, 2]]
    if bias is not None:
        feats = feats + bias
    return VoxelTensor(feats, out_coords.int(), stride)


def _sorted(v: VoxelTensor):
    order = sorted(range(v.coords.shape[0]), key=lambda r: tuple(v.coords[r].tolist()))
    return v.coords[order], v.feats[order]


def _assert_same(a: VoxelTensor, b: VoxelTensor):
    ca, fa = _sorted(a)
    cb, fb = _sorted(b)
    assert torch.equal(ca, cb)
    torch.testing.assert_close(fa, fb, rtol=1e-9, atol=1e-9)


def _relconv_conv(weight, ks, stride, bias=None):
    c_in, c_out = weight.shape[1:]
    conv = Conv3d(c_in, c_out, ks, stride=stride, bias=bias is not None).to(DT)
    with torch.no_grad():
        conv.weight.copy_(weight)
        if bias is not None:
            conv.bias.copy_(bias)
    return conv


# (kernel_size, stride): cubes, asymmetric odd and even volumes (where TorchSparse's order flips),
# strided odd and even kernels, 1x1x1 at stride 1 (a 2-D kernel) and 2.
CASES = [
    ((3, 3, 3), 1),
    ((3, 1, 1), 1),
    ((1, 3, 5), 1),
    ((2, 1, 2), 1),
    ((3, 1, 2), 1),
    ((2, 2, 2), 2),
    ((3, 3, 3), 2),
    ((1, 1, 1), 1),
    ((1, 1, 1), 2),
]


def _valid(layout, ks, stride):
    # spconv's submanifold convs take odd kernels.
    return not (layout == "spconv" and stride == 1 and any(k % 2 == 0 for k in ks))


def _same_reading(layout, ks, stride):
    return LOWS[layout](ks, stride) == _native_lows(ks, stride)


SAME = [
    (lay, ks, s) for lay in LAYOUTS for ks, s in CASES if _valid(lay, ks, s) and _same_reading(lay, ks, s)
]
OTHER = [
    (lay, ks, s) for lay in LAYOUTS for ks, s in CASES if _valid(lay, ks, s) and not _same_reading(lay, ks, s)
]


def test_the_cases_cover_both_readings():
    assert {lay for lay, _, _ in SAME} == set(LAYOUTS)
    assert {(lay, ks, s) for lay, ks, s in OTHER} == {
        ("torchsparse", (3, 1, 2), 1),
        ("torchsparse", (3, 3, 3), 2),
    }


def _reference(x, layout, w, ks, stride, bias=None):
    return _dense_conv(x, _with_offsets(ENTRIES[layout](w, ks, stride), layout, ks, stride), stride, bias)


@pytest.mark.parametrize(("layout", "ks", "stride"), SAME)
def test_loading_converted_weights_matches_layout_definition(layout, ks, stride):
    """src layout -> relconv: a relconv Conv3d with the converted weight computes what the source
    weight means by its layout's definition."""
    w = _random(layout, ks, stride)
    x = _voxels()
    conv = _relconv_conv(convert_weight(w, layout, "relconv", ks, stride), ks, stride)
    _assert_same(conv(x), _reference(x, layout, w, ks, stride))


@pytest.mark.parametrize(("layout", "ks", "stride"), SAME)
def test_exported_weights_mean_what_relconv_computes(layout, ks, stride):
    """relconv -> dst layout: the exported weight, read by dst's definition, reproduces relconv's output."""
    conv = _relconv_conv(_random("relconv", ks, stride), ks, stride)
    x = _voxels()
    w = convert_weight(conv.weight.detach(), "relconv", layout, ks, stride)
    assert tuple(w.shape) == _shape(layout, ks, stride, 3, 4)
    _assert_same(conv(x), _reference(x, layout, w, ks, stride))


@pytest.mark.parametrize(("layout", "ks", "stride"), OTHER)
def test_layers_reading_other_offsets_differ_from_native(layout, ks, stride):
    """Where the library reads kernel indices at other offsets than relconv's native layer, the
    converted weight keeps each index's matrix but the native layer computes something else (the
    shim, which keeps the library's geometry, is the way to run such layers)."""
    w = _random(layout, ks, stride)
    x = _voxels()
    got = _relconv_conv(convert_weight(w, layout, "relconv", ks, stride), ks, stride)(x)
    want = _reference(x, layout, w, ks, stride)
    same_sites = torch.equal(_sorted(got)[0], _sorted(want)[0])
    assert not (same_sites and torch.allclose(_sorted(got)[1], _sorted(want)[1]))


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(LAYOUTS, LAYOUTS)))
@pytest.mark.parametrize(("ks", "stride"), CASES)
def test_every_direction_keeps_each_offsets_matrix(src, dst, ks, stride):
    """Between any two layouts, every kernel index keeps its matrix, and converting back is the identity."""
    w = _random(src, ks, stride)
    v = convert_weight(w, src, dst, ks, stride)
    want = {d: m for d, m in ENTRIES[src](w, ks, stride)}
    got = {d: m for d, m in ENTRIES[dst](v, ks, stride)}
    assert want.keys() == got.keys()
    for d in want:
        assert torch.equal(want[d], got[d]), d
    assert torch.equal(convert_weight(v, dst, src, ks, stride), w)


def test_region_type_accepts_minkowski_enum_members():
    class RegionType:  # stands in for MinkowskiEngine's enum: a member with a name
        name = "HYPER_CUBE"

    w = _random("minkowski", (3, 3, 3))
    assert torch.equal(
        convert_weight(w, "minkowski", "relconv", 3, region_type=RegionType()),
        convert_weight(w, "minkowski", "relconv", 3),
    )
    assert convert_weight(w, "minkowski", "relconv", 3, region_type="RegionType.HYPER_CUBE").shape == w.shape


def test_converted_weight_is_a_new_tensor():
    w = _random("relconv", (3, 3, 3))
    v = convert_weight(w, "relconv", "warpconvnet", 3)
    v.zero_()
    assert w.abs().sum() > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_transposed_conv_uses_the_strided_layout(layout):
    """A 2^3 stride-2 transposed conv scatters x[q] @ M to q + d, with M the matrix the layout puts at d."""
    ks = (2, 2, 2)
    x = _voxels(c=3)
    down = Conv3d(3, 3, ks, stride=2).to(DT)
    coarse = down(x)
    w = _random(layout, ks, 2, c_in=3, c_out=4, seed=5)
    up = Conv3d(3, 4, ks, stride=2, transposed=True).to(DT)
    with torch.no_grad():
        up.weight.copy_(convert_weight(w, layout, "relconv", ks, 2))
    got = up(coarse)
    # Reference: conv_transpose3d on the dense coarse grid, read at the fine input sites.
    dense_w = torch.zeros(3, 4, *ks, dtype=DT)
    for d, m in _with_offsets(ENTRIES[layout](w, ks, 2), layout, ks, 2):
        dense_w[:, :, d[0], d[1], d[2]] = m  # every layout reads a 2^3 stride-2 kernel at 0 .. 1
    cc = coarse.coords.long()
    size = (cc[:, 1:].max(0).values // 2 + 1).tolist()
    grid = torch.zeros(2, 3, *size, dtype=DT)
    grid[cc[:, 0], :, cc[:, 1] // 2, cc[:, 2] // 2, cc[:, 3] // 2] = coarse.feats.detach()
    y = F.conv_transpose3d(grid, dense_w, stride=2)
    fc = x.coords.long()
    ref = VoxelTensor(y[fc[:, 0], :, fc[:, 1], fc[:, 2], fc[:, 3]], x.coords)
    _assert_same(VoxelTensor(got.feats.detach(), got.coords), ref)


# ----------------------------------------------------------------------------- whole state_dicts
# A relconv model and the same network's state_dict as each library names it.
MODEL_CONVS = [
    ("0", 3, 5, (3, 3, 3), 1, True),
    ("1", 5, 6, (3, 1, 1), 1, False),
    ("2", 6, 4, (2, 2, 2), 2, True),
    ("3", 4, 4, (1, 1, 1), 1, False),
]


def _model():
    return Sequential(*(Conv3d(ci, co, ks, stride=s, bias=b) for _, ci, co, ks, s, b in MODEL_CONVS)).to(DT)


def _foreign_state_dict(layout, seed=0):
    """The state_dict a library's model of MODEL_CONVS would have, with random weights."""
    sd = {}
    for i, (name, ci, co, ks, s, b) in enumerate(MODEL_CONVS):
        leaf = "kernel" if layout in ("torchsparse", "minkowski") else "weight"
        sd[f"{name}.{leaf}"] = _random(layout, ks, s, ci, co, seed=seed + i)
        if b:
            bias = torch.randn(co, dtype=DT)
            sd[f"{name}.bias"] = bias.reshape(1, -1) if layout == "minkowski" else bias
    return sd


def _reference_forward(x, layout, sd):
    for name, _, _, ks, s, b in MODEL_CONVS:
        w = sd[f"{name}.{'kernel' if layout in ('torchsparse', 'minkowski') else 'weight'}"]
        bias = sd[f"{name}.bias"].reshape(-1) if b else None
        x = _reference(x, layout, w, ks, s, bias)
    return x


@pytest.mark.parametrize("layout", LAYOUTS)
def test_state_dict_loads_into_native_layers_and_matches(layout):
    model = _model()
    sd = _foreign_state_dict(layout)
    sizes = kernel_sizes_of(model)
    strides = {name: s for name, _, _, _, s, _ in MODEL_CONVS}
    converted = convert_state_dict(sd, layout, "relconv", kernel_sizes=sizes, strides=strides)
    model.load_state_dict(converted, strict=True)
    x = _voxels()
    with torch.no_grad():
        _assert_same(model(x), _reference_forward(x, layout, sd))


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(LAYOUTS, LAYOUTS)))
def test_state_dict_round_trip(src, dst):
    sd = _foreign_state_dict(src, seed=3)
    sd["bn.weight"] = torch.randn(4)
    sd["bn.running_mean"] = torch.randn(4)
    sd["bn.num_batches_tracked"] = torch.tensor(7)
    sizes = {"1": (3, 1, 1)}
    strides = {"2": 2}
    there = convert_state_dict(sd, src, dst, kernel_sizes=sizes, strides=strides)
    leaf = "kernel" if dst in ("torchsparse", "minkowski") else "weight"
    assert {k for k in there if k.startswith("3.")} == {f"3.{leaf}"}
    assert there["bn.weight"] is sd["bn.weight"]
    assert there["0.bias"].shape == ((1, 5) if dst == "minkowski" else (5,))
    back = convert_state_dict(there, dst, src, kernel_sizes=sizes, strides=strides)
    assert back.keys() == sd.keys()
    for k in sd:
        assert torch.equal(back[k], sd[k]), k


def test_state_dict_spconv_only_buffers():
    sd = _foreign_state_dict("spconv")
    sd["2.max_num_voxels_during_training"] = torch.zeros(1, dtype=torch.int32)
    assert "2.max_num_voxels_during_training" not in convert_state_dict(sd, "spconv", "relconv")
    assert "2.max_num_voxels_during_training" in convert_state_dict(sd, "spconv", "spconv")


def test_state_dict_keys_override_the_shape_rule():
    sd = {"conv.weight": torch.randn(27, 2, 3), "head.weight": torch.randn(4, 2, 5)}  # head: nn.Conv1d
    with pytest.raises(ValueError, match="'head.weight' has 4 kernel offsets"):
        convert_state_dict(sd, "relconv", "spconv")
    out = convert_state_dict(sd, "relconv", "spconv", keys=["conv.weight"])
    assert out["conv.weight"].shape == (3, 3, 3, 3, 2)
    assert out["head.weight"] is sd["head.weight"]
    out = convert_state_dict(sd, "relconv", "spconv", keys=lambda k: k.startswith("conv."))
    assert out["conv.weight"].shape == (3, 3, 3, 3, 2)


def test_kernel_sizes_of_lists_conv_modules_only():
    model = Sequential(Conv3d(2, 3, (3, 1, 2)), Conv3d(3, 3, 3, stride=2))
    model.add_module("pool", torch.nn.MaxPool3d(2))
    assert kernel_sizes_of(model) == {"0": (3, 1, 2), "1": (3, 3, 3)}


# ----------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((torch.randn(27, 2, 3), "pytorch3d", "relconv", 3), {}, ValueError, "src must be one of"),
        ((torch.randn(27, 2, 3), "relconv", "me", 3), {}, ValueError, "dst must be one of"),
        (([[1.0]], "relconv", "spconv", 1), {}, TypeError, "weight must be a torch.Tensor"),
        ((torch.randn(27, 2, 3), "relconv", "spconv", 2), {}, ValueError, "27 offsets but kernel_size"),
        ((torch.randn(4, 3, 3, 3, 2), "spconv", "relconv", 2), {}, ValueError, "do not match kernel_size"),
        ((torch.randn(4, 3, 3, 2), "spconv", "relconv", (3, 3)), {}, NotImplementedError, "only 3-D"),
        ((torch.randn(4, 3, 3, 2), "spconv", "relconv", 3), {}, ValueError, "2-D convs do not convert"),
        ((torch.randn(2, 3), "torchsparse", "relconv", 3), {}, ValueError, "is a 1x1x1 conv"),
        ((torch.randn(2, 3), "relconv", "spconv", 1), {}, ValueError, r"\[K, C_in, C_out\]"),
        ((torch.randn(27, 2, 1, 1), "relconv", "spconv", 3), {}, NotImplementedError, "grouped"),
        ((torch.randn(27, 2, 3), "relconv", "spconv", 0), {}, ValueError, "must be positive"),
        ((torch.randn(27, 2, 3), "relconv", "spconv", True), {}, TypeError, "kernel_size must be an int"),
        ((torch.randn(27, 2, 3), "relconv", "spconv", "3"), {}, TypeError, "kernel_size must be an int"),
        ((torch.randn(27, 2, 3), "relconv", "spconv", 3), {"stride": (1, 2)}, NotImplementedError, "stride"),
        (
            (torch.randn(7, 2, 3), "minkowski", "relconv", 3),
            {"region_type": "HYPER_CROSS"},
            NotImplementedError,
            "HYPER_CUBE",
        ),
        ((torch.randn(27, 4), "minkowski", "relconv", 3), {}, ValueError, "is a 1x1x1 conv"),
    ],
)
def test_convert_weight_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        convert_weight(*args, **kwargs)


def test_convert_state_dict_bad_arguments():
    sd = {"c.weight": torch.randn(6, 2, 3)}
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        convert_state_dict([("c.weight", sd["c.weight"])], "relconv", "spconv")
    with pytest.raises(ValueError, match="not a cube: pass its kernel size in kernel_sizes"):
        convert_state_dict(sd, "relconv", "spconv")
    with pytest.raises(ValueError, match="src must be one of"):
        convert_state_dict(sd, "mink", "spconv")
    with pytest.raises(ValueError, match="conv weights are named 'kernel'"):
        convert_state_dict(sd, "torchsparse", "relconv", keys=["c.weight"])
    with pytest.raises(TypeError, match="not one string"):
        convert_state_dict(sd, "relconv", "spconv", keys="c.weight")
    assert convert_state_dict(sd, "relconv", "spconv", kernel_sizes={"c": (3, 2, 1)})["c.weight"].shape == (
        3,
        3,
        2,
        1,
        2,
    )
