"""spconv's point-cloud voxelisation (`spconv.pytorch.utils.PointToVoxel`) in torch ops."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relconv.spconv._missing import missing


class PointToVoxel:
    """Points -> voxels with spconv's outputs.

    Args:
        vsize_xyz: voxel size per axis (x, y, z, ...).
        coors_range_xyz: (min_x, min_y, min_z, ..., max_x, max_y, max_z, ...).
        num_point_features: F, the columns of a point (the first ndim are x, y, z, ...).
        max_num_voxels: voxels beyond this many are dropped (with their points).
        max_num_points_per_voxel: points beyond this many per voxel are dropped.
        device: where the outputs live (the input points must be on the same device type).

    A point at `p` falls in cell `floor((p - min) / vsize)` per axis (float32), points outside
    `[0, grid_size)` are skipped. Voxels are numbered in order of their first point and hold their
    points in input order, as spconv's CPU voxeliser does (its CUDA one numbers voxels in hash-table
    order: the same voxels and contents in another order).
    """

    def __init__(
        self,
        vsize_xyz: list[float],
        coors_range_xyz: list[float],
        num_point_features: int,
        max_num_voxels: int,
        max_num_points_per_voxel: int,
        device: torch.device | str = "cpu",
    ) -> None:
        ndim = len(vsize_xyz)
        if ndim < 1 or len(coors_range_xyz) != 2 * ndim:
            raise ValueError(
                f"coors_range_xyz must hold 2 * len(vsize_xyz) = {2 * ndim} values, "
                f"got {len(coors_range_xyz)}"
            )
        if min(vsize_xyz) <= 0:
            raise ValueError(f"vsize_xyz must be positive, got {list(vsize_xyz)}")
        for arg, value in (
            ("num_point_features", num_point_features),
            ("max_num_voxels", max_num_voxels),
            ("max_num_points_per_voxel", max_num_points_per_voxel),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if num_point_features < ndim:
            raise ValueError(f"num_point_features ({num_point_features}) must cover the {ndim} coordinates")
        self.ndim = ndim
        self.device = torch.device(device)
        self.num_point_features = num_point_features
        self.max_num_voxels = max_num_voxels
        self.max_num_points_per_voxel = max_num_points_per_voxel
        lo = torch.tensor(coors_range_xyz[:ndim], dtype=torch.float32)
        hi = torch.tensor(coors_range_xyz[ndim:], dtype=torch.float32)
        vsize = torch.tensor(vsize_xyz, dtype=torch.float32)
        # Grid size per axis as spconv's std::round of the float32 quotient (halves away from zero).
        grid = [int(math.floor(abs(q) + 0.5)) * (1 if q >= 0 else -1) for q in ((hi - lo) / vsize).tolist()]
        if min(grid) < 1:
            raise ValueError(
                f"coors_range_xyz spans no voxel along some axis (grid size {grid[::-1]}, z y x)"
            )
        # spconv's metadata is ordered z, y, x (the order of the output indices).
        self.vsize = vsize.tolist()[::-1]
        self.grid_size = grid[::-1]
        self.coors_range = lo.tolist()[::-1] + hi.tolist()[::-1]
        self.grid_stride = [math.prod(self.grid_size[i + 1 :]) for i in range(ndim)]
        self._lo_xyz, self._vsize_xyz, self._grid_xyz = lo, vsize, grid

    def __call__(
        self, pc: Tensor, clear_voxels: bool = True, empty_mean: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(voxels [M, max_points, F] float32, indices [M, ndim] int32 (z, y, x),
        num_points_per_voxel [M] int32)."""
        voxels, indices, num, _ = self.generate_voxel_with_id(pc, clear_voxels, empty_mean)
        return voxels, indices, num

    def generate_voxel_with_id(
        self, pc: Tensor, clear_voxels: bool = True, empty_mean: bool = False
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """As `__call__`, plus `pc_voxel_id [N]` int64: each point's voxel, -1 when dropped or outside
        (a point past `max_num_points_per_voxel` keeps its voxel's id, as in spconv).

        `empty_mean` fills a voxel's unused point slots with the mean of its points; `clear_voxels`
        is accepted (the outputs are always fresh, unused slots zero)."""
        if not isinstance(pc, Tensor) or pc.dim() != 2 or pc.shape[1] != self.num_point_features:
            shape = tuple(pc.shape) if isinstance(pc, Tensor) else type(pc).__name__
            raise ValueError(
                f"pc must be a tensor [N, num_point_features={self.num_point_features}], got {shape}"
            )
        if not pc.dtype.is_floating_point:
            raise TypeError(f"pc must be a floating-point tensor, got {pc.dtype}")
        if pc.device.type != self.device.type:
            raise ValueError(f"pc is on {pc.device} but the voxeliser was built for {self.device}")
        with torch.no_grad():
            return self._voxelize(pc.float(), empty_mean)

    def _voxelize(self, pc: Tensor, empty_mean: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        device, n, ndim = pc.device, pc.shape[0], self.ndim
        lo, vsize = self._lo_xyz.to(device), self._vsize_xyz.to(device)
        cell = torch.floor((pc[:, :ndim] - lo) / vsize).long()  # x, y, z
        grid = torch.tensor(self._grid_xyz, device=device)
        inside = ((cell >= 0) & (cell < grid)).all(1)
        zyx = cell.flip(1)
        stride = torch.tensor(self.grid_stride, dtype=torch.int64, device=device)
        key = torch.where(inside, (zyx * stride).sum(1), -1)
        point = torch.arange(n, device=device)
        keys, inverse = torch.unique(key, return_inverse=True)
        first = torch.full((keys.numel(),), n, dtype=torch.int64, device=device).scatter_reduce(
            0, inverse, point, "amin"
        )
        # The outside key (-1) sorts first; voxels are numbered by their first point.
        first = torch.where(keys < 0, n, first)
        order = torch.argsort(first, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=device)
        num_voxels = min(int((keys >= 0).sum()), self.max_num_voxels)
        voxel = rank[inverse]
        kept = inside & (voxel < num_voxels)
        voxel_id = torch.where(kept, voxel, -1)
        # Slot of a point within its voxel: its rank among the voxel's points in input order.
        by_voxel = torch.argsort(voxel * (n + 1) + point, stable=True)
        sorted_voxel = voxel[by_voxel]
        start = torch.searchsorted(sorted_voxel, sorted_voxel, right=False)
        slot = torch.empty_like(point)
        slot[by_voxel] = torch.arange(n, device=device) - start
        max_pts = self.max_num_points_per_voxel
        stored = kept & (slot < max_pts)
        voxels = pc.new_zeros(num_voxels, max_pts, pc.shape[1])
        voxels[voxel[stored], slot[stored]] = pc[stored]
        count = torch.bincount(voxel[stored], minlength=num_voxels)[:num_voxels]
        indices = torch.zeros(num_voxels, ndim, dtype=torch.int32, device=device)
        indices[voxel[kept]] = zyx[kept].int()
        if empty_mean and num_voxels:
            mean = voxels.sum(1) / count.clamp(min=1).unsqueeze(1).to(voxels.dtype)
            empty = torch.arange(max_pts, device=device)[None, :] >= count[:, None]
            voxels = torch.where(empty.unsqueeze(2), mean.unsqueeze(1), voxels)
        return (
            voxels.to(self.device),
            indices.to(self.device),
            count.int().to(self.device),
            voxel_id.to(self.device),
        )


def gather_features_by_pc_voxel_id(
    seg_res_features: Tensor, pc_voxel_id: Tensor, invalid_value: int | float = 0
) -> Tensor:
    """Per-point features from per-voxel ones: row `pc_voxel_id[i]`, `invalid_value` where it is -1."""
    pc_voxel_id = pc_voxel_id.to(seg_res_features.device)
    res = seg_res_features.new_full((pc_voxel_id.shape[0], *seg_res_features.shape[1:]), invalid_value)
    valid = pc_voxel_id != -1
    res[valid] = seg_res_features[pc_voxel_id[valid]]
    return res


def __getattr__(name: str):
    raise missing("spconv.pytorch.utils", name)
