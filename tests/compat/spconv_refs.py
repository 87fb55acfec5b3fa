"""Dense references for the relconv.spconv tests: random sites, densify, dense conv at the sites."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import relconv.spconv as spconv


def random_sites(shape, batch_size, n, seed=0, device="cpu"):
    """[n', ndim + 1] int32 unique (batch, d0, ..) inside `shape` (n' <= n)."""
    g = torch.Generator().manual_seed(seed)
    cols = [torch.randint(0, batch_size, (n,), generator=g)]
    cols += [torch.randint(0, s, (n,), generator=g) for s in shape]
    idx = torch.unique(torch.stack(cols, 1), dim=0)
    idx = idx[torch.randperm(idx.shape[0], generator=g)]  # spconv takes sites in any order
    return idx.int().to(device)


def random_tensor(shape, batch_size, n, channels, seed=0, device="cpu", dtype=torch.float32):
    idx = random_sites(shape, batch_size, n, seed, device)
    g = torch.Generator().manual_seed(seed + 1)
    feats = torch.randn(idx.shape[0], channels, generator=g).to(device=device, dtype=dtype)
    return spconv.SparseConvTensor(feats, idx, shape, batch_size)


def densify(features, indices, shape, batch_size):
    """Dense [B, C, *shape] built independently of SparseConvTensor.dense (differentiable)."""
    out = features.new_zeros(batch_size, *shape, features.shape[1])
    out = out.index_put(tuple(indices.long().t()), features)
    return out.movedim(-1, 1)


def occupancy(indices, shape, batch_size, dtype=torch.float64):
    ones = torch.ones(indices.shape[0], 1, dtype=dtype, device=indices.device)
    return densify(ones, indices, shape, batch_size)


def at_sites(dense, indices):
    """Rows [M, C] of dense [B, C, *shape] at indices [M, ndim + 1]."""
    return dense.movedim(1, -1)[tuple(indices.long().t())]


def site_set(indices):
    return {tuple(r) for r in indices.tolist()}


def dense_weight(weight):
    """spconv [C_out, *K, C_in] -> torch conv [C_out, C_in, *K]."""
    return weight.movedim(-1, 1)


def dense_transposed_weight(weight):
    """spconv [C_out, *K, C_in] -> torch conv_transpose [C_in, C_out, *K]."""
    return weight.movedim(-1, 0)


def conv_nd(ndim):
    return F.conv3d if ndim == 3 else F.conv2d


def conv_transpose_nd(ndim):
    return F.conv_transpose3d if ndim == 3 else F.conv_transpose2d
