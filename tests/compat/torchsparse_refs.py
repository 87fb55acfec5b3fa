"""References for the relconv.torchsparse tests, written from TorchSparse 2.1's documented behaviour:
random scenes, TorchSparse's offset index, dense convolutions over densified inputs, and the output
sites of a strided conv by brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
import torch.nn.functional as F

import relconv.torchsparse as torchsparse


def scene(n: int = 60, grid: int = 9, batch: int = 2, channels: int = 3, seed: int = 0, device: str = "cpu"):
    """A SparseTensor of unique random (batch, x, y, z) sites in [0, grid)^3 with float64 features."""
    g = torch.Generator().manual_seed(seed)
    coords = torch.cat(
        [torch.randint(0, batch, (n, 1), generator=g), torch.randint(0, grid, (n, 3), generator=g)], 1
    )
    coords = torch.unique(coords, dim=0).int()
    feats = torch.randn(coords.shape[0], channels, generator=g, dtype=torch.float64)
    return torchsparse.SparseTensor(feats.to(device), coords.to(device))


def ts_index(digits: tuple[int, int, int], kernel_size: tuple[int, int, int]) -> int:
    """TorchSparse's flat offset index of per-axis digits (x fastest for an odd volume)."""
    (dx, dy, dz), (kx, ky, kz) = digits, kernel_size
    if math.prod(kernel_size) % 2:
        return dx + kx * (dy + ky * dz)
    return (dx * ky + dy) * kz + dz


def dense_weight(kernel: torch.Tensor, kernel_size) -> torch.Tensor:
    """TorchSparse `kernel [K, C_in, C_out]` -> torch weight [C_out, C_in, kx, ky, kz] (digit d = tap d)."""
    k = kernel.reshape(-1, *kernel.shape[-2:])
    w = k.new_zeros(k.shape[2], k.shape[1], *kernel_size)
    for d in itertools.product(*(range(s) for s in kernel_size)):
        w[(slice(None), slice(None), *d)] = k[ts_index(d, kernel_size)].t()
    return w


def densify(feats: torch.Tensor, coords: torch.Tensor, batch: int, grid: int) -> torch.Tensor:
    out = feats.new_zeros(batch, feats.shape[1], grid, grid, grid)
    c = coords.long()
    out[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]] = feats
    return out


def dense_conv(x, kernel, kernel_size, stride, lows, out_coords, batch, grid):
    """out[o] = sum_d x[o * s + lo + d] @ kernel[index(d)], read at `out_coords` (TorchSparse units)."""
    dense = densify(x.feats, x.coords, batch, grid)
    pad = []
    for lo, k in zip(reversed(lows), reversed(kernel_size), strict=True):
        pad += [-lo, k + 2]
    y = F.conv3d(F.pad(dense, pad), dense_weight(kernel, kernel_size), stride=stride)
    o = out_coords.long()
    return y[o[:, 0], :, o[:, 1], o[:, 2], o[:, 3]]


def dense_transposed(x, kernel, kernel_size, stride, lows, out_coords, batch, grid):
    """out[p] = sum over (o, d) with p = o * s + lo + d of x[o] @ kernel[index(d)], read at `out_coords`."""
    dense = densify(x.feats, x.coords, batch, grid)
    y = F.conv_transpose3d(dense, dense_weight(kernel, kernel_size).transpose(0, 1), stride=stride)
    y = y[:, :, -lows[0] :, -lows[1] :, -lows[2] :]  # site p sits at index p - lo
    o = out_coords.long()
    return y[o[:, 0], :, o[:, 1], o[:, 2], o[:, 3]]


def strided_sites(coords, kernel_size, stride, padding, spatial_range=None) -> torch.Tensor:
    """TorchSparse 2.1's output sites of a strided conv by brute force, sorted by (b, x, y, z)."""
    c = coords.cpu().numpy().astype(np.int64)
    if spatial_range is None:
        hi = [(int(c[:, a + 1].max()) + 2 * padding[a] - (kernel_size[a] - 1)) // stride[a] for a in range(3)]
    else:
        hi = [
            (spatial_range[a + 1] + 2 * padding[a] - (kernel_size[a] - 1) - 1) // stride[a] for a in range(3)
        ]
    sites = set()
    for row in c:
        for d in itertools.product(*(range(k) for k in kernel_size)):
            o = []
            for a in range(3):
                q = row[a + 1] + padding[a] - d[a]
                if q % stride[a] or not 0 <= q // stride[a] <= hi[a]:
                    break
                o.append(q // stride[a])
            else:
                sites.add((int(row[0]), *o))
    return torch.tensor(sorted(sites), dtype=torch.int32).reshape(-1, 4)
