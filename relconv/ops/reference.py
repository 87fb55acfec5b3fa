"""Pure-PyTorch reference: a Python loop over relations of gather, matmul and index_add_.

Used by the tests as the ground truth and by the benchmarks as the baseline a user would write.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relconv.core.relational_map import RelationalMap
from relconv.ops.relational_conv import acc_dtype, as_grouped_weight


def relational_conv_reference(x: Tensor, weight: Tensor, rmap: RelationalMap, groups: int = 1) -> Tensor:
    """Same contract as `relconv.ops.relational_conv`; differentiable through plain torch ops."""
    w = as_grouped_weight(weight, groups)
    r_count, g, cin_g, cout_g = w.shape
    acc = acc_dtype(x.dtype)
    out = torch.zeros(rmap.num_out, g * cout_g, dtype=acc, device=x.device)
    ptr = rmap.rel_ptr.tolist()
    for r in range(r_count):
        lo, hi = ptr[r], ptr[r + 1]
        if lo == hi:
            continue
        rows = x.index_select(0, rmap.in_index[lo:hi]).to(acc).view(hi - lo, g, cin_g)
        y = torch.einsum("ngc,gcd->ngd", rows, w[r].to(acc)).reshape(hi - lo, g * cout_g)
        if rmap.scale is not None:
            y = y * rmap.scale[lo:hi].to(acc).unsqueeze(1)
        out = out.index_add(0, rmap.out_index[lo:hi].long(), y)
    return out.to(x.dtype)
