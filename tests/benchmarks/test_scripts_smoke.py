"""CPU smoke test of the standalone benchmark scripts on tiny sizes: rows and agreement, never timings."""

from __future__ import annotations

import json

import torch

from benchmarks.ops import bench_batch_norm, bench_relational_conv
from benchmarks.voxel import bench_layers


def test_bench_relational_conv_rows_agree(tmp_path):
    bench_relational_conv.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "bench_relational_conv_cpu_tiny.json").read_text())
    assert {"device", "torch", "relconv_commit", "ceilings"} <= set(data["environment"])
    rows = data["rows"]
    # Default --tiny grid: 2 maps x C in (8, 16) x (fp16, fp32) x (fwd, fwd+bwd).
    assert len(rows) == 16
    assert {(r["map"], r["channels"], r["dtype"], r["pass"]) for r in rows} == {
        (m, c, d, p)
        for m in ("voxel", "graph")
        for c in (8, 16)
        for d in ("float16", "float32")
        for p in ("fwd", "fwd+bwd")
    }
    for r in rows:
        tol = bench_relational_conv.TOLERANCE[getattr(torch, r["dtype"])]
        assert r["rel_error"] <= tol, r
        assert r["forward_path"] in ("pairs", "table")
        assert {"time_relconv_s", "time_reference_s", "speedup", "floor_s", "time_over_floor"} <= set(r)


def test_bench_batch_norm_rows_agree(tmp_path):
    bench_batch_norm.main(["--device", "cpu", "--tiny", "--dtypes", "fp32,fp16", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "bench_batch_norm.json").read_text())["rows"]
    assert {(r["rows"], r["channels"], r["dtype"]) for r in rows} == {
        (n, c, d) for n, c in bench_batch_norm.TINY_SHAPES for d in ("float32", "float16")
    }
    for r in rows:
        assert r["relconv_rel_error"] <= bench_batch_norm.TOLERANCE[getattr(torch, r["dtype"])], r


def test_bench_layers_rows_agree(tmp_path):
    bench_layers.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "bench_layers_cpu_tiny.json").read_text())
    assert {"device", "torch", "relconv_commit"} <= set(data["environment"])
    layers, models = data["layers"], data["models"]
    assert {(r["layer"], r["map"]) for r in layers} == {
        (layer, m) for layer in bench_layers.LAYERS for m in ("build only", "fresh", "cached")
    }
    for r in layers:
        if r["map"] != "build only":
            assert r["rel_err"] <= bench_layers.TOLERANCE[bench_layers.DTYPES[r["dtype"]]], r
    assert {(r["model"], r["map"]) for r in models} == {("MinkUNet", "fresh"), ("MinkUNet", "cached")}
    for r in layers + models:
        assert {"latency_ms", "p20_ms", "p80_ms", "throughput_ms"} <= set(r) and r["runs"] == 3, r


def test_ddp_scaling_runs_every_job_and_the_same_function(tmp_path):
    from benchmarks import ddp_scaling

    argv = [
        "--device",
        "cpu",
        "--out",
        str(tmp_path),
        "--steps",
        "4",
        "--profile-steps",
        "1",
        "--batch-per-gpu",
        "1",
    ]
    summary = ddp_scaling.main(argv)
    jobs = summary["jobs"]
    assert set(jobs) == {"1gpu", "1gpu_omp1", "1gpu_batch2", "2gpu_relconv", "2gpu_off"}
    assert json.loads((tmp_path / "ddp_scaling.json").read_text())["jobs"].keys() == jobs.keys()
    for name in ("2gpu_relconv", "2gpu_off"):
        assert jobs[name]["processes"] == 2 and jobs[name]["weak_efficiency"] > 0
    # Two ranks with synchronized BatchNorm train the same function as one process on the same
    # global batch: the first loss (before any update) agrees to rounding.
    assert abs(jobs["2gpu_relconv"]["first_losses"][0] - jobs["1gpu_batch2"]["first_losses"][0]) < 1e-5
    for name in ("1gpu", "2gpu_relconv"):
        assert (tmp_path / f"profile_{name}" / "rank0.txt").read_text().startswith("rank 0: the last 1 steps")
    collectives = summary["collectives"]
    assert collectives["world_size"] == 2 and collectives["gradient_numel"] > 0
    assert collectives["gradient_all_reduce_ms"] > 0 and collectives["all_reduce_1kib_us"] > 0


def test_host_instruction_layers_run_and_give_their_features():
    from benchmarks.compat import host_instructions as hi

    for which in hi.LAYERS + hi.BLOCKS:
        out = hi.run_layer(which, 1)
        assert out.dim() == 2 and out.shape[1] == 16 and bool(torch.isfinite(out).all()), which
