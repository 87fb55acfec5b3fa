"""WarpConvNet peer (PyPI sdist built with CUDA by benchmarks/peers/build_warpconvnet.sh).

Coordinates: `Voxels(coords [N, 3] int32, feats [N, C], offsets [B + 1], tensor_stride=s)` with
rows grouped by batch (relconv's voxelize sorts by (b, x, y, z), which satisfies that). A stride-2
layer outputs floor(p / 2) in coarse units with tensor_stride 2; `keys` scales back to fine units.
Kernel maps are cached in the input's `_cache` (carried by `replace_features`), so "cached" rows
reuse one tensor's cache and "fresh" rows build new Voxels. A transposed conv is given the fine
tensor whose sites it must produce (`output_spatially_sparse_tensor`). WarpConvNet picks its GEMM
algorithm by benchmarking on first use; that happens in the (untimed) agreement call and warm-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from benchmarks.harness import prepare
from benchmarks.harness.bench import Prepared
from benchmarks.harness.ops import OPS
from benchmarks.peers.base import VoxelPeer
from benchmarks.peers.layouts import to_warpconvnet
from benchmarks.peers.minkunet import Backend, skeleton_case

if TYPE_CHECKING:
    from benchmarks.harness.voxel_setup import E2ESetup, LayerSetup


def available() -> tuple[bool, str]:
    try:
        import warpconvnet
        from warpconvnet.nn.modules.sparse_conv import SparseConv3d  # noqa: F401  (loads warpconvnet._C)
    except Exception as err:  # a missing/ABI-mismatched extension raises ImportError or OSError
        return False, f"not importable ({type(err).__name__}: {err})"
    try:
        from importlib.metadata import version

        return True, version("warpconvnet")
    except Exception:
        return True, getattr(warpconvnet, "__version__", "unknown")


def layout(coords: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y, z int32 [N, 3], host offsets [B + 1]) of int32 (b, x, y, z) rows grouped by batch.

    Computed once per set of coordinates, as a user's data loader hands them over: built inside
    every call, it put a copy kernel and a bincount read back to the host (a sync) into each timed
    "fresh" call, which the standalone twin (and a WarpConvNet user) does not pay."""
    counts = torch.bincount(coords[:, 0].long(), minlength=batch_size).cpu()
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    return coords[:, 1:].int().contiguous(), offsets


def voxels(feats: torch.Tensor, coords: torch.Tensor, batch_size: int, tensor_stride: int = 1, rows=None):
    """Voxels from int32 (b, x, y, z) rows grouped by batch; x, y, z in units of `tensor_stride`.
    `rows`: their `layout`, when computed before (else computed here)."""
    from warpconvnet.geometry.types.voxels import Voxels

    xyz, offsets = rows or layout(coords, batch_size)
    return Voxels(xyz, feats, offsets=offsets, tensor_stride=tensor_stride)


# WarpConvNet 1.8.2 has no TF32 switch: its default ("auto") algorithm pool runs fp32 tensors through
# TF32 tensor-core tiles (csrc/include/cute_gemm_config.h: "float inputs truncated to TF32 by
# hardware"), ~3e-4 relative error, so its fp32 rows did not agree at 1e-4. Its per-module algorithm
# filter (fwd_algo / dgrad_algo / wgrad_algo accept a list) can pin the two algorithms that compute
# in true fp32: "explicit_gemm" (gather + torch.matmul, which honours allow_tf32 = False) and
# "implicit_gemm" (the SIMT kernel of csrc/include/implicit_gemm_template.cuh, fp32 FMAs).
EXACT_FP32_ALGOS = ["explicit_gemm", "implicit_gemm"]
EXACT_FP32_NOTE = (
    "fp32 exact: algorithms pinned to explicit_gemm/implicit_gemm (WarpConvNet 1.8.2's default pool "
    "runs fp32 through TF32; see its tf32 row)"
)


def algo_kwargs(exact_fp32: bool) -> dict:
    """SparseConv3d keyword arguments restricting it to true-fp32 algorithms (empty: its default)."""
    if not exact_fp32:
        return {}
    return dict(
        fwd_algo=list(EXACT_FP32_ALGOS), dgrad_algo=list(EXACT_FP32_ALGOS), wgrad_algo=list(EXACT_FP32_ALGOS)
    )


def layer(op: str, cin: int, cout: int, exact_fp32: bool = False) -> torch.nn.Module:
    from warpconvnet.nn.modules.sparse_conv import SparseConv3d

    k, s, transposed = OPS[op].kernel, OPS[op].stride, OPS[op].transposed
    return SparseConv3d(cin, cout, k, stride=s, bias=False, transposed=transposed, **algo_kwargs(exact_fp32))


def load_weight(module: torch.nn.Module, weight: torch.Tensor) -> None:
    with torch.no_grad():
        module.weight.copy_(to_warpconvnet(weight))


def keys(x, level_stride: int) -> torch.Tensor:
    """(b, x, y, z) of each output row in fine-grid units."""
    k = x.batch_indexed_coordinates.long().clone()
    k[:, 1:] *= level_stride
    return k


class WarpConvNetBackend(Backend):
    def __init__(self, exact_fp32: bool = False) -> None:
        from warpconvnet.nn.modules.sparse_conv import SparseConv3d

        self.conv_types = (SparseConv3d,)
        self.exact_fp32 = exact_fp32  # see EXACT_FP32_ALGOS
        self._rows_of, self._rows = None, None

    def tensor(self, feats, coords, batch_size):
        if self._rows_of is not coords:  # once per scene (see `layout`)
            self._rows_of, self._rows = coords, layout(coords, batch_size)
        return voxels(feats, coords, batch_size, rows=self._rows)

    def conv(self, cin, cout, kernel_size, stride, transposed, key):
        from warpconvnet.nn.modules.sparse_conv import SparseConv3d

        return SparseConv3d(
            cin,
            cout,
            kernel_size,
            stride=stride,
            bias=False,
            transposed=transposed,
            **algo_kwargs(self.exact_fp32),
        )

    def run_conv(self, conv, x, target=None):
        return conv(x) if target is None else conv(x, output_spatially_sparse_tensor=target)

    def feats(self, x):
        return x.feature_tensor

    def replace(self, x, feats):
        return x.replace_features(feats)

    def load_conv_weight(self, conv, weight, kernel_size):
        load_weight(conv, weight)


def layer_case(setup: LayerSetup) -> Prepared:
    """One layer as a WarpConvNet user runs it: maps cached in the input Voxels, a transposed conv
    given the fine tensor whose sites it must produce."""
    spec, scene, c = setup.spec, setup.scene, setup.spec["C"]
    device, dtype = setup.device, setup.dtype
    exact = spec["dtype"] == "fp32"  # true fp32, not its default TF32 (see EXACT_FP32_ALGOS)
    train = prepare.training(spec)
    conv = layer(spec["op"], c, c, exact_fp32=exact).to(device, dtype).train(train)
    load_weight(conv, setup.weight.to(device, dtype))
    bs = scene.batch_size
    if OPS[spec["op"]].transposed:
        down = layer("down2", c, c).to(device, dtype).train(train)
        zeros = torch.zeros(len(scene.coords), c, device=device, dtype=dtype)
        fine = voxels(zeros, scene.coords, bs)
        with torch.no_grad():
            coarse = down(fine)
        coarse_coords = coarse.batch_indexed_coordinates.int()
        coarse_rows, fine_rows = layout(coarse_coords, bs), layout(scene.coords, bs)
        inputs = [prepare.reorder(f, setup.in_coords.long(), keys(coarse, 2)) for f in setup.inputs]

        def make_input(f):
            if spec["map"] == "cached":
                return coarse.replace_features(f), fine
            return (
                voxels(f, coarse_coords, bs, tensor_stride=2, rows=coarse_rows),
                voxels(zeros, scene.coords, bs, rows=fine_rows),
            )

        def apply(f):
            x, target = make_input(f)
            return conv(x, output_spatially_sparse_tensor=target)

        out_stride = 1
    else:
        rows = layout(scene.coords, bs)
        base = voxels(setup.inputs[0], scene.coords, bs, rows=rows)
        inputs = setup.inputs

        def apply(f):
            if spec["map"] == "cached":
                return conv(base.replace_features(f))
            return conv(voxels(f, scene.coords, bs, rows=rows))

        out_stride = OPS[spec["op"]].stride
    with torch.no_grad():
        first = apply(inputs[0])
    upstream = prepare.features(first.feature_tensor.shape[0], c, dtype, device, seed=2, count=1)[0]
    fn, held = prepare.layer_fn(
        spec, lambda f: apply(f).feature_tensor, [conv.weight], inputs, upstream, device
    )

    def output():
        with torch.no_grad(), prepare.precision(spec["dtype"], device):
            out = apply(inputs[0])
        return keys(out, out_stride), out.feature_tensor.float()

    return Prepared(fn=fn, inputs=inputs, output=output, note=EXACT_FP32_NOTE if exact else "", held=held)


def e2e_case(setup: E2ESetup) -> Prepared:
    """relconv's MinkUNet rebuilt on WarpConvNet layers (peers/minkunet.py); fp32 rows pinned to
    its true-fp32 algorithms, as the layer rows are."""
    return skeleton_case(setup, WarpConvNetBackend(exact_fp32=setup.spec["dtype"] == "fp32"))


PEER = VoxelPeer("warpconvnet", available, layer_case, e2e_case)
