"""Sparse pooling against dense pooling, unpooling against plain loops, and global pooling."""

import pytest
import torch
import torch.nn.functional as F
from voxel_refs import gather, random_voxels

from relconv.voxel import (
    AvgPool3d,
    MaxPool3d,
    PoolTranspose3d,
    SumPool3d,
    global_pool,
    pool3d,
    pool_transpose3d,
)


@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2), (3, 1)])
def test_max_pool_matches_dense(kernel, stride):
    x = random_voxels(120, 6, 3, batch=2)
    # Positive features: the dense zeros of empty voxels never win the max.
    x = x.replace_feature(x.feats.abs() + 0.1)
    y = pool3d(x, kernel, stride, reduce="amax")
    pad = kernel // 2 if kernel % 2 else 0
    dense = F.pad(x.dense(spatial_shape=(6, 6, 6), batch_size=2), [pad, kernel] * 3)
    ref = gather(F.max_pool3d(dense, kernel, stride), y.coords, [0, 0, 0], (stride,) * 3)
    torch.testing.assert_close(y.feats, ref)


@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 1)])
def test_avg_pool_is_mean_over_occupied(kernel, stride):
    x = random_voxels(120, 6, 3, batch=2)
    y = AvgPool3d(kernel, stride)(x)
    pad = kernel // 2 if kernel % 2 else 0
    dense = F.pad(x.dense(spatial_shape=(6, 6, 6), batch_size=2), [pad, kernel] * 3)
    occ = (dense != 0).any(1, keepdim=True).to(dense.dtype)
    total = F.avg_pool3d(dense, kernel, stride) * kernel**3
    count = F.avg_pool3d(occ, kernel, stride) * kernel**3
    ref = gather(total / count.clamp(min=1), y.coords, [0, 0, 0], (stride,) * 3)
    torch.testing.assert_close(y.feats, ref)


@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2), (3, 1)])
def test_sum_pool_matches_dense(kernel, stride):
    x = random_voxels(120, 6, 3, batch=2)
    x.feats.requires_grad_(True)
    y = SumPool3d(kernel, stride)(x)
    pad = kernel // 2 if kernel % 2 else 0
    dense = F.pad(x.dense(spatial_shape=(6, 6, 6), batch_size=2), [pad, kernel] * 3)
    ref = gather(F.avg_pool3d(dense, kernel, stride) * kernel**3, y.coords, [0, 0, 0], (stride,) * 3)
    torch.testing.assert_close(y.feats, ref)
    # each input row reaches the outputs of the windows that hold it
    y.feats.sum().backward()
    windows = torch.zeros(x.feats.shape[0], dtype=x.feats.dtype)
    for out in y.coords.tolist():
        lo = [c - pad for c in out[1:]]
        inside = (x.coords[:, 0] == out[0]) & (
            (x.coords[:, 1:] >= torch.tensor(lo)) & (x.coords[:, 1:] < torch.tensor(lo) + kernel)
        ).all(1)
        windows += inside.float()
    torch.testing.assert_close(x.feats.grad, windows.unsqueeze(1).expand_as(x.feats))


@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2)])
def test_unpooling_is_the_mean_over_the_windows_reaching_each_site(kernel, stride):
    x = random_voxels(120, 6, 3, batch=2)
    coarse = SumPool3d(kernel, stride)(x)
    coarse.feats.requires_grad_(True)
    y = PoolTranspose3d(kernel, stride)(coarse)
    assert torch.equal(y.coords, x.coords) and y.stride == (1, 1, 1)  # the sites the pool started from
    # a coarse site c's window holds the fine sites c - pad + [0, kernel) per axis
    pad = kernel // 2 if kernel % 2 else 0
    want = []
    for site in x.coords.tolist():
        near = [
            f
            for c, f in zip(coarse.coords.tolist(), coarse.feats.detach(), strict=True)
            if c[0] == site[0] and all(0 <= site[a] - c[a] + pad < kernel for a in (1, 2, 3))
        ]
        want.append(torch.stack(near).mean(0))
    torch.testing.assert_close(y.feats.detach(), torch.stack(want))
    y.feats.sum().backward()
    assert coarse.feats.grad.shape == coarse.feats.shape


def test_generative_unpooling_reaches_every_site_of_the_kernel():
    x = random_voxels(40, 4, 2, batch=2, stride=2)
    y = pool_transpose3d(x, 2, 2, generative=True)
    assert y.stride == (1, 1, 1) and y.feats.shape[0] == 8 * x.feats.shape[0]
    parent = {tuple(c): f for c, f in zip(x.coords.tolist(), x.feats, strict=True)}
    for site, f in zip(y.coords.tolist(), y.feats, strict=True):
        torch.testing.assert_close(f, parent[(site[0], *(v - v % 2 for v in site[1:]))])
    with pytest.raises(TypeError, match="VoxelTensor"):
        pool_transpose3d(x.feats, 2, 2)
    with pytest.raises(ValueError, match="has not seen"):  # no strided layer made x: nowhere to unpool to
        pool_transpose3d(x, 2, 2)


def test_max_pool_module_and_gradient():
    x = random_voxels(60, 5, 2)
    x.feats.requires_grad_(True)
    y = MaxPool3d(2)(x)
    y.feats.sum().backward()
    assert x.feats.grad.sum().item() == pytest.approx(y.feats.numel())
    assert y.stride == (2, 2, 2)


def test_global_pool():
    x = random_voxels(50, 4, 3, batch=3)
    b = x.coords[:, 0].long()
    for reduce, fn in (("mean", lambda t: t.mean(0)), ("amax", lambda t: t.max(0).values)):
        got = global_pool(x, reduce)
        for i in range(3):
            torch.testing.assert_close(got[i], fn(x.feats[b == i]))
