"""Voxel suite: sparse conv layers, kernel-map construction and MinkUNet, relconv vs its peers.

This file holds the case list, the map cases and the plumbing; relconv's side of a layer or
MinkUNet case, which every peer builds from, is benchmarks/harness/voxel_setup.py; each peer's
adapter (spconv, WarpConvNet, TorchSparse++) is its benchmarks/peers/<peer>.py, one `VoxelPeer`
each (peers/base.py), run in the order of VOXEL_PEERS.

Cases:
  layer/<workload>/<op>/C<c>/<dtype>/<map>/<pass>   one C -> C conv; op is
      subm3 (submanifold 3^3), down2 / down3 (stride-2 2^3 / 3^3), up2 (2^3 transposed back onto
      the fine sites of down2); map "fresh" builds the kernel map inside the timed region, "cached"
      reuses one built before; pass "fwd" (no_grad) or "fwd+bwd" (backward of a fixed gradient).
  map/<workload>/<op>                               kernel-map construction alone (relconv only;
      for the peers, fresh minus cached layer time is the same quantity).
  e2e/minkunet<w>/<workload>/<infer|train>/<dtype>  MinkUNet width w: inference at batch 1 (no_grad,
      maps built per call) or a training step (forward, cross-entropy, backward, SGD step) at batch 2;
      fp16/bf16 are autocast mixed precision, fp32 runs with TF32 off.
Workloads (all at 0.05 m unless noted): synthetic ray-cast street scans with 32/64/128 beams, a 3-sweep
aggregate, a batch of two 64-beam scans, an indoor room at 0.02 m, and the real outdoor scan of the
small-gicp sdist. Coordinates are shifted to be non-negative (by a multiple of 16, so every stride-2
level floors identically) and given to every implementation in the same row order.
"""

from __future__ import annotations

from functools import partial

import torch

from benchmarks.harness.bench import PeerMissing, Prepared, run_case
from benchmarks.harness.floor import DTYPES, conv_layer_work
from benchmarks.harness.ops import OPS
from benchmarks.harness.tolerances import E2E_TOLERANCE
from benchmarks.harness.voxel_setup import E2ESetup, LayerSetup
from benchmarks.peers import spconv_peer, warpconvnet_peer
from benchmarks.peers import torchsparse as ts_peer
from benchmarks.peers.base import VoxelPeer
from benchmarks.workloads.voxels import Scene, load_scene

CHANNELS = (16, 32, 64, 128, 256)
LAYER_DTYPES = ("fp32", "tf32", "fp16", "bf16")
# (map, pass) pairs timed per layer: map building matters for a forward pass, and a training step
# reuses the maps its forward built.
MAP_PASSES = (("fresh", "fwd"), ("cached", "fwd"), ("cached", "fwd+bwd"))
SWEEP_WORKLOAD = "scan64"
OTHER_WORKLOADS = ("scan32", "scan128", "scan64x3", "scan64b2", "indoor", "kitti-real")
# The real scan also sweeps subm 3^3 over the widths and precisions the kernel targets are set on
# (C64 fp16 comes with OTHER_WORKLOADS), GPU only.
REAL_WORKLOAD, REAL_CHANNELS, REAL_DTYPES = "kitti-real", (32, 64, 128, 256), ("fp16", "tf32", "fp32")
# Scale: 3.5M voxels; only the subm 3^3 C64 fp16 forward (fresh and cached map), GPU only.
SCALE_WORKLOADS = ("scan128x8",)


def case_specs(devices: list[str], tiny: bool) -> list[dict]:
    specs = []
    for dev in devices:
        if tiny:
            sweep, others, channels, dtypes = "tiny", (), (8,), ("fp32",)
            widths, e2e_dtypes = (0.5,), ("fp32",)
        elif dev == "cpu":
            sweep, others, channels, dtypes = "scan32", (), (16, 64), ("fp32",)
            widths, e2e_dtypes = (0.5,), ("fp32",)
        else:
            sweep, others, channels, dtypes = SWEEP_WORKLOAD, OTHER_WORKLOADS, CHANNELS, LAYER_DTYPES
            widths, e2e_dtypes = (0.5, 1.0), ("fp32", "fp16", "bf16")

        def layer(workload: str, op: str, c: int, dtype: str, mp: str, ps: str, dev: str = dev) -> None:
            specs.append(
                dict(kind="layer", device=dev, workload=workload, op=op, C=c, dtype=dtype, map=mp, pass_=ps)
            )

        for op in OPS:
            for c in channels:
                for dt in dtypes:
                    for mp, ps in MAP_PASSES:
                        layer(sweep, op, c, dt, mp, ps)
        for w in others:
            for op in OPS:
                for mp, ps in MAP_PASSES:
                    layer(w, op, 64, "fp16", mp, ps)
        for c in REAL_CHANNELS if others else ():
            for dt in REAL_DTYPES:
                if (c, dt) == (64, "fp16"):
                    continue
                for mp, ps in MAP_PASSES:
                    layer(REAL_WORKLOAD, "subm3", c, dt, mp, ps)
        for w in SCALE_WORKLOADS if others else ():
            for mp in ("fresh", "cached"):
                layer(w, "subm3", 64, "fp16", mp, "fwd")
        for w in (sweep, *others):
            for op in ("subm3", "down2", "down3"):
                specs.append(dict(kind="map", device=dev, workload=w, op=op, dtype="fp32"))
        for width in widths:
            for dt in e2e_dtypes:
                specs.append(
                    dict(kind="e2e", device=dev, workload=sweep, width=width, mode="infer", dtype=dt)
                )
                specs.append(
                    dict(
                        kind="e2e",
                        device=dev,
                        workload="tiny2" if tiny else f"{sweep}b2",
                        width=width,
                        mode="train",
                        dtype=dt,
                    )
                )
        if not tiny and dev == "cuda":
            for w in ("scan32", "scan128", "scan64x3", "indoor", "kitti-real"):
                specs.append(dict(kind="e2e", device=dev, workload=w, width=1.0, mode="infer", dtype="fp16"))
            # The real scan also in fp32 and as a training step (batch 1: one real scan ships).
            specs.append(
                dict(kind="e2e", device=dev, workload="kitti-real", width=1.0, mode="infer", dtype="fp32")
            )
            for dt in ("fp32", "fp16"):
                specs.append(
                    dict(kind="e2e", device=dev, workload="kitti-real", width=1.0, mode="train", dtype=dt)
                )
    return _named(specs)


# Scenes of benchmarks/workloads/families.py (run.py --families): each one with every layer op at
# every width in these precisions and each (map, pass), the map builds, and MinkUNet 1.0 inference
# and training step in fp16; run.py's --cases narrows the product.
FAMILY_DTYPES = ("fp16", "bf16", "tf32")


def _core_family_set() -> tuple[list[str], list[str]]:
    """(scenes, case patterns) of the "core" family set: one scene of each procedural family at a
    mid size with subm 3^3 fp16 at C64 (each map and pass) and C128 / C256 cached forwards; the fresh
    C64 layer alone on the 4M and 10M aggregates (time and memory of maps built in the call); and
    MinkUNet 1.0 inference in fp16 on the room and the 1M aggregate."""
    full = ("batch4-64beam", "room-3cm", "aggregate-1m", "airborne-100m-25cm", "object-256")
    fresh_only = ("aggregate-4m", "aggregate-10m")
    networks = ("room-3cm", "aggregate-1m")
    cases = []
    for w in full:
        layer = f"voxel/*/layer/{w}/subm3"
        cases += [f"{layer}/C64/fp16/*", f"{layer}/C128/fp16/cached/fwd", f"{layer}/C256/fp16/cached/fwd"]
    cases += [f"voxel/*/layer/{w}/subm3/C64/fp16/fresh/fwd" for w in fresh_only]
    cases += [f"voxel/*/e2e/minkunet1.0/{w}/infer/fp16" for w in networks]
    return [*full, *fresh_only], cases


def _breadth_family_set() -> tuple[list[str], list[str]]:
    """(scenes, case patterns) of the "breadth" family set, what "core" leaves out: bf16 and TF32 at
    C64, C16 and C32, strided (2^3, 3^3) and transposed (2^3) layers, all as cached forward+backward
    steps; the real scans (small-gicp, carried or fetched) fresh and cached; MinkUNet 1.0 training
    steps in fp16 on the five procedural scenes and inference on the three that "core" does not
    time."""
    scenes = ("batch4-64beam", "room-3cm", "aggregate-1m", "airborne-100m-25cm", "object-256")
    three = scenes[:3]
    cases = [f"voxel/*/layer/{w}/subm3/C64/{dt}/cached/fwd+bwd" for w in three for dt in ("bf16", "tf32")]
    cases += [f"voxel/*/layer/{w}/subm3/C{c}/fp16/cached/fwd+bwd" for w in three[:2] for c in (16, 32)]
    cases += ["voxel/*/layer/aggregate-1m/subm3/C32/fp16/fresh/fwd"]
    cases += [f"voxel/*/layer/{w}/{op}/C64/fp16/cached/fwd+bwd" for w in three for op in ("down2", "up2")]
    cases += ["voxel/*/layer/room-3cm/down3/C64/fp16/cached/fwd+bwd"]
    cases += [f"voxel/*/layer/real-scan-b2/subm3/C64/fp16/{mp}" for mp in ("fresh/fwd", "cached/fwd+bwd")]
    cases += [f"voxel/*/e2e/minkunet1.0/{w}/train/fp16" for w in scenes]
    cases += [f"voxel/*/e2e/minkunet1.0/{w}/infer/fp16" for w in ("batch4-64beam", *scenes[3:])]
    return [*scenes, "real-scan-b2"], cases


# Named family sets for run.py --family-set: selections of the family cases, each small enough for
# 30 minutes of GPU time (or two such runs with run.py --resume), so that a published family table
# has one exact command.
FAMILY_SETS = {"core": _core_family_set, "breadth": _breadth_family_set}


def family_case_specs(devices: list[str], patterns: list[str]) -> list[dict]:
    """Cases on the family scenes whose names match any of `patterns` (fnmatch)."""
    import fnmatch

    from benchmarks.workloads.families import family_of, scene_names

    specs = []
    for dev in devices:
        for w in scene_names():
            if not any(fnmatch.fnmatchcase(w, p) for p in patterns):
                continue
            base = dict(device=dev, workload=w, family=family_of(w))
            for op in OPS:
                for c in CHANNELS:
                    for dt in FAMILY_DTYPES:
                        for mp, ps in MAP_PASSES:
                            specs.append(dict(base, kind="layer", op=op, C=c, dtype=dt, map=mp, pass_=ps))
            for op in ("subm3", "down2", "down3"):
                specs.append(dict(base, kind="map", op=op, dtype="fp32"))
            for mode in ("infer", "train"):
                specs.append(dict(base, kind="e2e", width=1.0, mode=mode, dtype="fp16"))
    return _named(specs)


def _named(specs: list[dict]) -> list[dict]:
    for s in specs:
        s["suite"] = "voxel"
        if s["kind"] == "layer":
            s["case"] = f"layer/{s['workload']}/{s['op']}/C{s['C']}/{s['dtype']}/{s['map']}/{s['pass_']}"
        elif s["kind"] == "map":
            s["case"] = f"map/{s['workload']}/{s['op']}"
        else:
            s["case"] = f"e2e/minkunet{s['width']}/{s['workload']}/{s['mode']}/{s['dtype']}"
        s["case"] = f"voxel/{s['device']}/" + s["case"]
    return specs


def _layer_work(spec: dict, scene: Scene, device: torch.device, build_map: bool):
    """Floor model of a layer from relconv's own map (pairs, sites)."""
    from relconv.voxel import VoxelTensor
    from relconv.voxel.kernel_map import layer_map

    op = OPS[spec["op"]]
    k, s, transposed = op.kernel, op.stride, op.transposed
    x = VoxelTensor(torch.zeros(len(scene.coords), 1, device=device), scene.coords)
    lm = layer_map(x, (k, k, k), (s, s, s), (1, 1, 1))
    rmap = lm.rmap.transpose() if transposed else lm.rmap
    c, elem = spec.get("C", 0), DTYPES[spec["dtype"]].itemsize
    return conv_layer_work(
        rmap.num_in,
        rmap.num_out,
        rmap.num_pairs,
        rmap.num_relations,
        c,
        c,
        elem,
        spec.get("pass_") == "fwd+bwd",
        build_map,
    )


def _map_case(spec: dict, scene: Scene, device: torch.device) -> Prepared:
    from relconv.voxel import VoxelTensor
    from relconv.voxel.kernel_map import layer_map

    k, s = OPS[spec["op"]].kernel, OPS[spec["op"]].stride
    zeros = torch.zeros(len(scene.coords), 1, device=device)

    def fn(_):
        return layer_map(VoxelTensor(zeros, scene.coords), (k, k, k), (s, s, s), (1, 1, 1)).rmap

    def output():
        rmap = fn(None)
        return None, torch.tensor([[rmap.num_in, rmap.num_out, rmap.num_pairs]], dtype=torch.float64)

    return Prepared(fn=fn, inputs=[None], output=output)


# ---------------------------------------------------------------------------------------- runner
# Each peer's whole adapter lives in its benchmarks/peers/<peer>.py; rows come in this order.
VOXEL_PEERS: tuple[VoxelPeer, ...] = (spconv_peer.PEER, warpconvnet_peer.PEER, ts_peer.PEER)


def run(spec: dict, ctx: dict, peers: dict, timing, ceilings) -> list[dict]:
    device = torch.device(spec["device"])
    meta = {k: v for k, v in spec.items() if k != "pass_"}
    if "pass_" in spec:
        meta["pass"] = spec["pass_"]
    key = (spec["workload"], spec["device"])
    if ctx.get("scene_key") != key:
        ctx.pop("scene", None)
        ctx["scene_key"] = key
        try:
            ctx["scene"] = load_scene(spec["workload"], device)
        except Exception as err:  # missing generator or data, bad workload: this case's row says so
            ctx["scene"] = err
    scene = ctx["scene"]
    if isinstance(scene, Exception):
        return [dict(meta, impl="relconv", status=f"unavailable: {type(scene).__name__}: {scene}"[:300])]
    meta.update(num_voxels=len(scene.coords), batch_size=scene.batch_size)

    if spec["kind"] == "map":
        work = _layer_work(dict(spec, C=0), scene, device, build_map=True)
        work = (work[0], 0.0)
        return run_case(
            meta, [("relconv", partial(_map_case, spec, scene, device))], device, timing, ceilings, work
        )

    try:
        setup = (LayerSetup if spec["kind"] == "layer" else E2ESetup)(spec, scene, device)
    except Exception as err:  # relconv's side could not be set up: nothing to compare the peers with
        return [dict(meta, impl="relconv", status=f"error: {type(err).__name__}: {err}"[:300])]
    impls = [("relconv", setup.relconv)]
    if spec["kind"] == "layer":
        work = _layer_work(spec, scene, device, build_map=spec["map"] == "fresh")
        if device.type == "cpu" and len(scene.coords) < 20_000:
            impls.append(("ref-dense", setup.dense))
        tolerance = None
    else:
        work = None
        tolerance = E2E_TOLERANCE
        if spec["mode"] == "infer":
            impls.append(("relconv-unfolded", setup.relconv_unfolded))
    for peer in VOXEL_PEERS:
        if peer.name in peers:
            case = peer.layer_case if spec["kind"] == "layer" else peer.e2e_case
            impls.append((peer.name, partial(_peer_or_missing, peers[peer.name], partial(case, setup))))
    return run_case(meta, impls, device, timing, ceilings, work, tolerance=tolerance)


def _peer_or_missing(availability: tuple[bool, str], build):
    ok, info = availability
    if not ok:
        raise PeerMissing(info)
    return build()


PEERS = {peer.name: peer.available for peer in VOXEL_PEERS}
