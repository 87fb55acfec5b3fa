"""Dense `conv3d` / `conv_transpose3d` references for sparse voxel convs on small grids."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from relconv.voxel import VoxelTensor, kernel_offsets


def random_voxels(
    n: int, size: int, channels: int, batch: int = 1, seed: int = 0, dtype=torch.float64, stride: int = 1
) -> VoxelTensor:
    """Up to `n` distinct voxels in [0, size)^3 * stride per sample, sorted, random features."""
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, batch, (n,), generator=g)
    xyz = torch.randint(0, size, (n, 3), generator=g) * stride
    coords = torch.unique(torch.cat([b[:, None], xyz], 1), dim=0).int()
    feats = torch.randn(coords.shape[0], channels, generator=g, dtype=dtype)
    return VoxelTensor(feats, coords, stride)


def dense_weight(weight: Tensor, kernel: tuple[int, int, int], groups: int, transposed: bool) -> Tensor:
    """[K, C_in, C_out] or [K, G, C_in/G, C_out/G] -> conv3d [C_out, C_in/G, k..] or
    conv_transpose3d [C_in, C_out/G, k..] weight (differentiable)."""
    w = weight.unsqueeze(1) if weight.dim() == 3 else weight
    k_vol, g, ci, co = w.shape
    if transposed:
        return w.permute(1, 2, 3, 0).reshape(g * ci, co, *kernel)
    return w.permute(1, 3, 2, 0).reshape(g * co, ci, *kernel)


def low_pad(kernel: tuple[int, int, int], dilation: tuple[int, int, int]) -> list[int]:
    """Per-axis reach below the output site: (k-1)/2 * d for odd k, 0 for even k."""
    return [(k // 2) * d if k % 2 else 0 for k, d in zip(kernel, dilation, strict=True)]


def gather(dense: Tensor, coords: Tensor, shift: list[int], step: tuple[int, int, int]) -> Tensor:
    """Rows `dense[b, :, (p + shift) / step]` for coords (b, p) -> [N, C]."""
    c = coords.long()
    idx = [(c[:, a + 1] + shift[a]) // step[a] for a in range(3)]
    return dense[c[:, 0], :, idx[0], idx[1], idx[2]]


def dense_conv(
    x: VoxelTensor,
    weight: Tensor,
    out_coords: Tensor,
    size: int,
    batch: int,
    kernel,
    stride,
    dilation,
    groups,
) -> Tensor:
    """Reference of a forward (submanifold or strided) sparse conv at `out_coords` (stride-1 input)."""
    dense = x.dense(spatial_shape=(size,) * 3, batch_size=batch)
    low = low_pad(kernel, dilation)
    high = [(k - 1) * d + s for k, d, s in zip(kernel, dilation, stride, strict=True)]
    pads = []
    for a in (2, 1, 0):
        pads += [low[a], high[a]]
    out = F.conv3d(
        F.pad(dense, pads),
        dense_weight(weight, kernel, groups, False),
        stride=stride,
        dilation=dilation,
        groups=groups,
    )
    return gather(out, out_coords, [0, 0, 0], stride)


def dense_conv_transpose(
    y: VoxelTensor,
    weight: Tensor,
    out_coords: Tensor,
    coarse_size: int,
    batch: int,
    kernel,
    stride,
    dilation,
    groups,
) -> Tensor:
    """Reference of a transposed sparse conv from `y` (tensor stride = stride) at `out_coords`."""
    dense = y.dense(spatial_shape=(coarse_size + 1,) * 3, batch_size=batch)
    out = F.conv_transpose3d(
        dense, dense_weight(weight, kernel, groups, True), stride=stride, dilation=dilation, groups=groups
    )
    return gather(out, out_coords, low_pad(kernel, dilation), (1, 1, 1))


def brute_force(in_coords, out_coords, kernel, step):
    """Set of (in, out, k) with in_coords[in] == out_coords[out] + offset_k * step, by full search."""
    offs = kernel_offsets(kernel) * torch.tensor(step)
    ic, oc = in_coords.long(), out_coords.long()
    triples = set()
    for k, off in enumerate(offs):
        target = oc.clone()
        target[:, 1:] += off
        eq = (ic[:, None, :] == target[None, :, :]).all(-1)
        for i, o in eq.nonzero().tolist():
            triples.add((i, o, k))
    return triples


def as_triples(rmap):
    rel = rmap.relation_of_pairs().tolist()
    return set(zip(rmap.in_index.tolist(), rmap.out_index.tolist(), rel, strict=True))


def fused_table_layer(rmap, dtype: torch.dtype, groups: int, cin: int, cout: int):
    """A grouped layer with bias and ReLU run straight on the op over `rmap`'s neighbour table:
    (run(order) -> output in `dtype`, with `order` a table_order or None; the float64 reference)."""
    from relconv.ops.reference import relational_conv_reference

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rmap.num_in, cin, generator=gen).to("cuda", dtype)
    w = torch.randn(27, groups, cin // groups, cout // groups, generator=gen) / (27 * cin) ** 0.5
    w = w.to("cuda", dtype)
    bias = (torch.randn(cout, generator=gen) / 4).to("cuda", dtype)
    table = rmap.neighbor_table()
    none = torch.empty(0, dtype=table.dtype, device="cuda")
    ptr = torch.empty(0, dtype=torch.int64, device="cuda")

    def run(order):
        op = torch.ops.relconv.relational_conv.default
        return op(x, w, none, none, ptr, None, rmap.num_out, table, order, bias, True)

    ref = (relational_conv_reference(x.double(), w.double(), rmap, groups) + bias.double()).relu()
    return run, ref
