"""CPU checks of the compat harness's own logic (benchmarks/compat): row alignment, the projection
loss, the native twins' weight loading, the loader-side inputs. Running the downstream backbones
needs their snapshots and the libraries (see benchmarks/compat/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.compat import backbones, native, parity
from benchmarks.compat.child import projection_loss
from benchmarks.compat.grid_conv import GridBlock
from relconv.convert import convert_state_dict
from relconv.voxel import VoxelTensor


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


def _run(out, grad, params):
    return {"train": {"outputs": out, "input_grad": grad, "param_grads": params}, "infer": {"outputs": out}}


def test_accuracy_measures_each_fp32_run_against_float64():
    truth = _outputs(seed=5)
    c, f = truth["a"]
    perm = torch.randperm(c.shape[0], generator=torch.Generator().manual_seed(6))
    w = {"w": torch.ones(3)}

    def off(scale):  # rows permuted, features and gradients off by `scale` relative
        moved = {"a": (c[perm], f[perm] * (1 + scale))}
        return _run(moved, f * (1 + scale), {"w": w["w"] * (1 + scale)})

    runs = {"real": off(1e-3), "shim": off(1.5e-3), "worse": off(5e-3), "exact": off(0.0)}
    errors = parity.accuracy(runs, _run(truth, f, w))
    assert errors["real"]["train"]["feats"] == pytest.approx(1e-3, rel=1e-3)
    assert errors["exact"]["infer"]["feats"] == 0.0
    assert errors["real"]["train"]["param_grad"] == pytest.approx(1e-3, rel=1e-3)
    tol = parity.TOLERANCE["fp32"]
    assert parity.as_accurate(errors, "real", "shim", tol) == {"train": True, "infer": True}
    assert parity.as_accurate(errors, "real", "worse", tol) == {"train": False, "infer": False}
    assert parity.as_accurate(errors, "worse", "real", tol)["train"]
    moved = {"a": (c + 1, f)}  # other sites: never as accurate
    errors = parity.accuracy({"real": off(0.0), "shim": _run(moved, f, w)}, _run(truth, f, w))
    assert errors["shim"]["infer"]["feats"] == float("inf")
    assert not parity.as_accurate(errors, "real", "shim", tol)["infer"]


def test_a_parameter_gradient_that_is_zero_in_exact_arithmetic_is_measured_against_the_largest():
    out = _outputs(seed=7)
    c, f = out["a"]
    big, bias = torch.ones(3), torch.full((3,), 1e-12)  # a bias that a training BatchNorm follows
    ref = _run(out, f, {"w": big, "b": bias})
    cand = _run(out, f, {"w": big, "b": -bias})  # rounding noise of the other sign
    assert parity.compare_run(ref, cand, "fp32")["train"]["pass"]
    assert parity.accuracy({"x": cand}, ref)["x"]["train"]["param_grad"] < 1e-5
    off = _run(out, f, {"w": big * (1 + 1e-3), "b": bias})
    assert not parity.compare_run(ref, off, "fp32")["train"]["pass"]


@pytest.mark.parametrize("name", sorted(native.TWINS))
def test_native_twin_loads_the_real_librarys_named_state(name):
    """A state_dict under the real library's names and kernel layout loads into the twin and reads
    back."""
    layout = native.LAYOUTS[name]
    twin = native.TWINS[name]()
    torch.manual_seed(0)
    for p in twin.parameters():
        p.data.normal_()
    sizes, strides = native._conv_geometry(twin)
    own = {k.replace(".module.", "."): v.clone() for k, v in twin.state_dict().items()}
    real_state = convert_state_dict(own, "relconv", layout, kernel_sizes=sizes, strides=strides)
    name_end, dims = {"torchsparse": (".kernel", 3), "spconv": (".weight", 5)}[layout]
    assert any(k.endswith(name_end) and v.dim() == dims for k, v in real_state.items())
    assert not any(".module." in k for k in real_state)
    fresh = native.TWINS[name]()
    native.load_state(fresh, real_state, layout)
    for k, v in twin.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


@pytest.mark.parametrize(("kernel_size", "stride"), [(3, 2), ((1, 3, 1), (1, 2, 1))])
def test_grid_block_is_torchsparse_default_strided_conv_block(kernel_size, stride):
    """The SparseResNet21D twin's strided block against relconv.torchsparse's conv -> BatchNorm ->
    ReLU on a tensor with a spatial range: same sites, features and gradients, in training and folded
    at inference."""
    import relconv.torchsparse as torchsparse
    import relconv.torchsparse.nn as spnn

    g = torch.Generator().manual_seed(0)
    coords = torch.unique(
        torch.cat([torch.randint(0, 2, (80, 1), generator=g), torch.randint(0, 9, (80, 3), generator=g)], 1),
        dim=0,
    ).int()
    feats = torch.randn(coords.shape[0], 3, generator=g, dtype=torch.float64)
    grid = (2, 10, 10, 10)
    ts_block = torch.nn.Sequential(
        spnn.Conv3d(3, 4, kernel_size, stride=stride), spnn.BatchNorm(4), spnn.ReLU(True)
    )
    twin = GridBlock(3, 4, kernel_size, stride)
    ts_block.double(), twin.double()
    with torch.no_grad():
        ts_block[0].kernel.normal_(generator=g)
        ts_block[1].weight.uniform_(0.5, 1.5, generator=g)
        ts_block[1].bias.normal_(generator=g)
    sizes = {"0": twin[0].kernel_size}
    state = convert_state_dict(
        ts_block.state_dict(), "torchsparse", "relconv", kernel_sizes=sizes, strides={"0": twin[0].stride}
    )
    twin.load_state_dict({k: state[k.replace(".module.", ".")] for k in twin.state_dict()})
    twin[0].grid = grid
    for training in (True, False):
        ts_block.train(training), twin.train(training)
        with torch.set_grad_enabled(training):
            x_ts = torchsparse.SparseTensor(
                feats.clone().requires_grad_(training), coords, spatial_range=grid
            )
            x_native = VoxelTensor(feats.clone().requires_grad_(training), coords)
            want, got = ts_block(x_ts), twin(x_native)
            out_stride = torch.tensor([1, *twin[0].stride], dtype=torch.int32)
            assert torch.equal(got.coords, want.coords * out_stride)
            torch.testing.assert_close(got.feats, want.feats)
            if training:
                w = torch.randn(want.feats.shape, generator=g, dtype=torch.float64)
                (want.feats * w).sum().backward()
                (got.feats * w).sum().backward()
                torch.testing.assert_close(x_native.feats.grad, x_ts.feats.grad)


@pytest.mark.parametrize(
    ("kernel_size", "stride", "padding"), [(3, 2, 1), (3, 2, (0, 1, 1)), ((3, 1, 1), (2, 1, 1), 0)]
)
def test_grid_block_is_spconv_regular_conv_block(kernel_size, stride, padding):
    """The OpenPCDet twins' strided block against relconv.spconv's SparseConv3d -> BatchNorm1d ->
    ReLU on the same grid: same sites, features and gradients, in training and folded at inference."""
    import relconv.spconv as spconv

    g = torch.Generator().manual_seed(1)
    sites = torch.randint(0, 9, (90, 3), generator=g)
    coords = torch.unique(torch.cat([torch.randint(0, 2, (90, 1), generator=g), sites], 1), dim=0).int()
    feats = torch.randn(coords.shape[0], 3, generator=g, dtype=torch.float64)
    shape = [9, 10, 11]
    real = spconv.SparseSequential(
        spconv.SparseConv3d(3, 4, kernel_size, stride=stride, padding=padding, bias=False),
        torch.nn.BatchNorm1d(4, eps=1e-3, momentum=0.01),
        torch.nn.ReLU(),
    ).double()
    twin = GridBlock(3, 4, kernel_size, stride, padding, eps=1e-3, momentum=0.01).double()
    with torch.no_grad():
        real[0].weight.normal_(generator=g)
        real[1].weight.uniform_(0.5, 1.5, generator=g)
        real[1].bias.normal_(generator=g)
    state = convert_state_dict(real.state_dict(), "spconv", "relconv")
    twin.load_state_dict({k: state[k.replace(".module.", ".")] for k in twin.state_dict()})
    twin[0].grid = (2, *shape)
    for training in (True, False):
        real.train(training), twin.train(training)
        with torch.set_grad_enabled(training):
            x_real = spconv.SparseConvTensor(feats.clone().requires_grad_(training), coords, shape, 2)
            x_twin = VoxelTensor(feats.clone().requires_grad_(training), coords)
            want, got = real(x_real), twin(x_twin)
            order = [
                sorted(range(len(c)), key=lambda r, c=c: c[r].tolist()) for c in (want.indices, got.coords)
            ]
            out_stride = torch.tensor([1, *twin[0].stride], dtype=torch.int32)
            assert torch.equal(got.coords[order[1]], want.indices[order[0]] * out_stride)
            torch.testing.assert_close(got.feats[order[1]], want.features[order[0]])
            if training:
                w = torch.randn(want.features.shape, generator=g, dtype=torch.float64)
                (want.features * w).sum().backward()
                (got.feats[order[1]] * w[order[0]]).sum().backward()
                torch.testing.assert_close(x_twin.feats.grad, x_real.features.grad)


def test_library_and_snapshot_errors_are_clear(tmp_path):
    with pytest.raises(backbones.HarnessError, match="library must be one of"):
        backbones.use_library("spconv", "pytorch")
    with pytest.raises(backbones.HarnessError, match="is missing: unpack the downstream snapshots"):
        backbones._load_file("compat_harness_missing", tmp_path / "nothing.py")
    with pytest.raises(backbones.HarnessError, match="is missing"):
        backbones._torchsparse_backbones(Path(tmp_path))


def test_markdown_lists_each_dtype_against_float64():
    row = {"feats": 2e-3, "input_grad": 1e-2, "param_grad": 3e-2}
    errors = {d: {"real": {"train": row, "infer": {"feats": 1e-3}}} for d in ("fp32", "fp16")}
    errors["fp16"]["shim"] = {"train": row, "infer": {"feats": 5e-3}}
    verdicts = {"fp32": {}, "fp16": {"shim": parity.as_accurate(errors["fp16"], "real", "shim", 1e-2)}}
    report = {"backbone": "B", "candidates": {}, "accuracy": {"errors": errors, "as_accurate": verdicts}}
    text = parity.markdown([report])
    assert "| B | shim | fp16 | infer | 5.00e-03 |  |  | yes |" in text
    assert "| B | real | fp32 | train | 2.00e-03 | 1.00e-02 | 3.00e-02 | reference |" in text


def test_speed_table_gives_gpu_time_and_its_ratio():
    from benchmarks.compat import speed

    def lib(kind, ms, gpu):
        row = {"dtype": "fp32", "phase": "inference", "latency_ms": ms, "throughput_ms": ms}
        row.update(gpu_ms=gpu, kernel_launches=10, host_syncs=0)
        return {"backbone": "B", "library_kind": kind, "library": kind, "rows": [row]}

    results = [lib("real", 6.0, 4.0), lib("shim", 3.0, 2.5)]
    (row,) = speed.summarise(results)
    assert row["real_over_shim_gpu_ms"] == pytest.approx(1.6)
    text = speed.markdown(results)
    assert "| B | fp32 | inference | 6.00 / 6.00 / 4.00 (10 launches, 0 waits) |" in text
    assert "| 2.00 | 2.00 | 1.60 | - | - |" in text


def test_speed_rounds_take_medians_and_pair_ratios_within_a_round():
    from benchmarks.compat import speed

    def lib(kind, ms, rnd):
        row = {"dtype": "fp16", "phase": "training", "latency_ms": ms, "throughput_ms": ms, "gpu_ms": ms / 2}
        row.update(kernel_launches=10, host_syncs=0)
        return {"backbone": "B", "library_kind": kind, "library": kind, "round": rnd, "rows": [row]}

    # The host is twice as slow in round 1: the shim's rounds read 2.0 / 2.0 / 2.1 of the native twin's.
    results = [lib("shim", 2.0, 0), lib("native", 1.0, 0), lib("shim", 8.0, 1), lib("native", 4.0, 1)]
    results += [lib("shim", 2.1, 2), lib("native", 1.0, 2)]
    (row,) = speed.summarise(results)
    assert row["shim"]["latency_ms"] == 2.1 and row["native"]["latency_ms"] == 1.0
    assert row["shim"]["rounds"] == 3
    assert row["shim_over_native_latency_ms"] == pytest.approx(2.0)  # not 2.1 / 1.0
    assert row["real_over_shim_latency_ms"] is None
    assert "Medians over 3 rounds" in speed.markdown(results)
    failed = [
        {
            "backbone": "B",
            "library_kind": "shim",
            "round": 0,
            "rows": [{"dtype": "fp16", "phase": "training", "error": "E"}],
        }
    ]
    (row,) = speed.summarise(failed + results[1:2])
    assert row["shim"] == {"dtype": "fp16", "phase": "training", "error": "E"}
    assert row["shim_over_native_latency_ms"] is None


def _fake_speed_child(order):
    def child(cmd, timeout):
        name, library, out = cmd[1], cmd[2], cmd[3]
        kinds = [library, "native"] if "--with-native" in cmd else [library]
        order.append("+".join(kinds))
        row = {"dtype": "fp32", "phase": "inference", "latency_ms": 1.0, "throughput_ms": 1.0}
        results = [{"library": k, "library_kind": k, "backbone": name, "rows": [row]} for k in kinds]
        Path(out).write_text(json.dumps(results))
        return None

    return child


def test_speed_rounds_rotate_the_libraries(monkeypatch, tmp_path):
    from benchmarks.compat import speed

    order = []
    monkeypatch.setattr(speed, "run_child", _fake_speed_child(order))
    argv = ["--out", str(tmp_path), "--backbones", "SparseResNet21D", "--libraries", "real,shim,native"]
    assert speed.main(argv + ["--rounds", "3", "--device", "cpu", "--separate-twin"]) == 0
    assert order == ["real", "shim", "native", "shim", "native", "real", "native", "real", "shim"]
    saved = json.loads((tmp_path / "speed.json").read_text())
    assert [r["round"] for r in saved["results"]] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    with pytest.raises(SystemExit):
        speed.parse(["--out", str(tmp_path), "--rounds", "0"])


def test_speed_runs_the_shim_and_its_twin_in_one_process(monkeypatch, tmp_path):
    from benchmarks.compat import speed

    order = []
    monkeypatch.setattr(speed, "run_child", _fake_speed_child(order))
    argv = ["--out", str(tmp_path), "--backbones", "SparseResNet21D", "--rounds", "2", "--device", "cpu"]
    assert speed.main(argv) == 0
    assert order == ["real", "shim+native", "shim+native", "real"]
    saved = json.loads((tmp_path / "speed.json").read_text())
    assert [(r["library_kind"], r["round"]) for r in saved["results"]] == [
        ("real", 0),
        ("shim", 0),
        ("native", 0),
        ("shim", 1),
        ("native", 1),
        ("real", 1),
    ]
    (row,) = saved["summary"]
    assert row["shim_over_native_latency_ms"] == 1.0 and row["real_over_shim_latency_ms"] == 1.0


def test_speed_child_times_two_sides_turn_about(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from benchmarks.compat import child
    from benchmarks.harness.timing import TimingConfig

    turns = []

    def side(kind):
        model = torch.nn.Linear(3, 3)

        def run(feats):
            turns.append(kind)
            return {"a": (torch.zeros(feats.shape[0], 4, dtype=torch.long), model(feats))}

        features = lambda dtype, requires_grad: torch.randn(5, 3, dtype=dtype)  # noqa: E731
        backbone = SimpleNamespace(name="B")
        return SimpleNamespace(
            library=kind,
            described=kind,
            backbone=backbone,
            model=model,
            run=run,
            features=features,
            device=torch.device("cpu"),
        )

    measured = []

    def measure(fn, inputs, device, config):
        fn(inputs[0])
        measured.append(turns[-1])
        ms = 1.0 if turns[-1] == "shim" else 2.0
        return child.Timing(ms, ms, ms, ms + len(measured), 1, None)

    profiled = []

    def profile_call(fn, inp, device, top):
        profiled.append((turns[-1], len(measured)))  # right after that side's last measurement
        return {"gpu_ms": 0.5}

    monkeypatch.setattr(child, "measure", measure)
    monkeypatch.setattr(child, "profile_call", profile_call)
    out = tmp_path / "speed.json"
    child.speed([side("shim"), side("native")], ["fp32"], TimingConfig(), out)
    assert measured == ["shim", "native", "native", "shim"] * 2  # inference, then training
    assert profiled == [("native", 3), ("shim", 4), ("native", 7), ("shim", 8)]
    shim, twin = json.loads(out.read_text())
    assert (shim["library_kind"], twin["library_kind"]) == ("shim", "native")
    infer = shim["rows"][0]
    assert (infer["dtype"], infer["phase"], infer["latency_ms"], infer["runs"]) == (
        "fp32",
        "inference",
        1.0,
        2,
    )
    assert infer["throughput_ms"] == 3.5  # the median of the shim's two turns, 1 + 1 and 1 + 4
    assert twin["rows"][1]["phase"] == "training" and twin["rows"][1]["latency_ms"] == 2.0

    def fails_for_the_twin(fn, inputs, device, config):
        timing = measure(fn, inputs, device, config)
        if measured[-1] == "native":
            raise RuntimeError("out of memory")
        return timing

    monkeypatch.setattr(child, "measure", fails_for_the_twin)
    measured.clear()
    child.speed([side("shim"), side("native")], ["fp32"], TimingConfig(), out)
    shim, twin = json.loads(out.read_text())
    assert twin["rows"][0] == {"dtype": "fp32", "phase": "inference", "error": "RuntimeError: out of memory"}
    assert shim["rows"][0]["latency_ms"] == 1.0 and shim["rows"][0]["runs"] == 2
    assert measured == ["shim", "native", "shim"] * 2  # the failed side takes no second turn


def test_repeated_steps_are_judged_by_their_median_error():
    out = _outputs(seed=7)
    c, f = out["a"]
    w = {"w": torch.ones(3)}

    def step(scale):  # input gradient off by `scale` relative, the rest exact
        return _run(out, f * (1 + scale), w)["train"]

    truth = {**_run(out, f, w), "train_repeats": [step(0.0), step(0.0)]}
    # The reference's steps err by 1e-3, 1e-3, 1e-3; the candidate's by 1e-2 once and 1e-3 twice.
    ref = {**_run(out, f * 1.001, w), "train_repeats": [step(1e-3), step(1e-3)]}
    cand = {**_run(out, f * 1.01, w), "train_repeats": [step(1e-3), step(1e-3)]}
    errors = parity.accuracy({"real": ref, "shim": cand}, truth)
    assert errors["shim"]["train"]["input_grad"] == pytest.approx(1e-3, rel=1e-3)
    assert errors["shim"]["train"]["samples"]["input_grad"][0] == pytest.approx(1e-2, rel=1e-3)
    assert parity.as_accurate(errors, "real", "shim", 1e-5)["train"]
    assert parity._acc(errors["shim"]["train"], "input_grad") == "1.00e-03 (1.00e-03 to 1.00e-02)"
    # An fp16-like run without repeats is measured on its one step.
    single = parity.accuracy({"real": _run(out, f * 1.01, w)}, truth)["real"]["train"]
    assert single["input_grad"] == pytest.approx(1e-2, rel=1e-3) and "samples" not in single


def test_parity_child_perturbs_repeats_by_one_ulp():
    from benchmarks.compat.child import _perturbed

    f = torch.randn(100, 4)
    assert _perturbed(f, 0) is f
    moved = _perturbed(f, 1)
    ulp = torch.abs(torch.nextafter(f, torch.full_like(f, float("inf"))) - f)
    assert torch.all((moved - f).abs() <= 2 * ulp) and not torch.equal(moved, f)  # 2: binade edges
    assert torch.equal(_perturbed(f, 1), moved) and not torch.equal(_perturbed(f, 2), moved)


def test_loader_side_inputs_are_those_of_the_coordinates():
    """Each family's per-batch inputs, computed once per scene: Pointcept's offsets (cumulative rows
    per scan), OpenPCDet's (b, z, y, x) coordinates, TorchSparse's spatial range (max + 1, rounded
    up to 16)."""
    from benchmarks.compat.scenes import Voxels

    coords = torch.tensor([[0, 1, 2, 3], [0, 4, 0, 1], [2, 20, 5, 6]], dtype=torch.int32)
    v = Voxels(coords, torch.zeros(3, 4), 3, (32, 16, 16))
    assert v.offsets.tolist() == [2, 2, 3]  # scan 1 has no rows
    assert v.coords_bzyx.tolist() == [[0, 3, 2, 1], [0, 1, 0, 4], [2, 6, 5, 20]]
    assert v.torchsparse_range == (3, 32, 16, 16)
    assert v.offsets is v.offsets  # computed once


@pytest.mark.cuda
def test_maps_on_a_grid_convs_sites_skip_the_coordinate_check(monkeypatch):
    """GridConv's output sites come from relconv's grid map: a submanifold conv on them does not check
    them again (no wait for a check's error word)."""
    from relconv.ops import coord_ops
    from relconv.voxel import Conv3d

    g = torch.Generator().manual_seed(3)
    coords = torch.unique(
        torch.cat(
            [torch.randint(0, 2, (200, 1), generator=g), torch.randint(0, 12, (200, 3), generator=g)], 1
        ),
        dim=0,
    )
    x = VoxelTensor(torch.randn(coords.shape[0], 3, generator=g).cuda(), coords.int().cuda())
    down, sub = GridBlock(3, 4, 3, 2, 1).cuda(), Conv3d(4, 4, 3).cuda()
    down[0].grid = (2, 12, 12, 12)

    def fail(*_):
        raise AssertionError("a map built on a grid conv's output sites checked them")

    monkeypatch.setattr(coord_ops, "check_coords", fail)
    out = sub(down(x))
    assert out.feats.shape == (down(x).feats.shape[0], 4)


def test_idle_gaps_are_the_complement_of_the_union_of_gpu_intervals():
    from benchmarks.compat.idle import _busy_and_gaps

    # overlapping, nested and touching intervals after the call starts at 0
    busy, gaps = _busy_and_gaps([(2.0, 5.0), (3.0, 4.0), (4.0, 7.0), (7.0, 8.0), (10.0, 11.0)], 0.0)
    assert busy == 7.0
    assert gaps == [(0.0, 2.0), (8.0, 10.0)]
    assert _busy_and_gaps([], 1.0) == (0.0, [])


def test_idle_counts_device_work_but_not_the_annotation_of_a_record_function_range():
    from types import SimpleNamespace

    import torch

    from benchmarks.compat.idle import _gpu_intervals

    def event(start, end, device, annotation=False):
        kind = torch.autograd.DeviceType.CUDA if device else torch.autograd.DeviceType.CPU
        span = SimpleNamespace(start=start, end=end)
        return SimpleNamespace(time_range=span, device_type=kind, is_user_annotation=annotation)

    events = [
        event(0.0, 10.0, device=True, annotation=True),  # "call 0" on the device: spans the call
        event(6.0, 7.0, device=True),
        event(2.0, 3.0, device=True),
        event(1.0, 9.0, device=False),
    ]
    assert _gpu_intervals(events) == [(2.0, 3.0), (6.0, 7.0)]


def test_idle_names_the_innermost_host_event_of_a_gap():
    from types import SimpleNamespace

    from benchmarks.compat.idle import _innermost

    def event(name, start, end, stack=()):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), stack=list(stack))

    call = event("call 0", 0.0, 100.0)
    frames = [  # innermost first, as the profiler records them
        "/x/site-packages/torch/nn/functional.py(2800): relu",
        "/work/repo/relconv/voxel/conv.py(123): run_layer",
        "/x/site-packages/torch/nn/modules/module.py(1775): _wrapped_call_impl",
    ]
    host = [
        call,
        event("ProfilerStep#3", 0.0, 100.0),
        event("aten::conv", 5.0, 60.0),
        event("aten::empty", 30.0, 31.0, frames),
        event("aten::add", 70.0, 72.0, ["/src/downstream/Pointcept/models/unet.py(40): forward"]),
    ]
    assert _innermost(host, 20.0, call) == "aten::conv"
    assert _innermost(host, 30.5, call) == "aten::empty from relconv/voxel/conv.py(123): run_layer"
    assert _innermost(host, 65.0, call) == "before aten::add from Pointcept/models/unet.py(40): forward"
    assert _innermost(host, 80.0, call) == "-"


def test_idle_report_sums_each_calls_idle_time_by_the_host_event_in_its_gaps():
    from types import SimpleNamespace

    from benchmarks.compat.idle import call_report

    def event(name, start, end):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end))

    call = event("call 2", 1000.0, 5000.0)
    host = [call, event("aten::copy_", 1000.0, 1500.0), event("relconv::grid_conv_map", 2500.0, 3200.0)]
    gpu = [(1500.0, 2600.0), (3100.0, 4000.0), (4200.0, 5000.0), (6000.0, 7000.0)]  # the last: next call
    lines = call_report(call, 6000.0, gpu, host, largest=2, top=3)
    assert lines[0] == "  call 2: 4.00 ms to its last GPU work, GPU busy 2.80 ms, idle 1.20 ms in 3 gaps"
    assert lines[1] == "    at   0.00 ms idle 0.500 ms  host in aten::copy_"
    assert lines[2] == "    at   1.60 ms idle 0.500 ms  host in relconv::grid_conv_map"
    assert lines[3] == "    idle ms by what the host ran mid-gap:"
    totals = ["        0.500  aten::copy_", "        0.500  relconv::grid_conv_map", "        0.200  -"]
    assert lines[4:] == totals


def test_host_split_assigns_functions_to_parts_and_ranks_differences():
    from collections import Counter

    from benchmarks.compat.host_split import function_of, part_of, table

    assert part_of("~", "<built-in method relconv._C.run>") == "<built-in method relconv._C.run>"
    assert part_of("/x/relconv/torchsparse/nn/functional/conv.py", "run_conv") == "relconv/torchsparse/nn"
    assert part_of("/x/relconv/voxel/conv.py", "run_layer") == "relconv/voxel/conv"
    assert part_of("/venv/site-packages/torch/nn/modules/module.py", "_call_impl") == "torch/nn"
    assert part_of("/r/.peers/downstream/torchsparse/torchsparse/backbones/unet.py", "forward") == (
        "backbone and other code"
    )
    assert part_of("<string>", "<lambda>") == "python internals"
    assert function_of("/x/relconv/voxel/conv.py", "run_layer") == "relconv/voxel/conv.py:run_layer"
    assert function_of("/r/.peers/downstream/torchsparse/torchsparse/backbones/unet.py", "forward") == (
        "unet.py:forward"
    )
    assert function_of("~", "<built-in method relconv._C.run>") == "<built-in method relconv._C.run>"
    lines = table({"shim": Counter(a=1.0, b=3.0), "native": Counter(a=1.5, c=0.5)}, top=2)
    assert [line.split()[0] for line in lines[1:]] == ["b", "a", "all"]
    assert lines[-1].split()[1:] == ["4.000", "2.000", "+2.000"]


def test_host_split_sampler_gives_each_function_the_wall_time_it_is_on_the_stack():
    import time

    from benchmarks.compat.host_split import Sampler

    def busy(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def long_part():
        busy(0.012)

    def short_part():
        busy(0.003)

    def call():
        long_part()
        short_part()

    sampler = Sampler(200, by=lambda filename, function: function)
    for _ in range(4):
        sampler.enable()
        call()
        sampler.disable()
    ms = sampler.split(4)
    assert sampler.samples > 100
    assert ms["call"] == pytest.approx(15.0, rel=0.25)
    assert ms["long_part"] > 2 * ms["short_part"] > 0
    assert ms["call"] >= ms["long_part"] + ms["short_part"] - 1e-9
