"""GPU property tests at scale: random voxel scenes, conv3d on CUDA against dense conv3d (float64, CPU).

Examples per test come from RELCONV_PROPERTY_EXAMPLES (default 25, so the normal GPU run stays quick;
the reliability run uses 2000). Every dtype the CUDA kernels take is drawn, and float32/float64 also
check the input and weight gradients against autograd through the dense reference.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from voxel_refs import dense_conv, random_voxels

from relconv.voxel import conv3d

pytestmark = pytest.mark.cuda

EXAMPLES = int(os.environ.get("RELCONV_PROPERTY_EXAMPLES", "25"))
# Max error relative to the reference's magnitude; fp16/bf16 accumulate in float32.
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
DTYPES = list(TOL)


def _rel_max_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    return ((a - ref).abs().max() / ref.abs().max().clamp_min(1.0)).item() if ref.numel() else 0.0


def check_voxel_case(device, n, size, kernel, stride, dilation, batch, groups, cin_g, cout_g, dtype, seed):
    """conv3d on `device` in `dtype` equals the float64 dense reference (and its gradients)."""
    x64 = random_voxels(n, size, groups * cin_g, batch=batch, seed=seed)
    k_vol = kernel[0] * kernel[1] * kernel[2]
    gen = torch.Generator().manual_seed(seed + 1)
    w64 = (
        torch.randn(k_vol, groups, cin_g, cout_g, generator=gen, dtype=torch.float64) / (k_vol * cin_g) ** 0.5
    )
    w_arg = w64[:, 0] if groups == 1 else w64
    with_grad = dtype in (torch.float32, torch.float64)
    feats = x64.feats.to(device, dtype).requires_grad_(with_grad)
    w = w_arg.to(device, dtype).requires_grad_(with_grad)
    x = x64.to(device)
    y = conv3d(x.replace_feature(feats), w, kernel, stride, dilation, groups)
    assert y.feats.dtype == dtype and y.feats.device.type == torch.device(device).type
    f_ref = x64.feats.clone().requires_grad_(with_grad)
    w_ref = w_arg.clone().requires_grad_(with_grad)
    ref = dense_conv(
        x64.replace_feature(f_ref),
        w_ref,
        y.coords.cpu(),
        size,
        batch,
        kernel,
        stride,
        (dilation,) * 3,
        groups,
    )
    err = _rel_max_err(y.feats, ref)
    assert err <= TOL[dtype], f"forward error {err:.3e}"
    if with_grad and ref.numel():
        g = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
        dx, dw = torch.autograd.grad(y.feats, (feats, w), g.to(device, dtype))
        dx_ref, dw_ref = torch.autograd.grad(ref, (f_ref, w_ref), g)
        assert _rel_max_err(dx, dx_ref) <= TOL[dtype], "input gradient"
        assert _rel_max_err(dw, dw_ref) <= TOL[dtype], "weight gradient"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 400),
    size=st.integers(2, 12),
    kernel=st.tuples(*[st.integers(1, 4)] * 3),
    stride=st.sampled_from([(1, 1, 1), (2, 2, 2), (1, 2, 3), (3, 1, 2)]),
    dilation=st.integers(1, 2),
    batch=st.integers(1, 3),
    groups=st.sampled_from([1, 2]),
    cin_g=st.sampled_from([1, 3, 8, 16]),
    cout_g=st.sampled_from([1, 4, 8, 32]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**20),
)
def test_random_voxel_conv_matches_dense_on_cuda(
    n, size, kernel, stride, dilation, batch, groups, cin_g, cout_g, dtype, seed
):
    check_voxel_case("cuda", n, size, kernel, stride, dilation, batch, groups, cin_g, cout_g, dtype, seed)
