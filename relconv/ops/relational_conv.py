"""Python face of the relational-convolution ops: typed wrappers, fake kernels and autograd."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from relconv._ext import _C, call_op
from relconv.core.relational_map import RelationalMap
from relconv.ops import map_views as views
from relconv.ops.dataflow import Dataflow
from relconv.ops.planning import decide, persistent_table_kernel

ACTIVATIONS = (None, "relu")

_conv = torch.ops.relconv.relational_conv.default
_weight_grad = torch.ops.relconv.relational_conv_weight_grad.default
_conv_add = torch.ops.relconv.relational_conv_add_.default


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, everything else accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_grouped_weight(weight: Tensor, groups: int) -> Tensor:
    """[R, C_in, C_out] (groups == 1) or [R, groups, C_in/groups, C_out/groups] -> the 4-D layout."""
    _check_weight_layout(weight, groups)
    return weight.unsqueeze(1) if weight.dim() == 3 else weight


def _check_weight_layout(weight: Tensor, groups: int) -> None:
    """Raises unless `weight` is [R, C_in, C_out] with groups == 1 or [R, groups, C_in/g, C_out/g]."""
    if groups < 1:
        raise ValueError(f"groups must be a positive integer, got {groups}")
    if weight.dim() == 3:
        if groups != 1:
            raise ValueError(
                f"weight must be 4-D [R, groups, C_in/groups, C_out/groups] when groups={groups}, "
                f"got shape {tuple(weight.shape)}"
            )
    elif weight.dim() == 4:
        if weight.shape[1] != groups:
            raise ValueError(f"weight.shape[1] ({weight.shape[1]}) must equal groups ({groups})")
    else:
        raise ValueError(
            f"weight must be [R, C_in, C_out] or [R, groups, C_in/groups, C_out/groups], "
            f"got shape {tuple(weight.shape)}"
        )


def _channels(weight: Tensor) -> tuple[int, int]:
    """(C_in, C_out) of a 3-D or 4-D weight (validated by _check_weight_layout)."""
    if weight.dim() == 3:
        return weight.shape[1], weight.shape[2]
    return weight.shape[1] * weight.shape[2], weight.shape[1] * weight.shape[3]


def _scale_for(rmap: RelationalMap, dtype: torch.dtype) -> Tensor | None:
    s = rmap.scale
    return None if s is None else s.to(acc_dtype(dtype))


def relational_conv(
    x: Tensor,
    weight: Tensor,
    rmap: RelationalMap,
    groups: int = 1,
    dataflow: Dataflow = Dataflow.AUTO,
    bias: Tensor | None = None,
    activation: str | None = None,
) -> Tensor:
    """`out[o] = act(sum over pairs (i, o, r) of scale[p] * x[i] @ W[r] + bias)`.

    Args:
        x: [rmap.num_in, C_in] features (float32/float64/float16/bfloat16).
        weight: [R, C_in, C_out], or [R, groups, C_in/groups, C_out/groups] for block-diagonal
            (grouped) weights on `x`'s device, in `x`'s dtype; float32 weights with float16 /
            bfloat16 `x` run in `x`'s dtype (cast on entry, as under autocast; the gradient comes
            back in float32).
        rmap: the pairs; `rmap.num_relations` must equal R.
        groups: channel groups; each group of C_in/groups inputs feeds its own C_out/groups outputs.
        dataflow: how the CUDA forward runs (`relconv.ops.Dataflow`; AUTO picks by dtype and map).
            The CPU kernel has one dataflow and ignores the choice beyond checking it.
        bias: optional [C_out], added to every output row (rows without pairs too); cast to x's
            dtype if it differs (under autocast, to the autocast dtype with x).
        activation: None or "relu", applied after the bias.

    Returns:
        [rmap.num_out, C_out] in x's dtype (float16/bfloat16 accumulate in float32; bias and ReLU
        are applied before the rounding). Outputs without pairs are `act(bias)`, or zero. On CUDA
        the output-stationary kernel applies bias and ReLU in its epilogue: one kernel for
        conv + bias + ReLU. Differentiable in `x`, `weight` and `bias`; over a map that is
        injective both ways (`rmap.injective`, voxel maps) the CUDA input gradient of that kernel
        is the same kernel over the transposed table (no atomics).
    """
    return run_conv(conv_call(x, weight, rmap, groups, dataflow, bias, activation))


class ConvArgs(NamedTuple):
    """The `relconv::relational_conv` op's arguments by name, in its schema's order (csrc/library.cpp
    documents each)."""

    x: Tensor
    weight: Tensor
    in_index: Tensor
    out_index: Tensor
    rel_ptr: Tensor
    scale: Tensor | None
    num_out: int
    neighbor_table: Tensor | None = None
    table_order: Tensor | None = None
    bias: Tensor | None = None
    relu: bool = False
    transposed_table: Tensor | None = None
    transposed_order: Tensor | None = None
    sorted_tables: bool = False


# tuple.__new__ fills a ConvArgs without the Python frame of its generated __new__ (host time per call).
_new_args = tuple.__new__


def run_conv(call: tuple[ConvArgs, tuple]) -> Tensor:
    """Launches a convolution prepared by `conv_call`."""
    return call_op(_C.relational_conv, _conv, *call)


def conv_call(
    x: Tensor,
    weight: Tensor,
    rmap: RelationalMap,
    groups: int = 1,
    dataflow: Dataflow = Dataflow.AUTO,
    bias: Tensor | None = None,
    activation: str | None = None,
) -> tuple[ConvArgs, tuple]:
    """`relational_conv` up to its launch: its arguments checked, the plan decided
    (`relconv.ops.planning.decide`) and the op's arguments (and the tensors that may carry a
    `__torch_function__` override) returned for `run_conv`. Split so that a caller can do host work
    between the two (relconv.voxel's deferred coordinate check) or keep the call (`prepare`)."""
    if not isinstance(rmap, RelationalMap):
        raise TypeError(f"rmap must be a RelationalMap, got {type(rmap).__name__}")
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor [num_in, C_in], got {_shape(x)}")
    num_in, x_channels = x.shape
    if num_in != rmap.num_in:
        raise ValueError(f"x has {num_in} rows but the map has num_in={rmap.num_in}")
    # The op takes a 3-D weight as it is: a view to 4-D here would be an autograd node per call
    # (host time on every training step); the op views it below autograd, for free.
    _check_weight_layout(weight, groups)
    if weight.shape[0] != rmap.num_relations:
        raise ValueError(
            f"weight has {weight.shape[0]} relations but the map has num_relations={rmap.num_relations}"
        )
    c_in, c_out = _channels(weight)
    if x_channels != c_in:
        raise ValueError(f"x has {x_channels} channels but weight expects C_in = {c_in}")
    if x.device != rmap.device:
        raise ValueError(f"x is on {x.device} but the map is on {rmap.device}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    b = None if bias is None else _bias_for(bias, x, c_out)
    grad = torch.is_grad_enabled()
    x_grad = grad and x.requires_grad
    w_grad = grad and weight.requires_grad
    dtype, table_fwd, table_dgrad, pairs = decide(
        rmap, x, dataflow, c_in // groups, c_out // groups, x_grad, w_grad
    )
    if table_fwd:
        table, order, transposed, transposed_order, in_index, out_index, rel_ptr = views.table_views(
            rmap, weight, table_dgrad, pairs, dtype
        )
    else:
        table = order = transposed = transposed_order = None
        in_index, out_index, rel_ptr = views.kernel_pairs(rmap)
    args = _new_args(
        ConvArgs,
        (
            x,
            weight,
            in_index,
            out_index,
            rel_ptr,
            _scale_for(rmap, x.dtype),
            rmap.num_out,
            table,
            order,
            b,
            activation == "relu",
            transposed,
            transposed_order,
            False,
        ),
    )
    return args, (x, weight, b)


def prepare(args: ConvArgs, rmap: RelationalMap) -> Callable[[Tensor, Tensor, Tensor | None], Tensor | None]:
    """A call prepared by `conv_call`, kept for reuse: `run(x, weight, bias)` runs the op with every
    other argument bound, or returns None once the call state it was prepared under (grad mode,
    autocast, TF32 / determinism switches, operand dtypes and shapes) no longer holds. Whatever
    `conv_call` would still decide on a later call is decided now: the tables' schedules are sorted
    and, on CUDA, the tables copied in that order (sorted_tables: the kernels read a tile's entries
    as one block), a layer that runs again over the same map being the reuse that pays for both.
    No copies where the persistent warp-specialised kernel runs (persistent_table_kernel), which
    reads them slower than the tables through their orders."""
    if args.neighbor_table is not None:
        transposed = args.transposed_table is not None
        order = views.table_order(rmap)
        back_order = views.transposed_table_order(rmap, threshold=0.0) if transposed else None
        args = args._replace(table_order=order, transposed_order=back_order)
        if args.x.is_cuda and not persistent_table_kernel(rmap, args.x, args.weight, transposed):
            table, back = views.tables_in_order(rmap, order, back_order)
            args = args._replace(
                neighbor_table=table,
                transposed_table=args.transposed_table if back is None else back,
                sorted_tables=True,
            )
    return _C.PreparedConv(*args).run


def _bias_for(bias: object, x: Tensor, c_out: int) -> Tensor:
    """A given `bias` checked against the output ([C_out] on x's device) and in the dtype the op takes."""
    if not isinstance(bias, Tensor):
        raise TypeError(f"bias must be a Tensor or None, got {type(bias).__name__}")
    if bias.dim() != 1 or bias.shape[0] != c_out:
        raise ValueError(f"bias must have shape [C_out] = [{c_out}], got shape {tuple(bias.shape)}")
    if bias.device != x.device:
        raise ValueError(f"bias is on {bias.device} but x is on {x.device}")
    if bias.dtype == x.dtype:
        return bias
    # Under autocast the op's autocast kernel casts x, weight and bias to the autocast dtype together;
    # float64 is the one dtype autocast leaves alone, so a float64 side is matched here.
    autocast = torch.is_autocast_enabled(x.device.type)
    if not autocast or torch.float64 in (x.dtype, bias.dtype):
        return bias.to(x.dtype)
    return bias


def relational_conv_add_(
    out: Tensor, x: Tensor, weight: Tensor, rmap: RelationalMap, groups: int = 1
) -> Tensor:
    """`out[o] += sum over pairs (i, o, r) of scale[p] * x[i] @ W[r]`, in place; returns `out`.

    `relational_conv`'s pair path without an accumulator of its own, for an output that already
    holds another term: on CUDA, with out in x's accumulation dtype (float32 / float64), the pair
    kernel adds straight into it, so the sum costs no buffer, no fill and no pass that adds the two.
    `adds_in_place` says when that is the call's fastest path. Not differentiable: raises when
    autograd would need a gradient through it (use `relational_conv` and add).

    Args:
        out: [rmap.num_out, C_out] in x's dtype on x's device, sharing no memory with x or weight.
        x, weight, rmap, groups: as `relational_conv` takes them.
    """
    if not isinstance(out, Tensor):
        raise TypeError(f"out must be a Tensor, got {type(out).__name__}")
    if torch.is_grad_enabled() and (out.requires_grad or x.requires_grad or weight.requires_grad):
        raise RuntimeError(
            "relational_conv_add_ is not differentiable: call it under torch.no_grad() or on tensors "
            "that do not require grad, or use relational_conv and add its result"
        )
    args, _ = conv_call(x, weight, rmap, groups, Dataflow.FETCH_ON_DEMAND)
    if out.dim() != 2 or out.shape[0] != rmap.num_out:
        raise ValueError(f"out must have shape [num_out = {rmap.num_out}, C_out], got {_shape(out)}")
    _conv_add(out, args.x, args.weight, args.in_index, args.out_index, args.rel_ptr, args.scale)
    return out


def adds_in_place(x: Tensor, weight: Tensor, rmap: RelationalMap, groups: int = 1) -> bool:
    """Whether `relational_conv_add_(out, x, weight, rmap, groups)` is the fastest way to add the
    sum onto a tensor: a CUDA call whose AUTO plan runs the pair kernel (not the table, whose
    epilogue writes the output itself), in x's accumulation dtype, outside a compiled region."""
    if not x.is_cuda or x.dtype not in (torch.float32, torch.float64) or torch.compiler.is_compiling():
        return False
    c_in, c_out = _channels(weight)
    dtype, table_fwd, _, _ = decide(rmap, x, Dataflow.AUTO, c_in // groups, c_out // groups, False, False)
    return dtype == x.dtype and not table_fwd


def relational_conv_weight_grad(x: Tensor, grad_out: Tensor, rmap: RelationalMap, groups: int = 1) -> Tensor:
    """`dW[r] = sum over pairs p of relation r of scale[p] * x[i]^T grad_out[o]`.

    Returns [R, groups, C_in/groups, C_out/groups] (squeeze dim 1 for groups == 1) in x's dtype.
    """
    if x.shape[0] != rmap.num_in or grad_out.shape[0] != rmap.num_out:
        raise ValueError(
            f"x rows ({x.shape[0]}) / grad_out rows ({grad_out.shape[0]}) must equal the map's "
            f"num_in ({rmap.num_in}) / num_out ({rmap.num_out})"
        )
    in_index, out_index, rel_ptr = views.kernel_pairs(rmap)
    return _weight_grad(x, grad_out, in_index, out_index, rel_ptr, _scale_for(rmap, x.dtype), groups)


def _shape(t: object) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__


# ---------------------------------------------------------------------------- fake kernels
@torch.library.register_fake("relconv::relational_conv")
def _conv_fake(
    x,
    weight,
    in_index,
    out_index,
    rel_ptr,
    scale,
    num_out,
    neighbor_table=None,
    table_order=None,
    bias=None,
    relu=False,
    transposed_table=None,
    transposed_order=None,
    sorted_tables=False,
):
    if weight.dim() not in (3, 4):
        raise ValueError(
            "weight must be 3-D [R, C_in, C_out] (groups = 1) or 4-D [R, groups, C_in/groups, "
            f"C_out/groups], got shape {tuple(weight.shape)}"
        )
    return x.new_empty((num_out, _channels(weight)[1]))


@torch.library.register_fake("relconv::relational_conv_add_")
def _conv_add_fake(out, x, weight, in_index, out_index, rel_ptr, scale):
    return None


@torch.library.register_fake("relconv::neighbor_table_order")
def _table_order_fake(table):
    return table.new_empty((table.shape[0],))


@torch.library.register_fake("relconv::table_pairs")
def _table_pairs_fake(table):
    capacity = table.shape[0] * table.shape[1]
    rel_ptr = table.new_empty((table.shape[1] + 1,), dtype=torch.int64)
    return table.new_empty((capacity,)), table.new_empty((capacity,)), rel_ptr


@torch.library.register_fake("relconv::transpose_neighbor_table")
def _transpose_table_fake(table, num_in):
    # Traced when a map's transposed table is built inside a compiled region (the CUDA input
    # gradient over it, RelationalMap.transposed_neighbor_table).
    return table.new_empty((num_in, table.shape[1]))


@torch.library.register_fake("relconv::relational_conv_weight_grad")
def _weight_grad_fake(x, grad_out, in_index, out_index, rel_ptr, scale, groups, out_dtype=None):
    r = rel_ptr.shape[0] - 1
    shape = (r, groups, x.shape[1] // groups, grad_out.shape[1] // groups)
    return x.new_empty(shape, dtype=out_dtype or x.dtype)


# Autograd and autocast of both ops are C++ kernels (csrc/dispatch/): a Python autograd function
# cost ~30 us of host time per call, and autocast must see the ops to run them in half precision.
