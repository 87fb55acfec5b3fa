"""A model written against spconv's or TorchSparse's API (run by relconv's shims) hands its state_dict,
converted by relconv.convert, to the same network in relconv's native layers: same outputs."""

from __future__ import annotations

import pytest
import torch

from relconv.convert import convert_state_dict, kernel_sizes_of
from relconv.voxel import BatchNorm, Conv3d, ReLU, Sequential, VoxelTensor

DT = torch.float64


def _voxels(n=80, size=7, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, 2, (n, 1), generator=g)
    coords = torch.unique(torch.cat([b, torch.randint(0, size, (n, 3), generator=g)], 1), dim=0).int()
    return coords, torch.randn(coords.shape[0], c, generator=g, dtype=DT)


def _native(third: tuple[int, int, int], strided: bool) -> Sequential:
    """The test networks in relconv's layers (module names as in the shims' models); the spconv one
    (`strided`) ends in a 1x1x1 conv and a 2^3 stride-2 conv."""
    layers = [Conv3d(3, 8, 3), BatchNorm(8), ReLU(), Conv3d(8, 8, (3, 1, 1), bias=True), Conv3d(8, 6, third)]
    if strided:
        layers += [Conv3d(6, 5, 1, bias=True), Conv3d(5, 4, 2, stride=2)]
    return Sequential(*layers).to(DT).eval()


def _load_native(native: Sequential, state: dict, src: str) -> None:
    converted = convert_state_dict(state, src, "relconv", kernel_sizes=kernel_sizes_of(native))
    # relconv's BatchNorm holds torch's BatchNorm1d as `.module`.
    native.load_state_dict({k: converted[k.replace(".module.", ".")] for k in native.state_dict()})


def _randomise(model: torch.nn.Module) -> None:
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
        for name, buf in model.named_buffers():
            if name.endswith("running_var"):
                buf.uniform_(0.5, 2.0)
            elif name.endswith("running_mean"):
                buf.normal_()


def _sorted(coords, feats):
    order = sorted(range(coords.shape[0]), key=lambda r: tuple(coords[r].tolist()))
    return coords[order].long(), feats[order]


def test_spconv_state_dict_runs_in_native_layers():
    spconv = pytest.importorskip("relconv.spconv")
    model = spconv.SparseSequential(
        spconv.SubMConv3d(3, 8, 3, padding=1, bias=False, indice_key="a"),
        torch.nn.BatchNorm1d(8),
        torch.nn.ReLU(),
        spconv.SubMConv3d(8, 8, (3, 1, 1), bias=True, indice_key="b"),
        spconv.SubMConv3d(8, 6, (1, 3, 5), bias=False, indice_key="c"),
        spconv.SubMConv3d(6, 5, 1, bias=True),  # spconv multiplies by its storage read as [C_in, C_out]
        spconv.SparseConv3d(5, 4, 2, stride=2, bias=False),  # 2^3 stride 2: the same sites everywhere
    ).to(DT)
    _randomise(model)
    model.eval()
    coords, feats = _voxels()
    x = spconv.SparseConvTensor(feats, coords, [8, 8, 8], 2)
    with torch.no_grad():
        out = model(x)
    native = _native((1, 3, 5), strided=True)
    _load_native(native, dict(model.state_dict()), "spconv")
    with torch.no_grad():
        got = native(VoxelTensor(feats, coords))
    want_c, want_f = _sorted(out.indices, out.features)
    got_c, got_f = _sorted(got.coords, got.feats)
    got_c[:, 1:] //= 2  # spconv numbers a stride-2 layer's sites on the coarse grid
    assert torch.equal(got_c, want_c)
    torch.testing.assert_close(got_f, want_f, rtol=1e-9, atol=1e-9)


def test_torchsparse_state_dict_runs_in_native_layers():
    torchsparse = pytest.importorskip("relconv.torchsparse")
    spnn = torchsparse.nn
    model = torch.nn.Sequential(
        spnn.Conv3d(3, 8, 3),
        spnn.BatchNorm(8),
        spnn.ReLU(),
        spnn.Conv3d(8, 8, (3, 1, 1), bias=True),  # odd volume: TorchSparse's reversed order
        spnn.Conv3d(8, 6, (2, 1, 2)),  # even volume: relconv's order (no odd axis: same offsets)
    ).to(DT)
    _randomise(model)
    model.eval()
    coords, feats = _voxels(seed=2)
    with torch.no_grad():
        out = model(torchsparse.SparseTensor(feats, coords))
    native = _native((2, 1, 2), strided=False)
    _load_native(native, dict(model.state_dict()), "torchsparse")
    with torch.no_grad():
        got = native(VoxelTensor(feats, coords))
    want_c, want_f = _sorted(out.C, out.F)
    got_c, got_f = _sorted(got.coords, got.feats)
    assert torch.equal(got_c, want_c)
    torch.testing.assert_close(got_f, want_f, rtol=1e-9, atol=1e-9)
