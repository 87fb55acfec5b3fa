"""CPU checks of the compat harness's own logic (benchmarks/compat): row alignment, the projection
loss, the native twins' weight loading. Running the downstream backbones needs their snapshots and the
libraries (see benchmarks/compat/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.compat import backbones, native, parity
from benchmarks.compat.child import projection_loss
from relconv.convert import convert_state_dict


def _outputs(seed=0, n=50):
    g = torch.Generator().manual_seed(seed)
    coords = torch.unique(torch.randint(0, 6, (n, 4), generator=g), dim=0)
    return {"a": (coords, torch.randn(coords.shape[0], 3, generator=g))}


def test_compare_outputs_aligns_rows_by_coordinates():
    ref = _outputs()
    c, f = ref["a"]
    perm = torch.randperm(c.shape[0], generator=torch.Generator().manual_seed(1))
    got = parity.compare_outputs(ref, {"a": (c[perm], f[perm])})["a"]
    assert got["coords_same_set"] and not got["coords_same_order"] and got["feats_rel_err"] == 0.0
    moved = c.clone()
    moved[0, 1] += 100
    assert parity.compare_outputs(ref, {"a": (moved, f)})["a"]["coords_same_set"] is False
    dup = torch.cat([c[:1], c[:-1]])
    assert parity.compare_outputs({"a": (dup, f)}, {"a": (dup, f)})["a"]["coords_same_set"] is False


def test_projection_loss_ignores_row_order():
    out = _outputs(seed=2)
    c, f = out["a"]
    perm = torch.randperm(c.shape[0], generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(projection_loss(out), projection_loss({"a": (c[perm], f[perm])}))


def test_compare_run_applies_the_dtype_tolerance():
    out = _outputs(seed=4)
    c, f = out["a"]
    grads = {"w": torch.ones(3)}
    run = {"train": {"outputs": out, "input_grad": f, "param_grads": grads}, "infer": {"outputs": out}}
    off = {"a": (c, f * (1 + 1e-3))}
    cand = {"train": {"outputs": off, "input_grad": f, "param_grads": grads}, "infer": {"outputs": off}}
    assert parity.compare_run(run, cand, "fp16")["train"]["pass"]
    assert not parity.compare_run(run, cand, "fp32")["train"]["pass"]


@pytest.mark.parametrize("name", sorted(native.TWINS))
def test_native_twin_loads_torchsparse_named_state(name):
    """A state_dict under TorchSparse's names and kernel layouts loads into the twin and reads back."""
    twin = native.TWINS[name]()
    torch.manual_seed(0)
    for p in twin.parameters():
        p.data.normal_()
    sizes, strides = native._conv_geometry(twin)
    own = {k.replace(".module.", "."): v.clone() for k, v in twin.state_dict().items()}
    ts_state = convert_state_dict(own, "relconv", "torchsparse", kernel_sizes=sizes, strides=strides)
    assert any(k.endswith(".kernel") for k in ts_state) and not any(".module." in k for k in ts_state)
    fresh = native.TWINS[name]()
    native.load_torchsparse_state(fresh, ts_state)
    for k, v in twin.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_library_and_snapshot_errors_are_clear(tmp_path):
    with pytest.raises(backbones.HarnessError, match="library must be one of"):
        backbones.use_library("spconv", "pytorch")
    with pytest.raises(backbones.HarnessError, match="is missing: unpack the downstream snapshots"):
        backbones._load_file("compat_harness_missing", tmp_path / "nothing.py")
    with pytest.raises(backbones.HarnessError, match="is missing"):
        backbones._torchsparse_backbones(Path(tmp_path))
