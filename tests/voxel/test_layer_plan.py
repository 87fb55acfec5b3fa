"""Conv3d's prepared calls (relconv.voxel.conv.LayerPlan, kept per coordinate set in the
module's PreparedCalls): a layer that runs again over the same coordinates runs its stored op
call, which must give what preparing the call again gives, and must step aside whenever the call
state it was made under changes."""

import copy
import pickle

import pytest
import torch
from voxel_refs import random_voxels

import relconv.voxel.conv as conv_module
from relconv.voxel import Conv3d, VoxelTensor
from tests.conftest import no_host_sync


def _scene(device="cpu", dtype=torch.float32, channels=8):
    x = random_voxels(300, 8, channels, batch=2, seed=3).to(device)
    return x.replace_feature(x.feats.to(dtype))


def _unplanned(conv, x):
    """The layer's output over a fresh cache: every call prepared from scratch."""
    return conv(VoxelTensor(x.feats, x.coords, x.stride))


def _key(conv, x):
    """Where a layer's plan over x's coordinates is kept: by the set's cache and the activation."""
    return (id(x.cache), conv.activation)


def _plan_of(conv, x):
    plan = conv._prepared.get(_key(conv, x))
    return None if plan is None else plan.run


def _planned(conv, x):
    """Two no-grad calls: the first marks the layer, the second stores its plan."""
    with torch.no_grad():
        conv(x)
        conv(x)
    assert _plan_of(conv, x) is not None


def test_second_call_stores_the_plan_and_later_calls_match():
    x = _scene()
    conv = Conv3d(8, 16, 3, bias=True, activation="relu")
    with torch.no_grad():
        first = conv(x)
        assert _plan_of(conv, x) is None  # a first call over these coordinates only leaves a mark
        conv(x)
        assert _plan_of(conv, x) is not None
        planned = conv(x.replace_feature(x.feats * 2))
        expected = _unplanned(conv, x.replace_feature(x.feats * 2))
    torch.testing.assert_close(planned.feats, expected.feats)
    assert planned.coords is first.coords and planned.stride == first.stride and planned.cache is x.cache


def test_planned_call_is_the_prepared_one(monkeypatch):
    """With the plan's op call replaced by a spy, the layer's third call goes through it."""
    x = _scene()
    conv = Conv3d(8, 8, 3)
    _planned(conv, x)
    calls = []
    real = conv._prepared[_key(conv, x)]
    spy = real._replace(run=lambda *a: calls.append(a) or real.run(*a))
    conv._prepared[_key(conv, x)] = spy
    with torch.no_grad():
        conv(x)
    assert len(calls) == 1 and calls[0][0] is x.feats


def test_one_forward_per_scan_builds_no_plans():
    conv = Conv3d(8, 8, 3)
    with torch.no_grad():
        for seed in range(3):
            x = random_voxels(200, 8, 8, seed=seed, dtype=torch.float32)
            conv(x)
            assert _plan_of(conv, x) is None


def test_grad_mode_and_requires_grad_changes_fall_back():
    x = _scene()
    conv = Conv3d(8, 8, 3)
    _planned(conv, x)
    feats = x.feats.clone().requires_grad_()
    y = conv(x.replace_feature(feats))  # grad mode on: the no-grad plan must not run (no graph)
    assert y.feats.requires_grad
    g = torch.randn_like(y.feats)
    y.feats.backward(g)
    ref_feats = x.feats.clone().requires_grad_()
    ref_conv = copy.deepcopy(conv)
    ref_conv.weight.grad = None
    _unplanned(ref_conv, x.replace_feature(ref_feats)).feats.backward(g)
    torch.testing.assert_close(feats.grad, ref_feats.grad)
    # Training calls take their own plan, and it records the graph too.
    for _ in range(2):
        conv.weight.grad = None
        out = conv(x.replace_feature(feats))
        out.feats.backward(g)
    torch.testing.assert_close(conv.weight.grad, ref_conv.weight.grad)


def test_dtype_and_weight_changes_fall_back():
    x = _scene(dtype=torch.float64)
    conv = Conv3d(8, 8, 3).double()
    _planned(conv, x)
    with torch.no_grad():
        conv.float()
        y = conv(x.replace_feature(x.feats.float()))
        assert y.feats.dtype == torch.float32
        torch.testing.assert_close(y.feats, _unplanned(conv, x.replace_feature(x.feats.float())).feats)
        conv.weight = torch.nn.Parameter(torch.randn(27, 8, 4))
        y = conv(x.replace_feature(x.feats.float()))
        assert y.feats.shape == (len(x), 4)


def test_wrong_input_still_gets_the_prepared_error():
    x = _scene()
    conv = Conv3d(8, 8, 3)
    _planned(conv, x)
    with torch.no_grad():
        bad = VoxelTensor._trusted(x.feats[:, :4], x.coords, x.stride, x.cache)
        with pytest.raises(ValueError, match="channels"):
            conv(bad)


def test_a_plan_is_never_run_for_another_coordinate_set_under_its_id():
    """Plans are keyed by the coordinate set's cache id; an id reused after a cache dies must not find
    the plan of the old set."""
    x = _scene()
    other = random_voxels(200, 8, 8, batch=2, seed=5, dtype=torch.float32)
    conv = Conv3d(8, 8, 3)
    _planned(conv, x)
    with torch.no_grad():
        conv._prepared[_key(conv, other)] = conv._prepared.pop(_key(conv, x))  # as if other had x's id
        out = conv(other)
        expected = _unplanned(conv, other)
    torch.testing.assert_close(out.feats, expected.feats)
    assert out.coords is other.coords


def test_marks_leave_with_their_coordinates():
    """A network over a new scan keeps no marks of the scans before."""
    conv = Conv3d(8, 8, 3)
    with torch.no_grad():
        for seed in range(3):
            conv(random_voxels(200, 8, 8, seed=seed, dtype=torch.float32))
    assert len(conv._prepared) <= 1


def test_copied_modules_keep_their_own_plans():
    x = _scene()
    a = Conv3d(8, 8, 3)
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.weight.mul_(-1)
        for _ in range(3):
            ya, yb = a(x), b(x)
    torch.testing.assert_close(ya.feats, -yb.feats)


def test_copies_and_pickles_of_a_module_start_without_plans():
    x = _scene()
    conv = Conv3d(8, 8, 3)
    with torch.no_grad():
        for _ in range(3):
            y = conv(x)
        assert _plan_of(conv, x) is not None
        for other in (copy.deepcopy(conv), pickle.loads(pickle.dumps(conv))):
            assert other._prepared == {}
            torch.testing.assert_close(other(x).feats, y.feats)
        # A pickled tensor keeps its maps, and the layer prepares its call over them anew.
        torch.testing.assert_close(conv(pickle.loads(pickle.dumps(x))).feats, y.feats)


def test_a_bias_that_needs_a_cast_is_prepared_every_call():
    x = _scene()
    conv = Conv3d(8, 8, 3, bias=True)
    conv.bias.data = conv.bias.data.double()
    with torch.no_grad():
        for _ in range(3):
            y = conv(x)
    assert _plan_of(conv, x) is None
    torch.testing.assert_close(y.feats, _unplanned(conv, x).feats)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels", [16, 64])
@pytest.mark.cuda
def test_cuda_planned_training_steps_match_prepared_ones(dtype, channels, monkeypatch):
    x = _scene("cuda", dtype, channels)
    conv = Conv3d(channels, channels, 3, bias=True).to("cuda", dtype)
    ref = copy.deepcopy(conv)
    feats = x.feats.clone().requires_grad_()
    g = torch.randn(len(x), channels, device="cuda", dtype=dtype)
    # Enough calls for the map's table schedules to be decided and the plan to be stored.
    for _ in range(12):
        conv.zero_grad()
        feats.grad = None
        out = conv(x.replace_feature(feats))
        out.feats.backward(g)
    assert _plan_of(conv, x) is not None
    # the reference prepares every call
    monkeypatch.setattr(conv_module.PreparedCalls, "keep", lambda *a: None)
    ref_feats = x.feats.clone().requires_grad_()
    ref_x = VoxelTensor(x.feats, x.coords)
    for _ in range(12):
        ref.zero_grad()
        ref_out = ref(ref_x.replace_feature(ref_feats))
    ref_out.feats.backward(g)
    # The table kernels' results do not depend on the schedule (the plan's is sorted, the
    # reference's may not be yet): bitwise equal. The weight gradient accumulates with atomics.
    assert torch.equal(out.feats, ref_out.feats)
    assert torch.equal(feats.grad, ref_feats.grad) and torch.equal(conv.bias.grad, ref.bias.grad)
    torch.testing.assert_close(conv.weight.grad, ref.weight.grad, rtol=2e-2, atol=2e-2)


@pytest.mark.cuda
def test_cuda_plan_steps_aside_under_autocast():
    x = _scene("cuda", torch.float32, 64)
    conv = Conv3d(64, 64, 3).cuda()
    with torch.no_grad():
        for _ in range(12):
            conv(x)
        assert _plan_of(conv, x) is not None
        with torch.autocast("cuda", dtype=torch.float16):
            y = conv(x)
        assert y.feats.dtype == torch.float16
        with torch.autocast("cuda", dtype=torch.float16):
            ref = _unplanned(conv, x)
    assert torch.equal(y.feats, ref.feats)


@pytest.mark.cuda
def test_cuda_plan_build_and_planned_calls_do_not_sync():
    """Marking, storing (with the schedules' sort) and running a plan queue work without a host sync."""
    x = _scene("cuda", torch.float16, 64)
    conv = Conv3d(64, 64, 3).to("cuda", torch.float16)
    with torch.no_grad():
        conv(x)  # builds the map and checks the new coordinates: the one sync
        with no_host_sync():
            for _ in range(4):
                y = conv(x)
        assert _plan_of(conv, x) is not None
        torch.testing.assert_close(y.feats, _unplanned(conv, x).feats, rtol=0, atol=0)
