"""Voxel suite: sparse conv layers, kernel-map construction and MinkUNet, relconv vs its peers.

This file holds relconv's side of every case, the case list and the plumbing; each peer's adapter
(spconv, WarpConvNet, TorchSparse++) is its benchmarks/peers/<peer>.py, one `VoxelPeer` each
(peers/base.py), run in the order of VOXEL_PEERS.

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

import contextlib
from functools import partial

import torch
import torch.nn.functional as F

from benchmarks.harness.bench import PeerMissing, Prepared, Unsupported, run_case
from benchmarks.harness.floor import DTYPES, conv_layer_work
from benchmarks.harness.ops import OPS
from benchmarks.harness.prepare import features, layer_fn, precision, training
from benchmarks.harness.timing import rotation_count
from benchmarks.harness.tolerances import E2E_TOLERANCE
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
NUM_CLASSES = 19
DENSE_LIMIT = 2**24  # dense reference only when grid cells x channels stay below this


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


# ---------------------------------------------------------------------------------------- layers
class LayerSetup:
    """relconv's side of a layer case, built before any peer's. A peer's `layer_case` reads spec,
    scene, device, dtype, weight (fp32 [K, C_in, C_out], what every implementation loads),
    kernel_size, in_coords and inputs (the rotated features, in in_coords' row order)."""

    def __init__(self, spec: dict, scene: Scene, device: torch.device):
        from relconv.voxel import Conv3d, VoxelTensor

        self.spec, self.scene, self.device = spec, scene, device
        op = OPS[spec["op"]]
        k, s, transposed = op.kernel, op.stride, op.transposed
        self.kernel_size = op.kernel_size
        self.dtype = DTYPES[spec["dtype"]]
        c = spec["C"]
        torch.manual_seed(0)
        self.conv = Conv3d(c, c, k, stride=s, transposed=transposed)
        self.weight = self.conv.weight.detach().clone().to(self.dtype).float()  # what every impl uses
        self.conv = self.conv.to(device, self.dtype).train(training(spec))
        fine = VoxelTensor(torch.zeros(len(scene.coords), c, device=device, dtype=self.dtype), scene.coords)
        if transposed:
            down = Conv3d(c, c, 2, stride=2).to(device, self.dtype)
            with torch.no_grad():
                self.coarse = down(fine)  # its cache holds the fine sites and the strided map
            self.in_coords = self.coarse.coords
        else:
            self.in_coords = scene.coords
        self.inputs = features(len(self.in_coords), c, self.dtype, device, seed=1)

    def relconv(self) -> Prepared:
        from relconv.voxel import MapCache, VoxelTensor

        spec, scene = self.spec, self.scene
        transposed = OPS[spec["op"]].transposed
        if transposed:
            fine_coords, coarse = scene.coords, self.coarse

            def make_input(f):
                if spec["map"] == "cached":
                    return coarse.replace_feature(f)
                cache = MapCache()
                cache.coords[(1, 1, 1)] = fine_coords
                cache.coords[(2, 2, 2)] = coarse.coords
                return VoxelTensor(f, coarse.coords, 2, cache=cache)
        else:
            base = VoxelTensor(self.inputs[0], scene.coords)

            def make_input(f):
                return base.replace_feature(f) if spec["map"] == "cached" else VoxelTensor(f, scene.coords)

        conv = self.conv
        with torch.no_grad():
            first = conv(make_input(self.inputs[0]))  # builds (and, for "cached", caches) the map
        self.out_keys = first.coords.long()
        upstream = features(len(first.coords), spec["C"], self.dtype, self.device, seed=2, count=1)[0]
        fn, held = layer_fn(
            spec, lambda f: conv(make_input(f)).feats, [conv.weight], self.inputs, upstream, self.device
        )

        def output():
            with torch.no_grad(), precision(spec["dtype"], self.device):
                out = conv(make_input(self.inputs[0]))
            return out.coords.long(), out.feats.float()

        return Prepared(fn=fn, inputs=self.inputs, output=output, held=held)

    def dense(self) -> Prepared:
        """Dense conv3d / conv_transpose3d over the bounding grid (tiny scenes only)."""
        spec = self.spec
        op = OPS[spec["op"]]
        k, s, transposed = op.kernel, op.stride, op.transposed
        fine = self.scene.coords.long()
        hi = fine[:, 1:].max(0).values + 2
        if int(hi.prod()) * spec["C"] * self.scene.batch_size > DENSE_LIMIT:
            raise Unsupported("grid too large for the dense reference")
        w = self.weight.to(self.device).reshape(k, k, k, spec["C"], spec["C"])
        in_coords = self.in_coords.long()
        f0 = self.inputs[0].float()

        def run(_):
            step = s if transposed else 1
            grid = torch.zeros(
                self.scene.batch_size, spec["C"], *(hi // step + 1).tolist(), device=self.device
            )
            c = in_coords[:, 1:] // step
            grid[in_coords[:, 0], :, c[:, 0], c[:, 1], c[:, 2]] = f0
            if transposed:
                out = F.conv_transpose3d(grid, w.permute(3, 4, 0, 1, 2), stride=s)
                q = fine
            else:
                pad = (k - 1) // 2 if k % 2 else 0
                out = F.conv3d(grid, w.permute(4, 3, 0, 1, 2), stride=s, padding=pad)
                q = self.out_keys
            oc = q[:, 1:] // (1 if transposed else s)
            return q, out[q[:, 0], :, oc[:, 0], oc[:, 1], oc[:, 2]]

        return Prepared(fn=run, inputs=[None], output=lambda: run(None))


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


# ---------------------------------------------------------------------------------------- MinkUNet
class E2ESetup:
    """relconv's side of an end-to-end case, shared with the peers: initial weights, inputs, labels,
    and the timed step every implementation's network is run through (`prepared`)."""

    in_channels = 4
    num_classes = NUM_CLASSES

    def __init__(self, spec: dict, scene: Scene, device: torch.device):
        from relconv.voxel.models import MinkUNet

        self.spec, self.scene, self.device = spec, scene, device
        torch.manual_seed(0)
        self.model = MinkUNet(self.in_channels, NUM_CLASSES, width=spec["width"]).to(device)
        # The weights every implementation starts from. relconv is timed first and its timed training
        # steps (SGD, BatchNorm running statistics) move self.model; the peers used to copy those
        # moved weights while being compared with relconv's output from before the steps, so every
        # train row mismatched (infer rows, which move nothing, agreed).
        self.initial_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        gen = torch.Generator().manual_seed(3)
        n = len(scene.coords)
        count = rotation_count(n * 4 * 4, device, limit=3)
        self.inputs = [
            scene.feats + 0.01 * k * torch.randn(n, 4, generator=gen).to(device) for k in range(count)
        ]
        self.labels = torch.randint(0, NUM_CLASSES, (n,), generator=gen).to(device)

    def initial_model(self) -> torch.nn.Module:
        """relconv's MinkUNet at the weights every implementation starts from (`initial_state`)."""
        from relconv.voxel.models import MinkUNet

        initial = MinkUNet(self.in_channels, NUM_CLASSES, width=self.spec["width"]).to(self.device)
        initial.load_state_dict(self.initial_state)
        return initial

    def prepared(self, model: torch.nn.Module, make_input, library_precision=None, note="") -> Prepared:
        """The timed inference call or training step of `model` on `make_input(features)`.

        `library_precision(dtype_name)`: a peer's own precision switch (see prepare.layer_fn)."""
        spec, device = self.spec, self.device
        lib = library_precision or (lambda _: contextlib.nullcontext())
        model = model.to(device)
        if spec["mode"] == "infer":
            model.eval()

            def fn(f):
                with torch.no_grad(), precision(spec["dtype"], device, autocast=True), lib(spec["dtype"]):
                    return model(make_input(f))
        else:
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

            def fn(f):
                opt.zero_grad(set_to_none=True)
                # The peer's own switch covers its backward kernels too; autocast only the forward.
                with lib(spec["dtype"]):
                    with precision(spec["dtype"], device, autocast=True):
                        logits = model(make_input(f))
                    F.cross_entropy(logits.float(), self.labels).backward()
                opt.step()

        def output():
            # Agreement in fp32 eval mode, before any timed step has moved weights or BN statistics.
            was_training = model.training
            model.eval()
            with torch.no_grad(), precision("fp32", device), lib("fp32"):
                out = model(make_input(self.inputs[0])).float()
            model.train(was_training)
            return None, out

        return Prepared(fn=fn, inputs=self.inputs, output=output, note=note)

    def relconv(self) -> Prepared:
        from relconv.voxel import VoxelTensor

        coords = self.scene.coords
        return self.prepared(self.model, lambda f: VoxelTensor(f, coords))

    def relconv_unfolded(self) -> Prepared:
        """Inference layer by layer (`relconv.voxel.inference_folding(False)`): the network as the
        peers run it, BatchNorm and ReLU as their own ops, reported as relconv's own variant
        (`relconv-unfolded`) beside the default `relconv` row, which folds BatchNorm into the convs
        on the fly in eval mode."""
        from relconv.voxel import VoxelTensor, inference_folding

        coords = self.scene.coords
        step = self.prepared(self.model, lambda f: VoxelTensor(f, coords), note="BatchNorm unfolded")

        def fn(f):
            with inference_folding(False):
                return step.fn(f)

        def output():
            with inference_folding(False):
                return step.output()

        return Prepared(fn=fn, inputs=step.inputs, output=output, note=step.note)


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
