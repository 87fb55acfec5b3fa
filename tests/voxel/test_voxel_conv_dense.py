"""Every sparse conv variant against dense conv3d / conv_transpose3d: output and both gradients."""

import math

import pytest
import torch
from voxel_refs import dense_conv, dense_conv_transpose, random_voxels

from relconv.voxel import VoxelTensor, conv3d
from relconv.voxel.utils import triple

SIZE = 6


def _weight(kernel, cin, cout, groups, seed=1):
    g = torch.Generator().manual_seed(seed)
    k = math.prod(kernel)
    shape = (k, cin, cout) if groups == 1 else (k, groups, cin // groups, cout // groups)
    return torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)


def _compare(sparse_out, dense_out, inputs):
    g = torch.randn_like(sparse_out)
    got = torch.autograd.grad((sparse_out * g).sum(), inputs)
    want = torch.autograd.grad((dense_out * g).sum(), inputs)
    torch.testing.assert_close(sparse_out, dense_out)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


CASES = [
    # kernel, stride, dilation, groups, batch
    (3, 1, 1, 1, 1),
    (3, 1, 1, 1, 2),
    (1, 1, 1, 1, 1),
    (2, 1, 1, 1, 1),
    (5, 1, 1, 1, 1),
    (3, 1, 2, 1, 1),
    (4, 1, 1, 1, 1),
    ((3, 1, 2), 1, 1, 1, 1),
    (3, 1, 1, 2, 2),
    (3, 1, 1, 4, 1),
    (2, 2, 1, 1, 2),
    (3, 2, 1, 1, 1),
    (3, 2, 2, 1, 1),
    (1, 2, 1, 1, 1),
    (3, 3, 1, 1, 1),
    (2, (2, 1, 2), 1, 1, 1),
    (2, 2, 1, 2, 2),
    (7, 1, 1, 1, 1),
    (6, 2, 1, 1, 1),
]


@pytest.mark.parametrize("kernel,stride,dilation,groups,batch", CASES)
def test_forward_conv_matches_dense(kernel, stride, dilation, groups, batch):
    k, s, d = triple(kernel, "k"), triple(stride, "s"), triple(dilation, "d")
    x = random_voxels(90, SIZE, 4, batch=batch, seed=hash((k, s, d, groups, batch)) % 1000)
    x.feats.requires_grad_(True)
    w = _weight(k, 4, 8, groups)
    y = conv3d(x, w, k, s, d, groups)
    assert y.stride == s
    ref = dense_conv(x, w, y.coords, SIZE, batch, k, s, d, groups)
    _compare(y.feats, ref, (x.feats, w))


@pytest.mark.parametrize("kernel,stride,dilation,groups,batch", [c for c in CASES if c[1] != 1])
def test_transposed_conv_matches_dense(kernel, stride, dilation, groups, batch):
    k, s, d = triple(kernel, "k"), triple(stride, "s"), triple(dilation, "d")
    x = random_voxels(90, SIZE, 4, batch=batch, seed=7)
    down = conv3d(x, _weight(k, 4, 4, 1, seed=3).detach(), k, s, d)
    coarse = down.replace_feature(down.feats.detach().requires_grad_(True))
    w = _weight(k, 4, 8, groups, seed=4)
    up = conv3d(coarse, w, k, s, d, groups, transposed=True)
    assert up.coords is x.coords and up.stride == (1, 1, 1)
    coarse_size = max(-(-SIZE // si) for si in s)
    ref = dense_conv_transpose(coarse, w, up.coords, coarse_size, batch, k, s, d, groups)
    _compare(up.feats, ref, (coarse.feats, w))


@pytest.mark.parametrize(
    "kernel,stride,dilation,groups",
    [(2, 2, 1, 1), (3, 2, 1, 1), (3, 1, 1, 1), (3, 2, 2, 2), ((2, 3, 1), (2, 1, 1), 1, 1)],
)
def test_generative_transposed_matches_dense(kernel, stride, dilation, groups):
    k, s, d = triple(kernel, "k"), triple(stride, "s"), triple(dilation, "d")
    coarse = random_voxels(30, 4, 4, batch=2, seed=11, stride=1)
    coarse = VoxelTensor(coarse.feats, coarse.coords * torch.tensor([1, *s], dtype=torch.int32), s)
    coarse.feats.requires_grad_(True)
    w = _weight(k, 4, 6, groups, seed=5)
    up = conv3d(coarse, w, k, s, d, groups, transposed=True, generative=True)
    assert up.stride == (1, 1, 1)
    ref = dense_conv_transpose(coarse, w, up.coords, 4, 2, k, s, d, groups)
    _compare(up.feats, ref, (coarse.feats, w))
    # The generated sites are exactly the structural support of the dense transposed conv.
    ones = VoxelTensor(torch.ones(len(coarse), 1, dtype=torch.float64), coarse.coords, s)
    wk = torch.ones(math.prod(k), 1, 1, dtype=torch.float64)
    assert bool((dense_conv_transpose(ones, wk, up.coords, 4, 2, k, s, d, 1) > 0).all())


def test_bias_and_module_forward():
    from relconv.voxel import Conv3d

    x = random_voxels(60, SIZE, 3)
    conv = Conv3d(3, 5, 3, bias=True).double()
    y = conv(x)
    ref = dense_conv(x, conv.weight, y.coords, SIZE, 1, (3, 3, 3), (1, 1, 1), (1, 1, 1), 1) + conv.bias
    torch.testing.assert_close(y.feats, ref)


@pytest.mark.parametrize("kernel,stride", [(3, 1), (2, 2), (3, 2)])
def test_conv_at_tensor_stride_two_matches_dense_on_coarse_grid(kernel, stride):
    unit = random_voxels(80, SIZE, 3, batch=2, seed=21)
    x = VoxelTensor(unit.feats, unit.coords * torch.tensor([1, 2, 2, 2], dtype=torch.int32), 2)
    w = _weight((kernel,) * 3, 3, 5, 1)
    y = conv3d(x, w, kernel, stride)
    assert y.stride == (2 * stride,) * 3
    unit_out = y.coords // torch.tensor([1, 2, 2, 2], dtype=torch.int32)
    k3, s3 = (kernel,) * 3, (stride,) * 3
    ref = dense_conv(unit, w, unit_out, SIZE, 2, k3, s3, (1, 1, 1), 1)
    torch.testing.assert_close(y.feats, ref)


@pytest.mark.parametrize(
    ("kernel", "stride", "transposed"), [(3, 1, False), ((3, 1, 2), 2, False), (2, 2, True)]
)
def test_offset_order_runs_the_weight_as_listed(kernel, stride, transposed):
    """conv3d(..., offset_order=o) with W equals the conv in relconv's order with W[argsort(o)]."""
    k = triple(kernel, "k")
    volume = math.prod(k)
    x = random_voxels(90, SIZE, 4, batch=2, seed=11)
    if transposed:  # onto the sites of the strided conv whose map it reuses
        down = conv3d(x, _weight(k, 4, 4, 1, seed=3).detach(), k, stride)
        x = down.replace_feature(down.feats.detach())
    x.feats.requires_grad_(True)
    order = tuple(torch.randperm(volume, generator=torch.Generator().manual_seed(2)).tolist())
    w = _weight(k, 4, 8, 1)
    got = conv3d(x, w, k, stride, transposed=transposed, offset_order=order)
    want = conv3d(x, w[torch.argsort(torch.tensor(order))], k, stride, transposed=transposed)
    assert torch.equal(got.coords, want.coords)
    torch.testing.assert_close(got.feats, want.feats)
    g = torch.randn_like(got.feats)
    got_grads = torch.autograd.grad(got.feats, (x.feats, w), g)
    want_grads = torch.autograd.grad(want.feats, (x.feats, w), g)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_offset_order_must_permute_the_kernel_offsets():
    x = random_voxels(40, SIZE, 4, seed=1)
    w = _weight((3, 3, 3), 4, 8, 1)
    for bad in (tuple(range(26)), (0,) * 27, tuple(range(1, 28))):
        with pytest.raises(ValueError, match=r"offset_order must be a permutation of range\(27\)"):
            conv3d(x, w, 3, offset_order=bad)
