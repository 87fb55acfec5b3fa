"""Output sites and kernel maps of a dense conv's geometry on a bounded grid, for regular (strided)
and transposed sparse convolution: spconv's layers (`relconv.spconv`) and TorchSparse's strided
convs (`relconv.torchsparse`) place their sites so.

A regular conv outputs every position `o` of the dense conv's output grid
`[0, (n + 2p - d(k-1) - 1) // s + 1)` that some active input reaches: `i = o*s - p + r*d` for a kernel
index `r` in `0..k-1` per axis. A transposed conv outputs every `o = i*s - p + r*d` inside
`[0, (n-1)*s - 2p + k + output_padding)` (spconv's formula). Both sets differ from relconv's native
strided map (which outputs `floor(p/s)*s`). New sites come sorted by (batch, d0, d1, d2); a pair's
relation is the kernel index flattened with the first axis slowest, spconv's weight order.

On CUDA one op builds the map (`relconv::grid_conv_map`: the candidates deduplicated in a hash set,
the distinct sites sorted, the neighbour table looked up in a hash of the inputs) with one host
synchronisation, the site count read together with the coordinate checks, as spconv reads the size
of a new coordinate set; the map is that table. Elsewhere (and past the op's int32 limits) torch ops
build the pair lists: all `K x N` candidates at once, packed into int64 keys over the known grid,
`torch.unique` for the new sites, two host synchronisations.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relconv._ext import _C  # noqa: F401  (registers torch.ops.relconv)
from relconv.core import RelationalMap, index_dtype_for

_INT32_MAX = 2**31 - 1
_GRID_CONV_MAP = torch.ops.relconv.grid_conv_map.default


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


def build_map(
    coords: Tensor,
    batch_size: int,
    in_shape: list[int],
    out_shape: list[int],
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
) -> tuple[RelationalMap, Tensor]:
    """The map and output sites of a regular (`transposed=False`) or transposed conv.

    Args:
        coords: [N, 4] int32 (batch, d0, d1, d2) inside `in_shape` (3 axes; 2-D grids pass 1 and 0
            for the third axis, and a kernel size of 1 there).
    Returns:
        (map with num_in = N, num_out = M, prod(kernel_size) relations, injective; out_coords
        [M, 4] int32 sorted by (batch, d0, d1, d2)).
    Raises:
        ValueError when an index lies outside `spatial_shape` or its batch outside `batch_size`.
    """
    device = coords.device
    num_in, num_rel = coords.shape[0], math.prod(kernel_size)
    if _grid_op_takes(coords, batch_size, out_shape, num_rel):
        out_coords, table = _GRID_CONV_MAP(
            coords, batch_size, in_shape, out_shape, kernel_size, stride, padding, dilation, transposed
        )
        return RelationalMap.from_neighbor_table(table, num_in, validate=False, injective=True), out_coords
    c = coords.long()
    keys = c[:, 0]
    valid = None
    outside = (keys < 0) | (keys >= batch_size)
    # Per axis the output coordinate depends only on (kernel index, input coordinate): [k_a, N]
    # tensors, broadcast into the [k0, k1, k2, N] candidates (first kernel axis slowest).
    for a in range(3):
        ca = c[:, a + 1]
        outside |= (ca < 0) | (ca >= in_shape[a])
        reach = torch.arange(kernel_size[a], device=device)[:, None] * dilation[a]
        if transposed:
            o = (ca * stride[a] - padding[a])[None] + reach
            ok = (o >= 0) & (o < out_shape[a])
        else:
            num = (ca + padding[a])[None] - reach
            o = torch.div(num, stride[a], rounding_mode="floor")
            ok = (num == o * stride[a]) & (o >= 0) & (o < out_shape[a])
        view = [1, 1, 1, num_in]
        view[a] = kernel_size[a]
        keys = keys * out_shape[a] + o.view(view)
        valid = ok.view(view) if valid is None else valid & ok.view(view)
    count, bad = torch.stack([valid.sum(), outside.any().long()]).tolist()
    if bad:
        raise ValueError(
            f"indices must lie inside spatial_shape {in_shape} (2-D grids: a third axis of 1) with batch "
            f"indices in [0, {batch_size}); some row does not"
        )
    pos = torch.nonzero_static(valid.reshape(-1), size=count).squeeze(1)
    rel = torch.div(pos, num_in, rounding_mode="floor") if num_in else pos
    inp = pos - rel * num_in
    out_keys, out_row = torch.unique(keys.reshape(-1)[pos], sorted=True, return_inverse=True)
    num_out = out_keys.numel()
    rel_ptr = torch.zeros(num_rel + 1, dtype=torch.int64, device=device)
    torch.cumsum(torch.bincount(rel, minlength=num_rel), 0, out=rel_ptr[1:])
    idt = index_dtype_for(num_in, num_out, count)
    # One input meets one output per kernel index and back (o and i determine each other): injective.
    rmap = RelationalMap(
        inp.to(idt), out_row.to(idt), rel_ptr, num_in, num_out, injective=True, validate=False
    )
    return rmap, _unpack(out_keys, out_shape)


def _grid_op_takes(coords: Tensor, batch_size: int, out_shape: list[int], num_rel: int) -> bool:
    """Whether relconv::grid_conv_map builds this map: CUDA int32 coordinates, an int32 table, keys
    within 62 bits."""
    return (
        coords.is_cuda
        and coords.dtype == torch.int32
        and num_rel <= 4096
        and coords.shape[0] * num_rel * num_rel <= _INT32_MAX
        and batch_size * math.prod(out_shape) < 2**62
    )


def _unpack(keys: Tensor, shape: list[int]) -> Tensor:
    cols = []
    rest = keys
    for n in reversed(shape):
        cols.append(rest % n)
        rest = torch.div(rest, n, rounding_mode="floor")
    cols.append(rest)
    return torch.stack(cols[::-1], 1).to(torch.int32)
