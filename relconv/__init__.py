"""relconv: sparse relational convolutions (voxel sparse conv and R-GCN) on one CUDA core.

`out[o] = sum over pairs (i, o, r) of scale * x[i] @ W[r]`; see `relconv.ops.relational_conv`.
"""

from relconv import _ext  # noqa: F401  (registers torch.ops.relconv)
from relconv.core import RelationalMap
from relconv.ops import relational_conv, relational_conv_weight_grad

__all__ = ["RelationalMap", "relational_conv", "relational_conv_weight_grad"]
__version__ = "0.1.0"
