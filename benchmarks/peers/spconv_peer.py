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

from typing import TYPE_CHECKING

import torch

from benchmarks.harness import prepare
from benchmarks.harness.bench import Prepared, Unsupported
from benchmarks.harness.floor import DTYPES
from benchmarks.harness.ops import OPS
from benchmarks.peers.base import VoxelPeer
from benchmarks.peers.layouts import to_spconv
from benchmarks.peers.minkunet import Backend, skeleton_case

if TYPE_CHECKING:
    from benchmarks.harness.voxel_setup import E2ESetup, LayerSetup

# Seen on the GPU host with spconv-cu126 2.3.8: bf16 features raise KeyError in its implicit-GEMM
# dispatch, and a bf16 training step afterwards killed the process (segfault), so bf16 is never
# handed to it.
NO_BF16 = "spconv 2.3.8 has no bf16 kernels (KeyError; training then segfaulted)"


# spconv.pytorch.conv: a strided conv whose indice_key is already in its input's indice_dict fails
# ("only support reuse subm indices"); its map is kept only for the matching inverse conv, so a
# strided layer builds its map on every call: its "fresh" row is what a spconv user gets.
STRIDED_REBUILDS = "spconv reuses a strided conv's map only in its inverse conv (see the fresh row)"


def check_dtype(dtype: torch.dtype) -> str | None:
    """Why spconv cannot run this dtype, or None."""
    return NO_BF16 if dtype == torch.bfloat16 else None


def on_cpu_without_cuda() -> None:
    """Lets the real spconv 2.3 train on the CPU of a CPU-only torch: its CPU backward asks torch for
    the current CUDA stream, which such a torch cannot give; its CPU kernels ignore the stream, so
    they get 0. Its CPU kernels also race under several OpenMP threads (outputs differed by up to 15%
    between runs on two threads, and were bitwise repeatable on one): run them with
    OMP_NUM_THREADS=1, which this checks, as spconv reads it when it loads."""
    import os
    import sys

    if os.environ.get("OMP_NUM_THREADS") != "1":
        raise RuntimeError("spconv's CPU kernels race under several OpenMP threads: set OMP_NUM_THREADS=1")
    import spconv.pytorch  # noqa: F401  (loads the modules patched below)

    cppcore, ops = sys.modules["spconv.pytorch.cppcore"], sys.modules["spconv.pytorch.ops"]
    cppcore.get_current_stream = ops.get_current_stream = lambda: 0


def available() -> tuple[bool, str]:
    try:
        import spconv
        import spconv.pytorch  # noqa: F401  (loads the CUDA extension)
    except Exception as err:  # a broken binary raises OSError/RuntimeError, not only ImportError
        return False, f"not importable ({type(err).__name__}: {err})"
    return True, getattr(spconv, "__version__", "unknown")


# Grid extent is rounded up to a multiple of this (MinkUNet has 4 stride-2 levels; coordinates are
# shifted by a multiple of 16 in benchmarks/workloads/voxels.py).
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


def layer_case(setup: LayerSetup) -> Prepared:
    """One layer as a spconv user runs it: an `indice_key`ed layer, maps reused through the tensors."""
    spec, scene, c = setup.spec, setup.scene, setup.spec["C"]
    device, dtype = setup.device, setup.dtype
    if why := check_dtype(dtype):
        raise Unsupported(why)
    if spec["map"] == "cached" and spec["op"] in ("down2", "down3"):
        raise Unsupported(STRIDED_REBUILDS)
    train = prepare.training(spec)
    conv = layer(spec["op"], c, c, key="k").to(device, dtype).train(train)
    load_weight(conv, setup.weight.to(device, dtype), setup.kernel_size)
    if OPS[spec["op"]].transposed:
        if spec["map"] == "fresh":
            raise Unsupported("an inverse conv reuses its strided conv's map (no fresh build)")
        down = layer("down2", c, c, key="k").to(device, dtype).train(train)
        zeros = torch.zeros(len(scene.coords), c, device=device, dtype=dtype)
        with torch.no_grad():
            coarse = down(sparse_tensor(zeros, scene.coords, scene.batch_size))
        inputs = [prepare.reorder(f, setup.in_coords.long(), keys(coarse, 2)) for f in setup.inputs]

        def make_input(f):
            return coarse.replace_feature(f)

        out_stride = 1
    else:
        # The grid size is computed once, as a user who knows the scene's extent passes it; per
        # call it was a `.tolist()` host sync inside the timed "fresh" region.
        shape = spatial_shape(scene.coords)
        base = sparse_tensor(setup.inputs[0], scene.coords, scene.batch_size, shape)
        inputs = setup.inputs
        out_stride = OPS[spec["op"]].stride

        def make_input(f):
            if spec["map"] == "cached":
                return base.replace_feature(f)
            return sparse_tensor(f, scene.coords, scene.batch_size, shape)

    with torch.no_grad():
        first = conv(make_input(inputs[0]))
    if spec["map"] == "cached" and spec["op"] == "subm3":
        # spconv keeps a layer's map in its OUTPUT tensor's indice_dict; an input tensor never
        # sees it, so `base.replace_feature(f)` alone rebuilt the map on every "cached" call
        # (measured on the GPU host: 19 launches and 3 syncs per call instead of 1 launch). A
        # spconv network reuses maps by passing each layer's output on; sharing the dict is that.
        base.indice_dict.update(first.indice_dict)
    upstream = prepare.features(first.features.shape[0], c, dtype, device, seed=2, count=1)[0]
    fn, held = prepare.layer_fn(
        spec, lambda f: conv(make_input(f)).features, [conv.weight], inputs, upstream, device
    )

    def output():
        with torch.no_grad(), prepare.precision(spec["dtype"], device):
            out = conv(make_input(inputs[0]))
        return keys(out, out_stride), out.features.float()

    note = "padding 1: outputs every coarse site in reach" if spec["op"] == "down3" else ""
    return Prepared(fn=fn, inputs=inputs, output=output, note=note, held=held)


def e2e_case(setup: E2ESetup) -> Prepared:
    """relconv's MinkUNet rebuilt on spconv layers (peers/minkunet.py)."""
    if why := check_dtype(DTYPES[setup.spec["dtype"]]):
        raise Unsupported(why)
    return skeleton_case(setup, SpconvBackend())


PEER = VoxelPeer("spconv", available, layer_case, e2e_case)
