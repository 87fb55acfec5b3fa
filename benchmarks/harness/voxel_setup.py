"""What a voxel case hands every implementation: relconv's side of the case, built first.

`LayerSetup` (one conv layer) and `E2ESetup` (the whole MinkUNet) hold the spec, scene, device,
weights and inputs every implementation loads, and relconv's own `Prepared`. benchmarks/voxel_suite.py
builds one per case; each peer adapter (benchmarks/peers/<peer>.py) builds its `Prepared` from it.
Kept in the harness so that the peers depend on these types, not on the suite that lists them.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from benchmarks.harness.bench import Prepared, Unsupported
from benchmarks.harness.floor import DTYPES
from benchmarks.harness.ops import OPS
from benchmarks.harness.prepare import features, layer_fn, precision, training
from benchmarks.harness.timing import rotation_count

if TYPE_CHECKING:
    from benchmarks.workloads.voxels import Scene

NUM_CLASSES = 19
DENSE_LIMIT = 2**24  # dense reference only when grid cells x channels stay below this


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
        # steps (SGD, BatchNorm running statistics) move self.model; the peers start from these
        # weights, since they are compared with relconv's output from before the steps (copying the
        # moved weights would make every train row mismatch; infer rows move nothing).
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
