"""The relational-convolution op family (torch.ops.relconv.*) with typed wrappers and autograd, and
the plan that decides how each call runs (`plan`)."""

from relconv._ext import direct_ok
from relconv.ops.batch_norm import batch_norm_act
from relconv.ops.dataflow import Dataflow
from relconv.ops.planning import ConvPlan, compute_dtype_for, plan, resolve_dataflow
from relconv.ops.prepared_calls import MapCalls, forgetting_ref
from relconv.ops.relational_conv import (
    ACTIVATIONS,
    ConvArgs,
    acc_dtype,
    adds_in_place,
    as_grouped_weight,
    conv_call,
    prepare,
    relational_conv,
    relational_conv_add_,
    relational_conv_weight_grad,
    run_conv,
)

__all__ = [
    "ACTIVATIONS",
    "ConvArgs",
    "ConvPlan",
    "Dataflow",
    "MapCalls",
    "acc_dtype",
    "adds_in_place",
    "as_grouped_weight",
    "batch_norm_act",
    "compute_dtype_for",
    "conv_call",
    "direct_ok",
    "forgetting_ref",
    "plan",
    "prepare",
    "relational_conv",
    "relational_conv_add_",
    "relational_conv_weight_grad",
    "resolve_dataflow",
    "run_conv",
]
