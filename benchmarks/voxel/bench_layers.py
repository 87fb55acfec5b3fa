"""Per-layer and MinkUNet inference times of relconv.voxel on a synthetic 64-beam LiDAR scan.

Layers: submanifold 3^3 and strided 2^3 (stride 2) convs at C = 32/64/128 in and out, fp16 and fp32,
with a fresh map (map building inside the timed region, as for a new scan) and with the cached map;
plus the map build alone. Each layer row first checks agreement with the pure-PyTorch reference loop
on the same map. Models: MinkUNet inference (batch 1, eval, no_grad) at width 1.0 and 0.5, fp16 and
fp32, fresh maps per run. Timed by the shared harness (`benchmarks.harness.timing`: CUDA events,
warm-up, median of >= 20 runs). JSON goes to `--out`.

    python -m benchmarks.voxel.bench_layers                       # GPU, full size (~70k voxels)
    python -m benchmarks.voxel.bench_layers --device cpu --tiny   # smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.harness.report import environment
from benchmarks.harness.timing import TimingConfig, measure
from relconv.ops.reference import relational_conv_reference
from relconv.voxel import VoxelTensor, conv3d, voxelize
from relconv.voxel.kernel_map import layer_map
from relconv.voxel.models import MinkUNet
from relconv.voxel.synthetic import raycast_scan

REPO = Path(__file__).resolve().parents[2]
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}
LAYERS = {"subm3": (3, 1), "down2": (2, 2)}  # name -> (kernel size, stride)


def time_ms(fn: Callable[[], object], device: torch.device, timing: TimingConfig) -> dict:
    """Latency (median / p20 / p80) and queued throughput in ms of `fn()`; `fn` holds its own inputs,
    so one dummy input."""
    return dataclasses.asdict(measure(lambda _: fn(), [None], device, timing))


def scan_tensor(device: torch.device, tiny: bool) -> tuple[VoxelTensor, dict]:
    """The benchmark scan: 64 beams at 0.05 m (~70k voxels), or a small one for `--tiny`."""
    beams, steps, voxel = (16, 256, 0.2) if tiny else (64, 1800, 0.05)
    points, intensity = raycast_scan(beams=beams, seed=0, azimuth_steps=steps)
    pts = torch.from_numpy(points).to(device)
    feats = torch.cat([pts, torch.from_numpy(intensity).to(device)[:, None]], 1)
    x = voxelize(pts, voxel, feats=feats).tensor
    return x, {
        "beams": beams,
        "azimuth_steps": steps,
        "points": int(points.shape[0]),
        "voxel_size": voxel,
        "voxels": len(x),
    }


def _fresh(x: VoxelTensor) -> VoxelTensor:
    """Same voxels with an empty map cache, so the next layer builds its map."""
    return VoxelTensor(x.feats, x.coords, x.stride)


def bench_layers(x0: VoxelTensor, channels: list[int], dtypes: list[str], timing: TimingConfig) -> list[dict]:
    device = x0.device
    rows = []
    g = torch.Generator(device="cpu").manual_seed(0)
    for layer, (k, s) in LAYERS.items():
        t = time_ms(lambda k=k, s=s: layer_map(_fresh(x0), (k,) * 3, (s,) * 3, (1, 1, 1)), device, timing)
        rows.append({"layer": layer, "channels": None, "dtype": None, "map": "build only", **t})
        for c in channels:
            for dname in dtypes:
                dt = DTYPES[dname]
                feats = torch.randn(len(x0), c, generator=g).to(device, dt)
                w = (torch.randn(k**3, c, c, generator=g) / (c * k**3) ** 0.5).to(device, dt)
                x = VoxelTensor(feats, x0.coords, 1)
                out = conv3d(x, w, k, s)
                rmap = layer_map(x, (k,) * 3, (s,) * 3, (1, 1, 1)).rmap
                ref = relational_conv_reference(feats, w, rmap)
                err = ((out.feats.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-12)).item()
                if err > TOLERANCE[dt]:
                    raise RuntimeError(f"{layer} C={c} {dname}: relative error {err:.2e} vs reference")
                fresh = time_ms(lambda x=x, w=w, k=k, s=s: conv3d(_fresh(x), w, k, s), device, timing)
                cached = time_ms(lambda x=x, w=w, k=k, s=s: conv3d(x, w, k, s), device, timing)
                common = {
                    "layer": layer,
                    "channels": c,
                    "dtype": dname,
                    "pairs": rmap.num_pairs,
                    "rel_err": err,
                }
                rows.append({**common, "map": "fresh", **fresh})
                rows.append({**common, "map": "cached", **cached})
    return rows


def bench_models(x0: VoxelTensor, widths: list[float], dtypes: list[str], timing: TimingConfig) -> list[dict]:
    rows = []
    for width in widths:
        torch.manual_seed(0)
        model = MinkUNet(in_channels=4, num_classes=19, width=width).to(x0.device).eval()
        for dname in dtypes:
            m = model.to(DTYPES[dname])
            feats = x0.feats.to(DTYPES[dname])
            with torch.no_grad():
                logits = m(VoxelTensor(feats, x0.coords))
                if not bool(torch.isfinite(logits).all()):
                    raise RuntimeError(f"MinkUNet width {width} {dname}: non-finite logits")
                cached_x = VoxelTensor(feats, x0.coords)
                fresh = time_ms(lambda m=m, f=feats: m(VoxelTensor(f, x0.coords)), x0.device, timing)
                cached = time_ms(lambda m=m, x=cached_x: m(x), x0.device, timing)
            common = {"model": "MinkUNet", "width": width, "dtype": dname, "batch": 1}
            rows.append({**common, "map": "fresh", **fresh})
            rows.append({**common, "map": "cached", **cached})
    return rows


def print_table(layers: list[dict], models: list[dict]) -> None:
    times = f"{'latency ms':>11}{'p20':>9}{'p80':>9}{'queued ms':>10}"
    print(f"\n{'layer':<7}{'C':>5}{'dtype':>6}{'map':>12}{times}")
    for r in layers:
        c = "-" if r["channels"] is None else r["channels"]
        d = r["dtype"] or "-"
        print(
            f"{r['layer']:<7}{c:>5}{d:>6}{r['map']:>12}{r['latency_ms']:>11.3f}{r['p20_ms']:>9.3f}"
            f"{r['p80_ms']:>9.3f}{r['throughput_ms']:>10.3f}"
        )
    print(f"\n{'model':<9}{'width':>6}{'dtype':>6}{'map':>8}{times}")
    for r in models:
        print(
            f"{r['model']:<9}{r['width']:>6}{r['dtype']:>6}{r['map']:>8}{r['latency_ms']:>11.3f}"
            f"{r['p20_ms']:>9.3f}{r['p80_ms']:>9.3f}{r['throughput_ms']:>10.3f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="small scan, few runs (CI smoke)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "voxel"))
    parser.add_argument("--runs", type=int, default=None, help="timed runs per row (default 20, tiny 3)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    timing = TimingConfig(
        warmup_runs=1 if args.tiny else 5,
        # The harness also warms up by time (for autotuners); --tiny is a smoke run and skips it.
        warmup_seconds=0.0 if args.tiny else TimingConfig.warmup_seconds,
        runs=args.runs or (3 if args.tiny else 20),
    )
    channels = [32] if args.tiny else [32, 64, 128]
    widths = [0.5] if args.tiny else [1.0, 0.5]
    dtypes = ["fp32"] if args.tiny and device.type == "cpu" else ["fp16", "fp32"]
    x0, scan = scan_tensor(device, args.tiny)
    print(f"scan: {scan['points']} points -> {scan['voxels']} voxels at {scan['voxel_size']} m on {device}")
    layers = bench_layers(x0, channels, dtypes, timing)
    models = bench_models(x0, widths, dtypes, timing)
    result = {"environment": environment(device, {}, {}), "scan": scan, "layers": layers, "models": models}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench_layers_{device.type}{'_tiny' if args.tiny else ''}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    print_table(layers, models)


if __name__ == "__main__":
    main()
