"""spconv's output sites and kernel maps for regular (strided) and transposed sparse convolution.

spconv's regular conv outputs every position `o` of the dense conv's output grid
`[0, (n + 2p - d(k-1) - 1) // s + 1)` that some active input reaches: `i = o*s - p + r*d` for a kernel
index `r` in `0..k-1` per axis. Its transposed conv outputs every `o = i*s - p + r*d` inside
`[0, (n-1)*s - 2p + k + output_padding)`. Both sets differ from relconv's native strided map (which
outputs `floor(p/s)*s`), so they are built here from torch ops: all `K x N` candidates at once, the
valid ones packed into int64 keys over the known grid, `torch.unique` for the new sites. A pair's
relation is the kernel index flattened with the first axis slowest, spconv's weight order.

Host synchronisations: two per map (the number of valid candidates, read together with the check
that every input lies inside the grid, and the number of new sites inside `torch.unique`); spconv
reads the size of a new coordinate set too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relconv.core import RelationalMap

_INT32_MAX = 2**31 - 1


def conv_output_size(shape: list[int], k: list[int], s: list[int], p: list[int], d: list[int]) -> list[int]:
    """spconv's (and dense conv's) output grid of a regular sparse conv."""
    return [
        (n + 2 * pp - dd * (kk - 1) - 1) // ss + 1
        for n, kk, ss, pp, dd in zip(shape, k, s, p, d, strict=True)
    ]


def deconv_output_size(
    shape: list[int], k: list[int], s: list[int], p: list[int], output_padding: list[int]
) -> list[int]:
    """spconv's output grid of a transposed sparse conv (dilation does not enter spconv's formula)."""
    return [
        (n - 1) * ss - 2 * pp + kk + op
        for n, kk, ss, pp, op in zip(shape, k, s, p, output_padding, strict=True)
    ]


def kernel_index_grid(kernel_size: list[int], device: torch.device) -> Tensor:
    """[K, 3] int64 kernel indices (r0, r1, r2), first axis slowest: spconv's weight order."""
    axes = [torch.arange(k, dtype=torch.int64, device=device) for k in kernel_size]
    grid = torch.meshgrid(*axes, indexing="ij")
    return torch.stack([g.reshape(-1) for g in grid], 1)


def _index_dtype(*sizes: int) -> torch.dtype:
    return torch.int32 if max(sizes, default=0) <= _INT32_MAX else torch.int64


def build_map(
    coords: Tensor,
    batch_size: int,
    in_shape: list[int],
    out_shape: list[int],
    kernel: Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
) -> tuple[RelationalMap, Tensor]:
    """The map and output sites of a regular (`transposed=False`) or transposed conv.

    Args:
        coords: [N, 4] int32 (batch, d0, d1, d2) inside `in_shape` (3 axes; 2-D grids pass 1 and 0
            for the third axis).
        kernel: `kernel_index_grid(kernel_size)`, [K, 3].
    Returns:
        (map with num_in = N, num_out = M, K relations, injective; out_coords [M, 4] int32 sorted by
        (batch, d0, d1, d2)).
    Raises:
        ValueError when an index lies outside `spatial_shape` or its batch outside `batch_size`.
    """
    device = coords.device
    num_in, num_rel = coords.shape[0], kernel.shape[0]
    c = coords[:, 1:].long()
    b = coords[:, 0].long()
    s = torch.tensor(stride, dtype=torch.int64, device=device)
    p = torch.tensor(padding, dtype=torch.int64, device=device)
    d = torch.tensor(dilation, dtype=torch.int64, device=device)
    out_hi = torch.tensor(out_shape, dtype=torch.int64, device=device)
    in_hi = torch.tensor(in_shape, dtype=torch.int64, device=device)
    reach = kernel * d  # [K, 3]
    if transposed:
        o = (c * s - p)[None] + reach[:, None]  # [K, N, 3]
        valid = ((o >= 0) & (o < out_hi)).all(2)
    else:
        num = (c + p)[None] - reach[:, None]
        o = torch.div(num, s, rounding_mode="floor")
        valid = ((num - o * s == 0) & (o >= 0) & (o < out_hi)).all(2)
    outside = ((c < 0) | (c >= in_hi)).any(1) | (b < 0) | (b >= batch_size)
    count, bad = torch.stack([valid.sum(), outside.any().long()]).tolist()
    if bad:
        raise ValueError(
            f"indices must lie inside spatial_shape {in_shape} (2-D grids: a third axis of 1) with batch "
            f"indices in [0, {batch_size}); some row does not"
        )
    keys = ((b[None] * out_hi[0] + o[..., 0]) * out_hi[1] + o[..., 1]) * out_hi[2] + o[..., 2]
    pos = torch.nonzero_static(valid.reshape(-1), size=count).squeeze(1)
    rel = torch.div(pos, num_in, rounding_mode="floor") if num_in else pos
    inp = pos - rel * num_in
    out_keys, out_row = torch.unique(keys.reshape(-1)[pos], sorted=True, return_inverse=True)
    num_out = out_keys.numel()
    rel_ptr = torch.zeros(num_rel + 1, dtype=torch.int64, device=device)
    torch.cumsum(torch.bincount(rel, minlength=num_rel), 0, out=rel_ptr[1:])
    idt = _index_dtype(num_in, num_out, count)
    # One input meets one output per kernel index and back (o and i determine each other): injective.
    rmap = RelationalMap(
        inp.to(idt), out_row.to(idt), rel_ptr, num_in, num_out, injective=True, validate=False
    )
    return rmap, _unpack(out_keys, out_shape)


def _unpack(keys: Tensor, shape: list[int]) -> Tensor:
    cols = []
    rest = keys
    for n in reversed(shape):
        cols.append(rest % n)
        rest = torch.div(rest, n, rounding_mode="floor")
    cols.append(rest)
    return torch.stack(cols[::-1], 1).to(torch.int32)
