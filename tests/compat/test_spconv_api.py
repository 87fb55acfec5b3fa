"""relconv.spconv's import surface (install(), aliases, missing names), PointToVoxel, and bad arguments."""

import subprocess
import sys
import types

import pytest
import torch

import relconv.spconv as spconv
from relconv.spconv.install import uninstall
from tests.compat.spconv_refs import random_tensor


@pytest.fixture
def installed():
    spconv.install()
    yield
    uninstall()


# ---------------------------------------------------------------------------- install()
def test_install_registers_the_import_names_downstream_code_uses(installed):
    import spconv as top
    import spconv.pytorch as sp
    from spconv.pytorch import SparseConv4d, SparseModule, SubMConv3d  # noqa: F401  (mmdet3d's import)
    from spconv.pytorch.functional import sparse_add
    from spconv.pytorch.modules import is_spconv_module
    from spconv.pytorch.utils import PointToVoxel

    assert sp is spconv and top.pytorch is spconv
    assert float(top.__version__[2:]) >= 2.2  # OpenPCDet's version check
    top.constants.SPCONV_USE_DIRECT_TABLE = False  # OpenPCDet sets it; accepted and ignored
    assert sp.conv.SparseConvolution is spconv.SparseConvolution
    assert top.core.ConvAlgo.Native.value == 0
    assert sparse_add is spconv.functional.sparse_add and PointToVoxel is spconv.utils.PointToVoxel
    assert is_spconv_module(SubMConv3d(2, 2, 3))
    from spconv.pytorch import ops

    assert ops.get_conv_output_size([41, 1600, 1408], [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1]) == [
        21,
        800,
        704,
    ]
    assert ops.get_deconv_output_size([21, 800, 704], [3] * 3, [2] * 3, [1] * 3, [1] * 3, [0] * 3) == [
        41,
        1599,
        1407,
    ]
    spconv.install()  # idempotent


def test_install_refuses_when_the_real_spconv_is_imported():
    real = types.ModuleType("spconv")
    sys.modules["spconv"] = real
    try:
        with pytest.raises(RuntimeError, match="real spconv is already imported"):
            spconv.install()
    finally:
        del sys.modules["spconv"]


def test_install_makes_spconv_imports_resolve_in_a_fresh_interpreter():
    code = (
        "import relconv.spconv; relconv.spconv.install()\n"
        "import spconv.pytorch as spconv, torch\n"
        "x = spconv.SparseConvTensor(torch.randn(2, 3), torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2]], "
        "dtype=torch.int32), [4, 4, 4], 1)\n"
        "print(spconv.SubMConv3d(3, 5, 3)(x).features.shape[1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "5"


def test_missing_names_raise_an_error_that_names_them():
    with pytest.raises(AttributeError, match="does not provide spconv.pytorch.SparseConvolutionFoo"):
        _ = spconv.SparseConvolutionFoo
    with pytest.raises(AttributeError, match="spconv.pytorch.utils.Point2VoxelCPU3d"):
        _ = spconv.utils.Point2VoxelCPU3d
    with pytest.raises(AttributeError, match="SparseConvTensor.thrust_something"):
        _ = random_tensor([4, 4, 4], 1, 5, 2).thrust_something
    with pytest.raises(ImportError):
        from relconv.spconv.functional import sparse_add_hash_based  # noqa: F401
    assert not hasattr(spconv, "SparseConvolutionFoo")


@pytest.mark.parametrize(
    "cls",
    [spconv.SubMConv4d, spconv.SparseConv1d, spconv.SparseConvTranspose4d, spconv.SparseMaxPool4d],
)
def test_other_dimensions_raise_not_implemented(cls):
    args = (3,) if "Pool" in cls.__name__ else (2, 2, 3)
    with pytest.raises(NotImplementedError, match="2-D and 3-D"):
        cls(*args)


# ---------------------------------------------------------------------------- PointToVoxel
def _brute_force_voxels(pc, vsize, lo, grid, max_voxels, max_points):
    voxels, coords, counts, ids, seen = [], [], [], [], {}
    for p in pc.tolist():
        c = [int(torch.floor((torch.tensor(p[a]) - lo[a]) / vsize[a])) for a in range(3)]
        if any(v < 0 or v >= g for v, g in zip(c, grid, strict=True)):
            ids.append(-1)
            continue
        key = tuple(c[::-1])
        if key not in seen:
            if len(seen) >= max_voxels:
                ids.append(-1)
                continue
            seen[key] = len(seen)
            coords.append(list(key))
            voxels.append([])
        v = seen[key]
        ids.append(v)
        if len(voxels[v]) < max_points:
            voxels[v].append(p)
    counts = [len(v) for v in voxels]
    return voxels, coords, counts, ids


@pytest.mark.parametrize("max_voxels,max_points", [(1000, 3), (7, 2)])
def test_point_to_voxel_matches_a_sequential_voxeliser(max_voxels, max_points):
    g = torch.Generator().manual_seed(0)
    pc = torch.rand(300, 4, generator=g) * torch.tensor([4.4, 3.2, 2.0, 1.0]) - torch.tensor(
        [0.2, 0.1, 0.0, 0.0]
    )
    vsize, lo, hi = [0.5, 0.5, 0.5], [0.0, 0.0, 0.0], [4.0, 3.0, 2.0]
    gen = spconv.utils.PointToVoxel(vsize, lo + hi, 4, max_voxels, max_points)
    voxels, indices, num, ids = gen.generate_voxel_with_id(pc)
    ref_vox, ref_coords, ref_counts, ref_ids = _brute_force_voxels(
        pc.float(), vsize, lo, [8, 6, 4], max_voxels, max_points
    )
    assert gen.grid_size == [4, 6, 8]
    assert indices.tolist() == ref_coords and num.tolist() == ref_counts and ids.tolist() == ref_ids
    for v, pts in enumerate(ref_vox):
        torch.testing.assert_close(voxels[v, : len(pts)], torch.tensor(pts))
        assert bool((voxels[v, len(pts) :] == 0).all())
    mean_vox, _, _ = gen(pc, empty_mean=True)
    for v, pts in enumerate(ref_vox):
        torch.testing.assert_close(
            mean_vox[v, len(pts) :], torch.tensor(pts).mean(0).expand(max_points - len(pts), 4)
        )


def test_point_to_voxel_bad_arguments():
    with pytest.raises(ValueError, match="coors_range_xyz"):
        spconv.utils.PointToVoxel([0.1, 0.1, 0.1], [0, 0, 0, 1, 1], 4, 10, 5)
    with pytest.raises(ValueError, match="max_num_voxels"):
        spconv.utils.PointToVoxel([0.1, 0.1, 0.1], [0, 0, 0, 1, 1, 1], 4, 0, 5)
    gen = spconv.utils.PointToVoxel([0.1, 0.1, 0.1], [0, 0, 0, 1, 1, 1], 4, 10, 5)
    with pytest.raises(ValueError, match="num_point_features=4"):
        gen(torch.rand(5, 3))


# ---------------------------------------------------------------------------- bad arguments
def test_tensor_bad_arguments():
    feats, idx = torch.randn(3, 2), torch.zeros(3, 4, dtype=torch.int32)
    with pytest.raises(TypeError, match="int32"):
        spconv.SparseConvTensor(feats, idx.long(), [4, 4, 4], 1)
    with pytest.raises(ValueError, match="spatial_shape has 2 axes"):
        spconv.SparseConvTensor(feats, idx, [4, 4], 1)
    with pytest.raises(ValueError, match="one index row per feature row"):
        spconv.SparseConvTensor(feats[:2], idx, [4, 4, 4], 1)
    with pytest.raises(ValueError, match="batch_size must be positive"):
        spconv.SparseConvTensor(feats, idx, [4, 4, 4], 0)
    with pytest.raises(ValueError, match="features must be a 2-D"):
        spconv.SparseConvTensor(feats[0], idx, [4, 4, 4], 1)
    with pytest.raises(TypeError, match="spatial_shape"):
        spconv.SparseConvTensor(feats, idx, 4, 1)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: spconv.SubMConv3d(3, 4, 2), "odd"),
        (lambda: spconv.SubMConv3d(3, 4, 9), "at most 7"),
        (lambda: spconv.SparseConv3d(3, 4, 3, groups=2), "groups=1"),
        (lambda: spconv.SparseConv3d(0, 4, 3), "in_channels"),
        (lambda: spconv.SparseConv3d(3, 4, 3, stride=0), "stride"),
        (lambda: spconv.SparseConv3d(3, 4, 3, padding=-1), "padding"),
        (lambda: spconv.SparseConv3d(3, 4, (3, 3)), "kernel_size"),
        (lambda: spconv.SparseConv3d(3, 4, 1, padding=1), "padding must be zero"),
        (lambda: spconv.SparseInverseConv3d(3, 4, 3, indice_key=None), "indice_key"),
        (lambda: spconv.SparseMaxPool3d(3, stride=0), "stride"),
    ],
)
def test_layer_constructor_bad_arguments(make, match):
    with pytest.raises((ValueError, TypeError, NotImplementedError), match=match):
        make()


def test_layer_call_bad_arguments():
    x = random_tensor([5, 5, 5], 1, 20, 3)
    with pytest.raises(ValueError, match="channels"):
        spconv.SubMConv3d(4, 4, 3)(x)
    with pytest.raises(TypeError, match="SparseConvTensor"):
        spconv.SubMConv3d(3, 4, 3)(x.features)
    with pytest.raises(ValueError, match="3-D tensor"):
        spconv.SubMConv3d(3, 4, 3)(
            spconv.SparseConvTensor(x.features, x.indices[:, :3].contiguous(), [5, 5], 1)
        )
    with pytest.raises(ValueError, match="reaches zero"):
        spconv.SparseConv3d(3, 4, 7)(x)
    outside = spconv.SparseConvTensor(x.features, x.indices + 10 * (torch.arange(4) == 1).int(), [5, 5, 5], 1)
    with pytest.raises(ValueError, match="inside spatial_shape"):
        spconv.SparseConv3d(3, 4, 3, 2, 1)(outside)
    with pytest.raises(TypeError, match="SparseConvTensor"):
        spconv.AddTable()([x.features])
