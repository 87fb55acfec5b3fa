"""How a relational convolution runs: the one place that decides it.

`decide` chooses, per call, the dataflow and the views of the map the op gets (neighbour table,
transposed table, pair lists); `relational_conv` calls it, and `relconv.voxel.Conv3d` keeps the
prepared call it leads to (`prepare`). The CUDA kernel and its tiles are chosen in C++ at launch
(csrc/common/kernel_choice.h); `plan` asks the same function through `relconv._C.kernel_choice`
and returns a printable `ConvPlan` that says what runs and why, for any device, in a CPU build too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from relconv._ext import _C
from relconv.core.relational_map import RelationalMap
from relconv.ops import map_views
from relconv.ops.dataflow import Dataflow

# Exact fp32 layers up to this many output channels per group run output-stationary under AUTO: one
# launch and no pair lists, and a pipelined kernel that beats fetch-on-demand's there (measurements at
# csrc/common/kernel_choice.h, table_kernel).
EXACT_TABLE_MAX_CHANNELS = 32


def resolve_dataflow(
    dataflow: Dataflow,
    compute_dtype: torch.dtype,
    unique_slots: bool,
    has_scale: bool,
    out_channels: int | None = None,
) -> Dataflow:
    """The dataflow a CUDA forward runs: `dataflow` itself, or AUTO's rule. `out_channels` (per
    group; None: unknown) lets narrow exact fp32 layers take the table. Raises ValueError when
    OUTPUT_STATIONARY is asked for a map it cannot run."""
    if not isinstance(dataflow, Dataflow):
        raise TypeError(f"dataflow must be a relconv.ops.Dataflow, got {dataflow!r}")
    table_ok = unique_slots and not has_scale
    if dataflow is Dataflow.OUTPUT_STATIONARY and not table_ok:
        raise ValueError(
            "dataflow=OUTPUT_STATIONARY needs a map with at most one input per (output, relation) slot "
            "(unique_slots=True) and no per-pair scale; use FETCH_ON_DEMAND or AUTO for this map"
        )
    if dataflow is not Dataflow.AUTO:
        return dataflow
    tensor_cores = compute_dtype in (torch.float16, torch.bfloat16) or (
        compute_dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    )
    narrow = out_channels is not None and out_channels <= EXACT_TABLE_MAX_CHANNELS
    narrow_exact = compute_dtype == torch.float32 and narrow
    if table_ok and (tensor_cores or narrow_exact or torch.are_deterministic_algorithms_enabled()):
        return Dataflow.OUTPUT_STATIONARY
    return Dataflow.FETCH_ON_DEMAND


def compute_dtype_for(dtype: torch.dtype, like: Tensor) -> torch.dtype:
    """The dtype an operand of `dtype` computes in on `like`'s device: the autocast dtype for float32
    under autocast (the op's autocast kernel casts on entry), else `dtype` itself."""
    if dtype == torch.float32:
        device = "cuda" if like.is_cuda else like.device.type  # the literal: Tensor.device.type ~0.25 us
        if torch.is_autocast_enabled(device):
            return torch.get_autocast_dtype(device)
    return dtype


def decide(
    rmap: RelationalMap,
    x: Tensor,
    dataflow: Dataflow,
    c_in_g: int,
    c_out_g: int,
    x_grad: bool,
    w_grad: bool,
    cuda: bool | None = None,
) -> tuple[torch.dtype, bool, bool, bool]:
    """(compute dtype, table forward, table input gradient, pairs passed) of one call on x's device
    (`cuda` True: as on a GPU, for `plan`).

    - table forward: a CUDA call runs output-stationary over the neighbour table (`resolve_dataflow`).
    - table input gradient: the input gradient of a table forward runs the table kernel too when the
      map is injective both ways (voxel maps), over the transposed table; maps with unique slots that
      repeat an input within a relation have none and keep the pair path for it. AUTO may send a
      narrow exact fp32 layer's wider input gradient to the pairs.
    - pairs passed: the table forward reads no pairs, so a map built as a table passes none unless
      autograd will read them (the weight gradient always, the input gradient when it has no
      transposed table; the bias gradient needs none).
    """
    if cuda is None:
        cuda = x.is_cuda
    # The CPU kernel has one dataflow: AUTO decides nothing there (resolving it cost ~1 us per call),
    # while a forced choice the map cannot run raises on every device.
    if not cuda and dataflow is Dataflow.AUTO:
        return x.dtype, False, False, True
    dtype = compute_dtype_for(x.dtype, x)
    scaled = rmap.scale is not None
    stationary = Dataflow.OUTPUT_STATIONARY
    table = resolve_dataflow(dataflow, dtype, rmap.unique_slots, scaled, c_out_g) is stationary
    if not cuda:
        return dtype, False, False, True
    dgrad = (
        table
        and x_grad
        and rmap.injective
        and resolve_dataflow(dataflow, dtype, True, scaled, c_in_g) is stationary
    )
    pairs = not table or w_grad or (x_grad and not dgrad) or rmap.has_pairs
    return dtype, table, dgrad, pairs


# --------------------------------------------------------------------------- printable plan

_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


@dataclass(frozen=True)
class ConvPlan:
    """What one relational convolution runs, and why (see `plan`)."""

    device: str
    dataflow: Dataflow
    why: str
    kernel: str
    views: tuple[str, ...]
    sort: str
    input_grad: str | None
    weight_grad: str | None

    def __repr__(self) -> str:
        parts = [
            f"dataflow={self.dataflow.name} ({self.why})",
            f"kernel={self.kernel}",
            f"views=[{', '.join(self.views)}]",
            f"sort={self.sort}",
        ]
        if self.input_grad is not None:
            parts.append(f"input_grad={self.input_grad}")
        if self.weight_grad is not None:
            parts.append(f"weight_grad={self.weight_grad}")
        return f"ConvPlan(device={self.device}, " + ", ".join(parts) + ")"


def plan(
    rmap: RelationalMap,
    x: Tensor,
    weight: Tensor,
    groups: int = 1,
    dataflow: Dataflow = Dataflow.AUTO,
    *,
    requires_grad: bool | None = None,
    arch: tuple[int, int] | None = None,
    sms: int = 132,
) -> ConvPlan:
    """The execution plan of `relational_conv(x, weight, rmap, groups, dataflow)`.

    Args:
        rmap, x, weight, groups, dataflow: as `relational_conv` takes them.
        requires_grad: whether the call is differentiated (then x and weight get gradients); None
            reads it from x, weight and torch's grad mode.
        arch: a CUDA compute capability (major, minor) to plan for, e.g. (9, 0); None plans for x's
            device (a CPU x runs the CPU kernel). `sms`: that GPU's SM count (132: an H100 SXM).
    """
    if not isinstance(rmap, RelationalMap):
        raise TypeError(f"rmap must be a RelationalMap, got {type(rmap).__name__}")
    if weight.dim() not in (3, 4):
        raise ValueError(
            f"weight must be [R, C_in, C_out] or [R, G, C_in/G, C_out/G], got {tuple(weight.shape)}"
        )
    c_in_g, c_out_g = (
        (weight.shape[1], weight.shape[2]) if weight.dim() == 3 else (weight.shape[2], weight.shape[3])
    )
    if requires_grad is None:
        grad = torch.is_grad_enabled()
        x_grad, w_grad = grad and x.requires_grad, grad and weight.requires_grad
    else:
        x_grad = w_grad = bool(requires_grad)
    cuda = arch is not None or x.is_cuda
    if cuda and arch is None:
        arch, sms = _device_shape(x.device)
    dtype, table, dgrad, pairs = decide(rmap, x, dataflow, c_in_g, c_out_g, x_grad, w_grad, cuda)
    if not cuda:
        views = ("pairs",)
        return ConvPlan(
            "cpu",
            Dataflow.FETCH_ON_DEMAND,
            "the CPU kernel's one dataflow",
            "cpu kernel",
            views,
            "none",
            "cpu kernel" if x_grad else None,
            "cpu kernel" if w_grad else None,
        )
    flow = Dataflow.OUTPUT_STATIONARY if table else Dataflow.FETCH_ON_DEMAND
    why = _why(rmap, dtype, dataflow, c_out_g, table)
    device = f"cuda sm_{arch[0]}{arch[1]}"
    shape = {"arch": tuple(arch), "sms": sms, "groups": groups, "index32": rmap.index_dtype == torch.int32}
    name = str(dtype).removeprefix("torch.")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    if table:
        fwd = _kernel("table", name, c_in_g, c_out_g, rmap.num_in, rmap.num_out, rmap, shape, tf32)
    else:
        fwd = _kernel("pairs", name, c_in_g, c_out_g, rmap.num_in, rmap.num_out, rmap, shape, tf32)
    views = []
    if table:
        views += ["table", "table order once sorted"]
    if dgrad:
        views += ["transposed table", "transposed order once sorted"]
    if pairs:
        backward = table and (w_grad or (x_grad and not dgrad))
        views.append("pairs" if not table else "pairs for backward" if backward else "pairs (materialised)")
    input_grad = weight_grad = None
    if x_grad:
        kind = "table" if dgrad else "pairs"
        input_grad = _kernel(
            kind, name, c_out_g, c_in_g, rmap.num_out, rmap.num_in, rmap, shape, tf32, weight_t=dgrad
        )
        input_grad += " over the transposed table" if dgrad else " over the swapped pairs (atomics)"
    if w_grad:
        weight_grad = _kernel(
            "weight_grad", name, c_in_g, c_out_g, rmap.num_in, rmap.num_out, rmap, shape, tf32
        )
    counts = map_views.sort_weight(dtype)
    counted = f", each counting {counts:g}x" if counts != 1.0 else ""
    sort = (
        f"table rows sorted once table forwards reach {map_views.SORT_WORK:.1e} multiply-adds{counted}"
        if table
        else "none"
    )
    return ConvPlan(device, flow, why, fwd, tuple(views), sort, input_grad, weight_grad)


def _why(rmap: RelationalMap, dtype: torch.dtype, dataflow: Dataflow, c_out_g: int, table: bool) -> str:
    name = _NAMES.get(dtype, str(dtype))
    if dataflow is not Dataflow.AUTO:
        return f"asked for, {name}"
    if not table:
        reasons = [
            text
            for applies, text in (
                (not rmap.unique_slots, "map with several inputs per slot"),
                (rmap.scale is not None, "map with a per-pair scale"),
            )
            if applies
        ]
        if reasons:
            return f"{name}, " + " and ".join(reasons)
        return f"exact {name} wider than {EXACT_TABLE_MAX_CHANNELS} output channels per group"
    if dtype in (torch.float16, torch.bfloat16):
        return f"{name} + unique-slot map"
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "fp32 in TF32 + unique-slot map"
    if torch.are_deterministic_algorithms_enabled():
        return f"{name} + unique-slot map, deterministic algorithms"
    return f"exact {name} up to {EXACT_TABLE_MAX_CHANNELS} output channels per group + unique-slot map"


def _kernel(kind, dtype, c_in_g, c_out_g, num_in, num_out, rmap, shape, tf32, weight_t=False) -> str:
    """The CUDA kernel common/kernel_choice.h picks, described."""
    choice, note = _choice(kind, dtype, c_in_g, c_out_g, num_in, num_out, rmap, shape, tf32, weight_t)
    bm, bn, bk, _, _, stages = choice["tiles"]
    extra = [
        name
        for key, name in (
            ("whole_tiles", "whole tiles"),
            ("reads_weight_t", "reads W^T in place"),
            ("tf32", "TF32"),
        )
        if choice.get(key)
    ]
    if choice.get("split", 1) > 1:
        extra.append(f"relation split {choice['split']}")
    if choice.get("pack", 1) > 1:
        extra.append(f"{choice['pack']} relations per K step")
    more = "".join(f", {e}" for e in extra)
    tiles = f"BM {bm} BN {bn} BK {bk}, {stages} stages"
    return f"{choice['family']} ({choice['config']}: C_in_g {c_in_g} C_out_g {c_out_g}, {tiles}{more}{note})"


def _choice(kind, dtype, c_in_g, c_out_g, num_in, num_out, rmap, shape, tf32, weight_t=False):
    """(kernel_choice's answer, a note when W^T is copied) for a call. Operands are taken as
    allocated (16-byte aligned), so the alignment flags follow from the channel counts."""
    vec = 16 // torch.empty((), dtype=getattr(torch, dtype)).element_size()
    args = {
        "groups": shape["groups"],
        "cin_g": c_in_g,
        "cout_g": c_out_g,
        "num_in": num_in,
        "num_out": num_out,
        "num_relations": rmap.num_relations,
        "index32": shape["index32"],
        "allow_tf32": tf32,
        "vec_x": c_in_g % vec == 0,
        # Weight rows: C_out_g, or C_in_g of the call for W^T's storage; the gradient's for kind
        # weight_grad.
        "vec_w": (c_in_g if weight_t else c_out_g) % vec == 0,
        "vec_out2": c_out_g % 2 == 0,
        "out16": (shape["groups"] * c_out_g) % 4 == 0,
        "weight_t": weight_t,
    }
    choice = _C.kernel_choice(kind, dtype, shape["arch"], shape["sms"], **args)
    note = ""
    if kind == "table" and choice["config"] == "none":
        # No kernel reads this W^T in place: the launcher copies it and asks again.
        args.update(weight_t=False, vec_w=c_out_g % vec == 0)
        choice = _C.kernel_choice(kind, dtype, shape["arch"], shape["sms"], **args)
        note = ", W^T copied"
    return choice, note


def persistent_table_kernel(rmap: RelationalMap, x: Tensor, weight: Tensor, transposed: bool) -> bool:
    """Whether a CUDA call's table forward or, with `transposed`, its input gradient over the
    transposed table runs the persistent warp-specialised kernel on x's device. That kernel reads a
    table copied into its order's row sequence 10-17% slower than through the order, so
    relconv.ops.prepare makes such copies only for the other kernels. On sm_90 it takes the build
    to hold sm_90a code, as `plan` does by default."""
    arch, sms = _device_shape(x.device)
    if arch != (9, 0):
        return False
    c_in_g, c_out_g = weight.shape[-2], weight.shape[-1]
    groups = weight.shape[1] if weight.dim() == 4 else 1
    shape = {"arch": arch, "sms": sms, "groups": groups, "index32": rmap.index_dtype == torch.int32}
    name = str(compute_dtype_for(weight.dtype, x)).removeprefix("torch.")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    calls = [(c_in_g, c_out_g, rmap.num_in, rmap.num_out, False)]
    if transposed:
        calls.append((c_out_g, c_in_g, rmap.num_out, rmap.num_in, True))
    return any(
        _choice("table", name, cin, cout, n_in, n_out, rmap, shape, tf32, weight_t)[0]["family"]
        == "table_wgmma_persistent"
        for cin, cout, n_in, n_out, weight_t in calls
    )


_DEVICE_SHAPES: dict[int, tuple[tuple[int, int], int]] = {}


def _device_shape(device: torch.device) -> tuple[tuple[int, int], int]:
    """(compute capability, SM count) of a CUDA device, asked once per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    shape = _DEVICE_SHAPES.get(index)
    if shape is None:
        props = torch.cuda.get_device_properties(index)
        shape = _DEVICE_SHAPES[index] = ((props.major, props.minor), props.multi_processor_count)
    return shape
