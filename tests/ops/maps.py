"""Random relational maps for the op tests."""

from __future__ import annotations

import torch

from relconv import RelationalMap


def random_map(
    num_in: int,
    num_out: int,
    num_relations: int,
    num_pairs: int,
    device: str = "cpu",
    index_dtype: torch.dtype = torch.int32,
    with_scale: bool = True,
    seed: int = 0,
    empty_relation: bool = True,
) -> RelationalMap:
    """Random pairs with repeated (out, relation) slots; relation 0 left empty when asked."""
    g = torch.Generator().manual_seed(seed)
    lo = 1 if (empty_relation and num_relations > 1) else 0
    rel = torch.randint(lo, num_relations, (num_pairs,), generator=g)
    ii = torch.randint(0, max(num_in, 1), (num_pairs,), generator=g)
    oi = torch.randint(0, max(num_out, 1), (num_pairs,), generator=g)
    scale = torch.rand(num_pairs, generator=g, dtype=torch.float64) + 0.5 if with_scale else None
    m = RelationalMap.from_triples(
        ii, oi, rel, num_in, num_out, num_relations, scale=scale, index_dtype=index_dtype
    )
    return m.to(device)


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (0 when both are zero)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    denom = b.norm().item()
    diff = (a - b).norm().item()
    return diff if denom == 0 else diff / denom


# Relative-error budgets by dtype (fp16/bf16 operands, fp32 accumulation).
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
# TF32 keeps 10 mantissa bits: a relative rounding error of 2^-11 per operand, averaging out over
# the reduction; exact fp32 stays ~1e-7.
TF32_TOLERANCE = 5e-3
