"""What relconv.torchsparse costs over relconv's native voxel layers, on one GPU.

    python -m benchmarks.compat_torchsparse [--scene scan64b2] [--runs 50]

Both sides run the same geometry with the same weights on the same scan (outputs are checked equal
before timing) and are timed with the standalone twins' loop (benchmarks/standalone/loop.py:
latency = CUDA events around one synchronised call, median; queued = calls back to back, total /
runs). Each call gets the next of a few feature copies, as a data loader would.

Cases: cached-map layers at C64 (submanifold 3^3, stride-2 2^3, transposed 2^3; fp16 and fp32;
inference and forward + backward), and whole networks on a fresh input per call: the shim's
`SparseResUNet42` against relconv's `MinkUNet` (the same network plus a 96 -> 19 linear head; native
inference with and without its Conv-BN folding, which a TorchSparse model's `torch.nn.Sequential`
cannot get), inference fp16 and a training step (forward + backward) fp32. The shim's target is a
ratio <= 1.05 on the layer rows and the unfolded network rows.
"""

from __future__ import annotations

import argparse
import itertools

import torch

import relconv.torchsparse as torchsparse
import relconv.torchsparse.nn as spnn
from benchmarks.standalone.loop import feature_copies, time_call
from benchmarks.workloads.voxels import load_scene
from relconv.torchsparse._layout import relconv_geometry, to_relconv, torchsparse_lows
from relconv.torchsparse.backbones import SparseResUNet42
from relconv.torchsparse.nn.utils import fapply
from relconv.voxel import Conv3d, VoxelTensor, inference_folding
from relconv.voxel.models import MinkUNet

C = 64


def layer_pair(kind: str, dtype: torch.dtype, train: bool):
    """(shim layer, native layer with the same weight), on CUDA in `dtype`."""
    k, s, transposed = {"subm3": (3, 1, False), "down2": (2, 2, False), "up2": (2, 2, True)}[kind]
    shim = spnn.Conv3d(C, C, k, stride=s, transposed=transposed).cuda().to(dtype).train(train)
    native = Conv3d(C, C, k, stride=s, transposed=transposed).cuda().to(dtype).train(train)
    ks = shim.kernel_size
    geometry = relconv_geometry(ks, torchsparse_lows(ks, shim.stride, shim.padding))
    index = None if geometry.index is None else torch.tensor(geometry.index, device="cuda")
    with torch.no_grad():
        native.weight.copy_(to_relconv(shim.kernel, geometry, index))
    return shim, native


def layer_cases(scene, dtype: torch.dtype, train: bool) -> dict:
    cases = {}
    feats = feature_copies(len(scene.coords), C, dtype)
    for kind in ("subm3", "down2", "up2"):
        shim, native = layer_pair(kind, dtype, train)
        fine_ts = torchsparse.SparseTensor(next(feats), scene.coords)
        fine_vt = VoxelTensor(fine_ts.feats, scene.coords)
        if kind == "up2":  # the transposed conv's input: the stride-2 sites of a downsampling conv
            down_ts, down_vt = layer_pair("down2", dtype, False)
            with torch.no_grad():
                x_ts, x_vt = down_ts(fine_ts), down_vt(fine_vt)
            coarse = feature_copies(len(x_ts.coords), C, dtype, seed=1)
        else:
            x_ts, x_vt, coarse = fine_ts, fine_vt, feats
        with torch.no_grad():
            a, b = shim(x_ts), native(x_vt)
        torch.testing.assert_close(a.feats, b.feats, rtol=1e-2, atol=1e-2)

        def run_shim(layer=shim, x=x_ts, src=coarse):
            return layer(fapply(x, lambda _: next(src)))

        def run_native(layer=native, x=x_vt, src=coarse):
            return layer(x.replace_feature(next(src)))

        for side, fn in (("shim", run_shim), ("native", run_native)):
            cases[(kind, side)] = _step(fn, train)
    return cases


def _step(fn, train: bool):
    if not train:
        return torch.no_grad()(fn)

    def step():
        out = fn()
        out.feats.float().sum().backward()

    return step


def network_cases(scene, train: bool) -> dict:
    dtype = torch.float32 if train else torch.float16
    shim = SparseResUNet42(in_channels=4).cuda().to(dtype).train(train)
    native = MinkUNet(4, 19).cuda().to(dtype).train(train)
    scans = itertools.cycle([scene.feats.to(dtype).clone() for _ in range(3)])

    def run_shim():
        return shim(torchsparse.SparseTensor(next(scans), scene.coords))[-1].feats

    def run_native():
        return native(VoxelTensor(next(scans), scene.coords))

    if train:
        return {
            ("unet42 train", "shim"): lambda: run_shim().float().sum().backward(),
            ("unet42 train", "native"): lambda: run_native().float().sum().backward(),
        }

    def native_unfolded():
        with inference_folding(False):
            return run_native()

    return {
        ("unet42 infer", "shim"): torch.no_grad()(run_shim),
        ("unet42 infer", "native"): torch.no_grad()(native_unfolded),
        ("unet42 infer", "native folded"): torch.no_grad()(run_native),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", default="scan64b2")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    scene = load_scene(args.scene, torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}  scene {args.scene}: {len(scene.coords)} voxels")
    print(f"{'case':24s} {'side':14s} {'latency ms':>11s} {'queued ms':>10s}")
    groups = []
    for dtype, train in itertools.product((torch.float16, torch.float32), (False, True)):
        tag = f"{'fp16' if dtype == torch.float16 else 'fp32'} {'fwd+bwd' if train else 'infer'}"
        groups.append((tag, layer_cases(scene, dtype, train)))
    groups += [("", network_cases(scene, False)), ("", network_cases(scene, True))]
    for tag, cases in groups:
        times = {key: time_call(fn, runs=args.runs) for key, fn in cases.items()}
        for (case, side), r in times.items():
            print(
                f"{f'{case} {tag}'.strip():24s} {side:14s} {r['latency_ms']:11.3f} {r['throughput_ms']:10.3f}"
            )
            if side == "native":
                shim = times[(case, "shim")]
                lat, queued = shim["latency_ms"] / r["latency_ms"], shim["throughput_ms"] / r["throughput_ms"]
                print(f"{'':24s} {'shim / native':14s} {lat:11.3f} {queued:10.3f}")


if __name__ == "__main__":
    main()
