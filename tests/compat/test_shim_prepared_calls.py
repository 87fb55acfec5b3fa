"""The shims' convolutions keep relconv's prepared op calls (relconv.voxel.PreparedCalls, and
relconv.ops.MapCalls for spconv's strided and inverse layers and TorchSparse's strided convs), as the
native Conv3d does: a layer's third call over the same sites runs the stored call, which gives what
preparing the call again gives, also after the weights change and in training."""

from __future__ import annotations

import copy

import pytest
import torch

import relconv.spconv as spconv
import relconv.torchsparse.nn as spnn
from relconv.ops import MapCalls
from relconv.spconv.core import SiteSet
from relconv.torchsparse import SparseTensor
from relconv.voxel import PreparedCalls, conv3d
from tests.compat.spconv_refs import random_tensor
from tests.compat.torchsparse_refs import scene


def _spconv_case():
    layer = spconv.SubMConv3d(4, 6, 3, bias=True).double()
    x = random_tensor([7, 6, 5], 2, 80, 4, seed=1)
    x = x.replace_feature(x.features.double())
    return layer, x, lambda lyr: [lyr._calls]


def _spconv_strided_case():
    layer = spconv.SparseConv3d(4, 6, 3, stride=2, padding=1, bias=True).double()
    x = random_tensor([7, 6, 5], 2, 80, 4, seed=1)
    return layer, x.replace_feature(x.features.double()), lambda lyr: [lyr._map_calls]


def _spconv_inverse_case():
    down = spconv.SparseConv3d(4, 6, 3, stride=2, padding=1, indice_key="d").double()
    x = random_tensor([7, 6, 5], 2, 80, 4, seed=1)
    with torch.no_grad():
        y = down(x.replace_feature(x.features.double()))
    layer = spconv.SparseInverseConv3d(6, 4, 3, indice_key="d", bias=True).double()
    return layer, y, lambda lyr: [lyr._map_calls]


def _torchsparse_case(stride):
    layer = spnn.Conv3d(3, 5, 3, stride=stride, bias=True).double()
    x = scene(n=80)
    # Submanifold layers keep relconv.voxel calls per geometry, strided ones map calls (grid maps).
    return layer, x, lambda lyr: [*lyr._runs.layers.values(), lyr._runs.grid_calls]


CASES = {
    "spconv-subm": _spconv_case,
    "spconv-strided": _spconv_strided_case,
    "spconv-inverse": _spconv_inverse_case,
    "torchsparse-subm": lambda: _torchsparse_case(1),
    "torchsparse-strided": lambda: _torchsparse_case(2),
}


def _feats(out):
    return out.features if hasattr(out, "features") else out.feats


def _stored_runs(calls_of, layer) -> list:
    """The layer's stored calls (None where a first call only marked its sites or map)."""
    runs = []
    for calls in calls_of(layer):
        assert isinstance(calls, (PreparedCalls, MapCalls))
        runs += [entry.run if isinstance(calls, PreparedCalls) else entry[1] for entry in calls.values()]
    return runs


def _spy_on(calls_of, layer):
    """Wraps every stored call of the layer; returns the list the wrappers append to."""
    seen = []
    assert all(run is not None for run in _stored_runs(calls_of, layer)), "the second call stores it"
    for calls in calls_of(layer):
        for key, entry in calls.items():
            if isinstance(calls, PreparedCalls):
                calls[key] = entry._replace(run=lambda *a, run=entry.run: seen.append(a) or run(*a))
            else:
                calls[key] = (entry[0], lambda *a, run=entry[1]: seen.append(a) or run(*a))
    return seen


@pytest.mark.parametrize("case", sorted(CASES))
def test_third_call_runs_the_prepared_call_and_matches(case):
    layer, x, calls_of = CASES[case]()
    fresh = copy.deepcopy(layer)  # starts without calls: every call prepared from scratch
    with torch.no_grad():  # a TorchSparse conv runs when its output is first used: use each
        _feats(layer(x))
        _feats(layer(x))
        seen = _spy_on(calls_of, layer)
        got = _feats(layer(x))
        assert len(seen) == 1
        want = _feats(copy.deepcopy(fresh)(x))
        for p in (*layer.parameters(), *fresh.parameters()):
            p.mul_(-0.5)
        changed = _feats(layer(x))
        assert len(seen) == 2
        want_changed = _feats(fresh(x))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(changed, want_changed)
    assert calls_of(fresh) and all(c is not d for c in calls_of(fresh) for d in calls_of(layer))


@pytest.mark.parametrize("case", sorted(CASES))
def test_prepared_training_steps_match_fresh_ones(case):
    layer, x, calls_of = CASES[case]()
    fresh = copy.deepcopy(layer)
    for _ in range(3):
        layer.zero_grad()
        out = layer(x)
        _feats(out).square().sum().backward()
    assert any(run is not None for run in _stored_runs(calls_of, layer))
    ref = fresh(x)
    _feats(ref).square().sum().backward()
    torch.testing.assert_close(_feats(out), _feats(ref))
    for p, q in zip(layer.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_spconv_submanifold_runs_its_stored_call_on_the_features(monkeypatch):
    # Once the call is stored, the layer hands it the features as they are: no VoxelTensor is made.
    layer, x, _ = _spconv_case()
    with torch.no_grad():
        layer(x)
        want = layer(x).features
        wrapped = []
        voxel = SiteSet.voxel
        monkeypatch.setattr(SiteSet, "voxel", lambda self, f: wrapped.append(f) or voxel(self, f))
        got = layer(x).features
        assert wrapped == []
        # Features in another dtype step aside to the full path, which wraps them and names the
        # mismatch.
        with pytest.raises(ValueError, match="dtype"):
            layer(x.replace_feature(x.features.float()))
    assert len(wrapped) == 1
    torch.testing.assert_close(got, want)


def test_a_stored_call_keeps_its_activation():
    # A TorchSparse conv folds a following ReLU into its call; the same conv alone over the same
    # sites must not run the stored call with the ReLU in it (nor the other way round).
    conv = spnn.Conv3d(3, 5, 3, bias=True).double().eval()
    with_relu = torch.nn.Sequential(conv, spnn.ReLU(True)).eval()
    x = scene(n=80)
    with torch.no_grad():
        plain = copy.deepcopy(conv)(x).F
        for _ in range(3):
            relu = with_relu(x).F
        for _ in range(3):
            alone = conv(x).F
        for _ in range(2):
            relu_again = with_relu(x).F
    assert plain.min() < 0
    torch.testing.assert_close(alone, plain)
    torch.testing.assert_close(relu, plain.relu())
    torch.testing.assert_close(relu_again, plain.relu())


def test_native_prepared_calls_key_on_the_activation():
    x = scene(n=80)._voxel()
    weight = torch.randn(27, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    calls = PreparedCalls()
    plain = conv3d(x, weight, 3).feats
    for _ in range(3):
        relu = conv3d(x, weight, 3, activation="relu", prepared=calls).feats
    for _ in range(3):
        alone = conv3d(x, weight, 3, prepared=calls).feats
    assert plain.min() < 0 and len(calls) == 2
    torch.testing.assert_close(relu, plain.relu())
    torch.testing.assert_close(alone, plain)


def test_torchsparse_submanifold_runs_its_stored_call_on_the_features(monkeypatch):
    # Once the call is stored, the conv hands it the features as they are: no relconv tensor is made.
    layer, x, _ = _torchsparse_case(1)
    with torch.no_grad():
        first = layer(x).F
        want = layer(x).F
        made = []
        voxel = SparseTensor._voxel
        monkeypatch.setattr(SparseTensor, "_voxel", lambda self: made.append(self) or voxel(self))
        out = layer(x)
        got = out.F
        assert made == []
        assert out.coords is x.coords and out.spatial_range == x.spatial_range
        # Features in another dtype step aside to the full path, which names the mismatch.
        with pytest.raises(ValueError, match="dtype"):
            _feats(layer(x._like(x.feats.float())))
    assert len(made) == 1
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(first, want)
