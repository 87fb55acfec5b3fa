"""BatchNorm (+ReLU) over voxel features: one relconv op on CUDA, torch's own BatchNorm elsewhere."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from relconv._ext import _C, call_op

_batch_norm = torch.ops.relconv.batch_norm_act.default

_FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def batch_norm_act(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    training: bool,
    momentum: float = 0.1,
    eps: float = 1e-5,
    relu: bool = False,
    num_batches_tracked: Tensor | None = None,
) -> Tensor:
    """`relu?(torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, training,
    momentum, eps))` for voxel features.

    Args:
        x: [N, C] features (float32/float64/float16/bfloat16); statistics are per channel over the
            N rows.
        weight, bias: optional [C] affine parameters.
        running_mean, running_var: optional [C] running statistics, updated in place when
            `training` (the variance unbiased, as torch does); required when not `training`.
            The parameters and statistics share one dtype: x's, or float32 for float16/bfloat16 x.
        training: normalise with the batch statistics (True) or the running ones (False).
        momentum: weight of the batch statistics in the running-statistics update.
        eps: added to the variance.
        relu: apply max(0, .) to the output.
        num_batches_tracked: optional int64 one-element counter (torch's BatchNorm buffer),
            incremented in place when `training`; on CUDA inside the statistics kernel.

    Returns:
        [N, C] in x's dtype. On CUDA this is one relconv op (a C++ autograd node, two kernels per
        training forward and backward, no host sync; the statistics and the backward's sums are
        reduced in a fixed order, so results are bitwise reproducible); elsewhere torch's own
        batch_norm (+ relu). Differentiable in x, weight and bias, once (a double backward raises).
        Under autocast it runs in x's dtype, as torch's BatchNorm does.
    """
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor [N, C], got {_describe(x)}")
    if not isinstance(momentum, (int, float)) or isinstance(momentum, bool):
        raise TypeError(f"momentum must be a float, got {type(momentum).__name__}")
    if num_batches_tracked is not None and not (
        isinstance(num_batches_tracked, Tensor)
        and num_batches_tracked.dtype == torch.int64
        and num_batches_tracked.numel() == 1
    ):
        got = _describe(num_batches_tracked)
        raise ValueError(f"num_batches_tracked must be an int64 tensor of one element, got {got}")
    if training and x.shape[0] == 1:
        # Checked before the op too, with torch's message, so this common mistake raises from Python.
        raise ValueError(
            f"Expected more than 1 value per channel when training, got input size {tuple(x.shape)}"
        )
    if x.is_cuda and x.dtype in _FLOATING:
        # The op checks the rest (ValueError naming the argument).
        x = x if x.is_contiguous() else x.contiguous()
        args = (
            x,
            weight,
            bias,
            running_mean,
            running_var,
            training,
            momentum,
            eps,
            relu,
            num_batches_tracked,
        )
        return call_op(_C.batch_norm_act, _batch_norm, args, (x, weight, bias))[0]
    _check_params(x, weight, bias, running_mean, running_var, training=training)
    if num_batches_tracked is not None:
        if num_batches_tracked.device != x.device:  # the op's device check, for the torch fallback
            raise ValueError(
                f"num_batches_tracked must be on {x.device} like x, got {num_batches_tracked.device}"
            )
        if training:
            num_batches_tracked.add_(1)
    out = F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    return F.relu(out) if relu else out


def _check_params(x: Tensor, *params: Tensor | None, training: bool) -> None:
    """The checks the op makes, for the torch fallback (whose own errors are RuntimeErrors)."""
    names = ("weight", "bias", "running_mean", "running_var")
    for name, p in zip(names, params, strict=True):
        if p is None:
            continue
        if not isinstance(p, Tensor):
            raise TypeError(f"{name} must be a Tensor or None, got {type(p).__name__}")
        if p.dim() != 1 or p.shape[0] != x.shape[1]:
            raise ValueError(f"{name} must have shape [C] = [{x.shape[1]}], got shape {tuple(p.shape)}")
        if p.device != x.device:
            raise ValueError(f"{name} must be on {x.device} like x, got {p.device}")
    running_mean, running_var = params[2], params[3]
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean and running_var must be given together")
    if not training and running_mean is None:
        raise ValueError("running_mean and running_var are required when training=False")


def _describe(t: object) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _param_dtype(x: Tensor, *params: Tensor | None) -> torch.dtype:
    """The dtype of the given parameters (they share one), x's accumulation dtype when none is."""
    return next((p.dtype for p in params if p is not None), _acc_dtype(x.dtype))


# ---------------------------------------------------------------------------- fake kernels
@torch.library.register_fake("relconv::batch_norm_act")
def _batch_norm_fake(
    x, weight, bias, running_mean, running_var, training, momentum, eps, relu=False, num_batches_tracked=None
):
    saved = x.shape[1] if training else 0
    acc = _acc_dtype(x.dtype)
    return x.new_empty(x.shape), x.new_empty((saved,), dtype=acc), x.new_empty((saved,), dtype=acc)


@torch.library.register_fake("relconv::batch_norm_act_backward")
def _batch_norm_backward_fake(
    grad_out,
    x,
    weight,
    bias,
    running_mean,
    running_var,
    save_mean,
    save_invstd,
    training,
    eps,
    relu,
    output_mask,
):
    param = _param_dtype(x, weight, bias, running_mean, running_var)
    c = x.shape[1]
    grad_x = x.new_empty(x.shape if output_mask[0] else (0,))
    grad_w = x.new_empty((c if output_mask[1] else 0,), dtype=param)
    grad_b = x.new_empty((c if output_mask[2] else 0,), dtype=param)
    return grad_x, grad_w, grad_b


# The op's autograd is a C++ node (csrc/dispatch/batch_norm_autograd.cpp). It needs no autocast
# kernel: batch_norm is on none of autocast's lists, so torch's BatchNorm runs in x's dtype under
# autocast, and a custom op without an autocast kernel falls through autocast unchanged - the same.
