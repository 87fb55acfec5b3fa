"""The relational-convolution op family (torch.ops.relconv.*) with typed wrappers and autograd."""

from relconv.ops.batch_norm import batch_norm_act
from relconv.ops.dataflow import Dataflow, resolve_dataflow
from relconv.ops.relational_conv import (
    acc_dtype,
    as_grouped_weight,
    relational_conv,
    relational_conv_weight_grad,
)

__all__ = [
    "Dataflow",
    "acc_dtype",
    "as_grouped_weight",
    "batch_norm_act",
    "relational_conv",
    "relational_conv_weight_grad",
    "resolve_dataflow",
]
