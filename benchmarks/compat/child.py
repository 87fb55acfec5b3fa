"""One (backbone, library) in a process of its own: parity outputs or timings, written to a file.

    python -m benchmarks.compat.child parity BACKBONE LIBRARY OUT.pt [--state STATE.pt] ...
    python -m benchmarks.compat.child speed BACKBONE LIBRARY OUT.json [--with-native] ...

fp16 is as the libraries' users run it: training is mixed precision, fp16 input features under
`torch.autocast` with fp32 parameters (TorchSparse's convs follow their fp16 operands, spconv's and
relconv's follow autocast); inference runs a half-precision copy of the model (`model.half()`) on
fp16 features, as spconv's and TorchSparse's users deploy (spconv 2.3's inference path finds no
kernel for fp32 weights with fp16 features under autocast). fp32 is exact fp32 (TF32 off
everywhere). fp64 (the shim only: relconv runs float64) converts the model and features to
float64, the accuracy reference of parity.py.

`parity` runs, per dtype, a training-mode forward and the backward of a fixed projection of every
output, and an eval-mode forward without autograd, from the same initial state each time, and saves
outputs, input gradient and parameter gradients (all moved to the CPU as float32). The real library's
run also saves the initial state_dict, which the shim's and the native twin's runs load (`--state`).
`speed` times inference (eval, `torch.no_grad()`) and a training step (forward, projection, backward)
with the shared harness timing (`benchmarks.harness.timing.measure`), then profiles the same call on
CUDA (`benchmarks.harness.instrument.profile_call`: GPU time, kernel launches, host waits, the
costliest kernels). With `--with-native` the shim and relconv's native twin run in the same
process, taking turns on every case (`speed`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import traceback
from pathlib import Path

import torch

from benchmarks.compat import backbones as bb
from benchmarks.compat import native, scenes
from benchmarks.harness.instrument import profile_call
from benchmarks.harness.timing import Timing, TimingConfig, measure
from benchmarks.peers.spconv_peer import on_cpu_without_cuda

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "fp64": torch.float64}
# Kernels per timed case kept in speed.json: the costliest by GPU time, to say where a gap comes from.
KERNELS_KEPT = 12


def _precision(family: str) -> None:
    """fp32 means fp32 on every side: no TF32 in torch, relconv or TorchSparse (whose default is on)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if family == "torchsparse":
        backends = getattr(sys.modules.get("torchsparse"), "backends", None)
        if backends is not None and hasattr(backends, "allow_tf32"):
            backends.allow_tf32 = False


class Side:
    """A built backbone in one library, with the functions that feed it and read it."""

    def __init__(
        self, backbone: bb.Backbone, library: str, root: Path, voxels: scenes.Voxels, device
    ) -> None:
        self.backbone, self.library, self.voxels, self.device = backbone, library, voxels, device
        self.described = bb.use_library(backbone.family, library)
        if library == "real" and backbone.family == "spconv" and not torch.cuda.is_available():
            on_cpu_without_cuda()
        _precision(backbone.family)
        torch.manual_seed(0)
        if library == "native":
            if backbone.name not in native.TWINS:
                raise bb.HarnessError(f"{backbone.name} has no relconv-native twin")
            self.model = native.TWINS[backbone.name]()
            self._input, self._outputs = native.INPUTS[backbone.name], native.outputs
        else:
            self.model = backbone.build(root, voxels)
            self._input, self._outputs = backbone.make_input, backbone.outputs
        self.model.to(device)

    def load(self, state: dict) -> None:
        if self.library == "native":
            native.load_state(self.model, state, native.LAYOUTS[self.backbone.name])
        else:
            self.model.load_state_dict(state, strict=True)

    def param_grads(self) -> dict[str, torch.Tensor]:
        if self.library == "native":
            return native.grads_as(self.model, native.LAYOUTS[self.backbone.name])
        return {n: p.grad for n, p in self.model.named_parameters() if p.grad is not None}

    def features(self, dtype, requires_grad: bool) -> torch.Tensor:
        f = self.voxels.feats.to(self.device, dtype)
        return f.requires_grad_(requires_grad)

    def run(self, feats: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        inp = self._input(self.voxels, feats)
        return self._outputs(self.model, self.model(inp))


# The projection's coordinate weights, one copy per device: built from a Python list inside every
# step, each output's copy to the GPU waited for the host and added a host wait to every library's
# training step.
_PHASE_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _phase_weights(device: torch.device) -> torch.Tensor:
    if device not in _PHASE_WEIGHTS:
        _PHASE_WEIGHTS[device] = torch.tensor([0.61, 0.37, 0.23, 0.11], dtype=torch.float64, device=device)
    return _PHASE_WEIGHTS[device]


def projection_loss(outputs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """sum over outputs of <features, R> with R a fixed function of (output name, coordinates,
    channel): independent of row order, so every library gets the same loss for the same result."""
    total = 0.0
    for n, (_, (coords, feats)) in enumerate(sorted(outputs.items())):
        c = coords.to(torch.float64)
        phase = c @ _phase_weights(c.device)
        ch = torch.arange(feats.shape[1], dtype=torch.float64, device=c.device)
        r = torch.cos(phase[:, None] + 1.3 * ch[None, :] + 0.7 * n)
        total = total + (feats.float() * r.float()).sum()
    return total


def precision(name: str, device: torch.device):
    """The context a dtype's run executes in (see the module docstring)."""
    if name == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def inference_precision(side: Side, name: str):
    """The context an inference of dtype `name` runs in (see the module docstring); the model's
    parameters and buffers are restored on exit."""
    if name != "fp16":
        with precision(name, side.device):
            yield
        return
    state = {k: v.detach().clone() for k, v in side.model.state_dict().items()}
    side.model.half()
    try:
        yield
    finally:
        side.model.float()
        side.model.load_state_dict(state)


def _cpu(outputs) -> dict:
    return {k: (c.detach().cpu().long(), f.detach().cpu().float()) for k, (c, f) in outputs.items()}


def _perturbed(feats: torch.Tensor, repeat: int) -> torch.Tensor:
    """The input of accuracy repeat `repeat` (0: as given): fp32 features moved by about one unit in
    the last place, up or down by a sign pattern seeded by `repeat`, the same in every library."""
    if repeat == 0:
        return feats
    g = torch.Generator().manual_seed(repeat)
    sign = torch.randint(0, 2, feats.shape, generator=g).to(feats.device, torch.float32) * 2 - 1
    return (feats.float() * (1 + sign * 2.0**-23)).to(feats.dtype)


def _train_step(side: Side, name: str, initial: dict, repeat: int) -> dict:
    """A training-mode forward and the backward of the projection, from `initial`, on `repeat`'s input."""
    side.model.load_state_dict({k: v.clone() for k, v in initial.items()})
    side.model.train()
    side.model.zero_grad(set_to_none=True)
    base = side.features(torch.float32, requires_grad=False)
    feats = _perturbed(base, repeat).to(DTYPES[name]).requires_grad_(True)
    with precision(name, side.device):
        outputs = side.run(feats)
        loss = projection_loss(outputs)
    loss.backward()
    return {
        "outputs": _cpu(outputs),
        "input_grad": feats.grad.detach().cpu().float(),
        "param_grads": {k: g.detach().cpu().float() for k, g in side.param_grads().items()},
    }


def parity(side: Side, dtypes: list[str], state_in: Path | None, out: Path, repeats: int = 1) -> None:
    if state_in is not None:
        side.load(torch.load(state_in, map_location=side.device))
    initial = {k: v.detach().clone() for k, v in side.model.state_dict().items()}
    result: dict = {"library": side.described, "backbone": side.backbone.name, "dtypes": {}}
    if state_in is None:
        result["state"] = {k: v.cpu() for k, v in initial.items()}
    for name in dtypes:
        dtype = DTYPES[name]
        if dtype == torch.float64:  # the accuracy reference: every parameter and buffer in float64
            side.model.double()
        train = _train_step(side, name, initial, 0)
        # fp16 features cannot hold a one-ulp fp32 perturbation: accuracy repeats are fp32 / fp64 only.
        extra = range(1, repeats) if name in ("fp32", "fp64") else range(0)
        train_repeats = [_train_step(side, name, initial, r) for r in extra]
        side.model.load_state_dict({k: v.clone() for k, v in initial.items()})
        side.model.eval()
        with torch.no_grad(), inference_precision(side, name):
            infer = {"outputs": _cpu(side.run(side.features(dtype, requires_grad=False)))}
        result["dtypes"][name] = {"train": train, "infer": infer, "train_repeats": train_repeats}
    torch.save(result, out)


def _case(side: Side, name: str, phase: str):
    """The timed function of one (dtype, phase) case of `side`, its two inputs and its context."""
    inputs = [side.features(DTYPES[name], requires_grad=False) for _ in range(2)]
    if phase == "inference":

        def infer(f):
            with torch.no_grad():
                return side.run(f)

        return infer, inputs, lambda: inference_precision(side, name)

    def train(f):
        side.model.zero_grad(set_to_none=True)
        with precision(name, side.device):
            loss = projection_loss(side.run(f))
        loss.backward()

    return train, inputs, contextlib.nullcontext


def _merged(timings: list[Timing]) -> dict:
    """One side's measurements of a case as one row: each time the median of its measurements."""

    def med(field: str) -> float:
        return statistics.median(getattr(t, field) for t in timings)

    peaks = [t.peak_mem_mib for t in timings if t.peak_mem_mib is not None]
    row = {"latency_ms": med("latency_ms"), "p20_ms": med("p20_ms"), "p80_ms": med("p80_ms")}
    row.update(throughput_ms=med("throughput_ms"), runs=sum(t.runs for t in timings))
    return {**row, "peak_mem_mib": max(peaks) if peaks else None}


def in_case(side: Side, name: str, phase: str, action):
    """`action(fn, inputs, device)` on `side`'s case, in the case's mode and context."""
    fn, inputs, context = _case(side, name, phase)
    side.model.train(phase == "training")
    with context():
        return action(fn, inputs, side.device)


def speed(sides: list[Side], dtypes: list[str], config: TimingConfig, out: Path) -> None:
    """Times every (dtype, phase) case of each side and writes one result per side. Two sides (the
    shim and its native twin in one process) take turns in the order A, B, B, A, and each side's
    times are the medians of its two measurements: the host's speed, which differs from one process
    to the next, then falls on both alike, and a drift within the process cancels. A side's last
    turn also profiles the call, in the same context as its timing (warm caches)."""
    rows: dict[int, list] = {id(side): [] for side in sides}
    turns = sides + sides[::-1] if len(sides) > 1 else sides
    last = {id(side): i for i, side in enumerate(turns)}

    def timed(profile: bool):
        def action(fn, inputs, device):
            t = measure(fn, inputs, device, config)
            # GPU time, launches, host waits and the costliest kernels of the same call
            return t, profile_call(fn, inputs[0], device, top=KERNELS_KEPT) if profile else {}

        return action

    for name in dtypes:
        for phase in ("inference", "training"):
            timings: dict[int, list] = {id(side): [] for side in sides}
            gpu: dict[int, dict] = {}
            failed: dict[int, str] = {}
            for i, side in enumerate(turns):
                if id(side) in failed:
                    continue
                try:
                    t, profile = in_case(side, name, phase, timed(last[id(side)] == i))
                except Exception as err:  # one failing case must not hide the others' times
                    failed[id(side)] = f"{type(err).__name__}: {err}"
                    continue
                timings[id(side)].append(t)
                gpu[id(side)] = gpu.get(id(side), {}) | profile
            for side in sides:
                error = failed.get(id(side))
                row = {"error": error} if error else {**_merged(timings[id(side)]), **gpu[id(side)]}
                rows[id(side)].append({"dtype": name, "phase": phase, **row})
    results = [
        {
            "library": side.described,
            "library_kind": side.library,
            "backbone": side.backbone.name,
            "rows": rows[id(side)],
        }
        for side in sides
    ]
    out.write_text(json.dumps(results, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("parity", "speed"))
    p.add_argument("backbone", choices=sorted(bb.BACKBONES))
    p.add_argument("library", choices=bb.LIBRARIES)
    p.add_argument("out", type=Path)
    p.add_argument("--state", type=Path, help="state_dict saved by the real library's parity run")
    p.add_argument("--downstream", type=Path, default=bb.DEFAULT_DOWNSTREAM)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="fp32,fp16")
    p.add_argument("--tiny", action="store_true", help="two small 8-beam scans instead of four 64-beam ones")
    p.add_argument("--scene-cache", type=Path, help="folder the voxelized scans are kept in between children")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="parity: fp32 / fp64 training steps, each after the first on a one-ulp perturbed input",
    )
    p.add_argument(
        "--with-native",
        action="store_true",
        help="speed, with the shim: time relconv's native twin in the same process, turn about",
    )
    p.add_argument("--runs", type=int, default=TimingConfig.runs)
    p.add_argument("--queued-blocks", type=int, default=3)
    p.add_argument("--warmup-runs", type=int, default=TimingConfig.warmup_runs)
    a = p.parse_args(argv)
    if a.with_native and (a.mode != "speed" or a.library != "shim"):
        p.error(
            "--with-native times the shim beside its native twin: it needs speed mode and library shim, "
            f"got {a.mode} and {a.library}"
        )
    dtypes = [d for d in a.dtypes.split(",") if d]
    if any(d not in DTYPES for d in dtypes):
        p.error(f"--dtypes must name some of {sorted(DTYPES)}, got {a.dtypes!r}")
    backbone = bb.BACKBONES[a.backbone]
    try:
        voxels = scenes.load(backbone.scene, a.tiny, a.scene_cache)
        side = Side(backbone, a.library, a.downstream, voxels, torch.device(a.device))
        if a.mode == "parity":
            parity(side, dtypes, a.state, a.out, a.repeats)
        else:
            config = TimingConfig(warmup_runs=a.warmup_runs, runs=a.runs, queued_blocks=a.queued_blocks)
            sides = [side]
            if a.with_native:
                sides.append(Side(backbone, "native", a.downstream, voxels, torch.device(a.device)))
            speed(sides, dtypes, config, a.out)
    except bb.HarnessError as err:
        print(f"compat harness: {err}", file=sys.stderr)
        return 2
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
