"""spconv 2.x peer (PyPI `spconv-cu126` + `cumm-cu126`, see benchmarks/README.md).

Coordinates: `SparseConvTensor(features, indices [N, 4] int32 (b, x, y, z), spatial_shape, batch)`
with non-negative x, y, z. Output indices of a stride-2 layer are coarse grid indices o; relconv's
coordinate of the same site is 2 o (fine units), which `keys` restores. Maps are cached in the
tensor's `indice_dict` under each layer's `indice_key`; `replace_feature` keeps that dict, so the
"cached" rows reuse it and the "fresh" rows start from a new tensor. A 3^3 stride-2 conv with
padding 1 outputs every coarse site within reach of an input (a superset of relconv's
floor(p / 2) sites); the agreement check compares relconv's sites.
"""

from __future__ import annotations

import torch

from benchmarks.harness.ops import OPS
from benchmarks.peers.layouts import to_spconv
from benchmarks.peers.minkunet import Backend

# Seen on the GPU host with spconv-cu126 2.3.8: bf16 features raise KeyError in its implicit-GEMM
# dispatch, and a bf16 training step afterwards killed the process (segfault), so bf16 is never
# handed to it.
NO_BF16 = "spconv 2.3.8 has no bf16 kernels (KeyError; training then segfaulted)"


def check_dtype(dtype: torch.dtype) -> str | None:
    """Why spconv cannot run this dtype, or None."""
    return NO_BF16 if dtype == torch.bfloat16 else None


def available() -> tuple[bool, str]:
    try:
        import spconv
        import spconv.pytorch  # noqa: F401  (loads the CUDA extension)
    except Exception as err:  # a broken binary raises OSError/RuntimeError, not only ImportError
        return False, f"not importable ({type(err).__name__}: {err})"
    return True, getattr(spconv, "__version__", "unknown")


# Grid extent is rounded up to a multiple of this (MinkUNet has 4 stride-2 levels; coordinates are
# shifted by a multiple of 16 in voxel_suite.load_scene).
GRID_MULTIPLE = 16


def spatial_shape(coords: torch.Tensor) -> list[int]:
    """Grid size per axis, rounded up to a multiple of GRID_MULTIPLE.

    spconv sizes a strided conv's output grid as (D + 2 p - k) // s + 1 and drops every output site
    outside it. With D = max + 1 and k = s = 2, p = 0 that is max // 2 whenever max is even, so the
    coarse site floor(max / 2) of the last voxels along an axis was silently lost (down2 rows could
    not be aligned: max_rel_err inf; up2 got zeros on the fine sites under the lost ones). A size
    divisible by 2^levels keeps every coarse site at every level (3^3 with padding 1 was unaffected).
    """
    m = GRID_MULTIPLE
    return [(int(v) + 1 + m - 1) // m * m for v in coords[:, 1:].max(0).values.tolist()]


def sparse_tensor(feats: torch.Tensor, coords: torch.Tensor, batch_size: int, shape: list[int] | None = None):
    """`shape`: the grid size when known (else computed here, which costs a host sync)."""
    import spconv.pytorch as spconv

    shape = shape or spatial_shape(coords)
    return spconv.SparseConvTensor(feats, coords.int().contiguous(), shape, batch_size)


def layer(op: str, cin: int, cout: int, key: str) -> torch.nn.Module:
    import spconv.pytorch as spconv

    k, s, p = OPS[op].kernel, OPS[op].stride, OPS[op].padding
    if op == "subm3":
        return spconv.SubMConv3d(cin, cout, k, padding=p, bias=False, indice_key=key)
    if op == "up2":
        return spconv.SparseInverseConv3d(cin, cout, k, indice_key=key, bias=False)
    return spconv.SparseConv3d(cin, cout, k, stride=s, padding=p, bias=False, indice_key=key)


def load_weight(module: torch.nn.Module, weight: torch.Tensor, kernel_size: tuple[int, int, int]) -> None:
    with torch.no_grad():
        module.weight.copy_(to_spconv(weight, kernel_size))


def keys(x, level_stride: int) -> torch.Tensor:
    """(b, x, y, z) of each output row in fine-grid units."""
    k = x.indices.long().clone()
    k[:, 1:] *= level_stride
    return k


class SpconvBackend(Backend):
    def __init__(self) -> None:
        import spconv.pytorch as spconv

        self.conv_types = (spconv.SubMConv3d, spconv.SparseConv3d, spconv.SparseInverseConv3d)
        self._grid_of, self._grid = None, None

    def tensor(self, feats, coords, batch_size):
        # The grid is computed once per scene, as a user who knows its extent passes it; per call it
        # was a `.tolist()` host sync inside every timed forward.
        if self._grid_of is not coords:
            self._grid_of, self._grid = coords, spatial_shape(coords)
        return sparse_tensor(feats, coords, batch_size, self._grid)

    def conv(self, cin, cout, kernel_size, stride, transposed, key):
        if transposed:
            return layer("up2", cin, cout, key)
        if stride == 1:
            import spconv.pytorch as spconv

            return spconv.SubMConv3d(
                cin, cout, kernel_size, padding=kernel_size // 2, bias=False, indice_key=key
            )
        return layer("down2", cin, cout, key)

    def run_conv(self, conv, x, target=None):
        return conv(x)  # an inverse conv finds its output sites through its indice_key

    def feats(self, x):
        return x.features

    def replace(self, x, feats):
        return x.replace_feature(feats)

    def load_conv_weight(self, conv, weight, kernel_size):
        load_weight(conv, weight, kernel_size)
