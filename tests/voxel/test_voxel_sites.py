"""prune and union (MinkowskiEngine's MinkowskiPruning and MinkowskiUnion) against plain loops."""

import pytest
import torch
from voxel_refs import random_voxels

from relconv.voxel import Conv3d, Prune, Union, VoxelTensor, prune, union
from tests.conftest import DEVICES


def _on(x: VoxelTensor, device: str) -> VoxelTensor:
    return VoxelTensor(x.feats.to(device).requires_grad_(True), x.coords.to(device), x.stride)


@pytest.mark.parametrize("device", DEVICES)
def test_prune_keeps_the_flagged_rows_in_order(device):
    x = _on(random_voxels(80, 6, 3, batch=2), device)
    keep = torch.arange(x.feats.shape[0], device=device) % 3 != 1
    y = Prune()(x, keep)
    assert torch.equal(y.coords, x.coords[keep]) and torch.equal(y.feats, x.feats[keep])
    assert y.stride == x.stride
    y.feats.sum().backward()
    torch.testing.assert_close(x.feats.grad, keep[:, None].to(x.feats.dtype).expand_as(x.feats))
    out = Conv3d(3, 4, 3).to(device, torch.float64)(y)  # a new coordinate set gets maps of its own
    assert torch.equal(out.coords, y.coords)
    assert prune(x, torch.zeros_like(keep)).feats.shape == (0, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_union_sums_the_features_of_shared_sites(device):
    a = _on(random_voxels(60, 5, 3, batch=2, seed=1), device)
    b = _on(random_voxels(60, 5, 3, batch=2, seed=2), device)
    c = _on(random_voxels(10, 5, 3, batch=2, seed=3), device)
    y = Union()(a, b, c)
    want: dict[tuple, torch.Tensor] = {}
    for t in (a, b, c):
        for site, f in zip(t.coords.tolist(), t.feats.detach().cpu(), strict=True):
            want[tuple(site)] = want.get(tuple(site), 0) + f
    sites = sorted(want)
    assert y.coords.tolist() == [list(s) for s in sites]
    torch.testing.assert_close(y.feats.detach().cpu(), torch.stack([want[s] for s in sites]))
    y.feats.square().sum().backward()  # d/dx of a site's sum squared: twice that sum, for each input
    row = {s: i for i, s in enumerate(sites)}
    for t in (a, b, c):
        rows = torch.tensor([row[tuple(s)] for s in t.coords.tolist()], device=device)
        torch.testing.assert_close(t.feats.grad, 2 * y.feats.detach()[rows])
    assert torch.equal(union(a).coords, a.coords)  # one tensor: its own sorted sites


def test_bad_arguments_raise():
    x = random_voxels(20, 4, 3)
    with pytest.raises(TypeError, match="keep must be a bool tensor"):
        prune(x, torch.ones(x.feats.shape[0]))
    with pytest.raises(ValueError, match="one flag per row"):
        prune(x, torch.ones(3, dtype=torch.bool))
    with pytest.raises(TypeError, match="x must be a VoxelTensor"):
        prune(x.feats, torch.ones(x.feats.shape[0], dtype=torch.bool))
    with pytest.raises(ValueError, match="at least one"):
        union()
    with pytest.raises(ValueError, match="tensor stride"):
        union(x, random_voxels(20, 4, 3, stride=2))
    with pytest.raises(ValueError, match="channels"):
        union(x, random_voxels(20, 4, 5))
    with pytest.raises(ValueError, match="float32"):
        union(x, x.replace_feature(x.feats.float()))
    with pytest.raises(TypeError, match=r"tensors\[1\]"):
        union(x, x.feats)
