"""The coordinate-hash and kernel-map ops (torch.ops.relconv, CUDA only) that relconv.voxel builds
its maps with; csrc/library.cpp documents each. The overloads themselves: calling through the op
packet would resolve the overload on every call."""

import torch

from relconv import _ext  # noqa: F401  (registers torch.ops.relconv)

coord_hash = torch.ops.relconv.coord_hash.default
kernel_map_table = torch.ops.relconv.kernel_map_table.default
strided_coords = torch.ops.relconv.strided_coords.default
hashed_strided_table = torch.ops.relconv.hashed_strided_table.default
hashed_submanifold_table = torch.ops.relconv.hashed_submanifold_table.default
check_coords = torch.ops.relconv.check_coords.default
