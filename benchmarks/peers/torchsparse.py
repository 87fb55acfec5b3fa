"""TorchSparse++ peer (mit-han-lab/torchsparse 2.1; not on PyPI, built by build_torchsparse.sh).

Used as its README and examples show: `SparseTensor(feats, coords)` with int32 (b, x, y, z) rows
(batch first in 2.1), `torchsparse.nn.Conv3d` layers (weight `kernel`, layout in layouts.py),
the default convolution configuration (implicit GEMM, maps built on the fly with a GPU hash
table), whole networks through `torchsparse.backbones.SparseResUNet42`.

Set-up details that matter for agreement:
- Grid extent. Without a `spatial_range` a stride-2 2^3 conv bounds its output grid by
  (max + 2 p - (k - 1)) // s, which drops the coarse site floor(max / 2) of the last voxels along
  an axis whose max is even (the same trap spconv has). The tensor is given the grid rounded up to
  a multiple of 16 per axis (MinkUNet's four stride-2 levels), as spconv's adapter does.
- TF32. `torchsparse.backends.allow_tf32` is on by default on sm_80+, so fp32 features run on TF32
  tensor cores (~1e-3 relative error). fp32 rows switch it off (true fp32, noted on the row); tf32
  rows keep the default.
- Train/eval. A module in training mode also builds the backward maps with every forward; inference
  rows put the layers in eval mode, as a user's inference loop does.
- Map caching. Maps live in the tensor's `_caches`, which every output and `torchsparse.cat` share.
  "cached" rows reuse one tensor's cache (a new tensor with the same coordinates is given the cache,
  as the library's own ops do); "fresh" rows build a new tensor. A transposed conv (`transposed=True`)
  finds its fine sites and map in the coarse tensor's cache.
- Mixed precision. Its conv functions ignore autocast and run fp16 when an operand is fp16, so the
  fp16 end-to-end rows hand it fp16 input features (under autocast, like every implementation).
- CUDA only. 2.1's kernel-map builders all go through `torchsparse.backend.GPUHashTable` (its CPU
  build compiles, but a conv on CPU tensors fails there), so CPU rows say "unsupported".
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch import nn

from benchmarks.harness import prepare
from benchmarks.harness.bench import Prepared, Unsupported
from benchmarks.harness.floor import DTYPES
from benchmarks.harness.ops import OPS
from benchmarks.peers.base import VoxelPeer
from benchmarks.peers.layouts import to_torchsparse

if TYPE_CHECKING:
    from benchmarks.harness.voxel_setup import E2ESetup, LayerSetup

GRID_MULTIPLE = 16
EXACT_FP32_NOTE = "fp32 exact: torchsparse.backends.allow_tf32 = False (its default runs fp32 as TF32)"


def available() -> tuple[bool, str]:
    try:
        import torchsparse
        import torchsparse.backend  # noqa: F401  (the compiled extension)
        import torchsparse.nn  # noqa: F401
    except Exception as err:  # a missing/ABI-mismatched extension raises ImportError or OSError
        return False, f"not importable ({type(err).__name__}: {err})"
    return True, getattr(torchsparse, "__version__", "unknown")


def spatial_range(coords: torch.Tensor, batch_size: int) -> tuple[int, int, int, int]:
    """(batch, X, Y, Z) with each extent max + 1 rounded up to a multiple of GRID_MULTIPLE."""
    m = GRID_MULTIPLE
    extent = [(int(v) + m) // m * m for v in coords[:, 1:].max(0).values.tolist()]
    return (batch_size, *extent)


def sparse_tensor(feats: torch.Tensor, coords: torch.Tensor, batch_size: int, grid=None):
    """A SparseTensor at int32 (b, x, y, z) `coords`; `grid` is a precomputed spatial_range."""
    from torchsparse import SparseTensor

    grid = grid or spatial_range(coords, batch_size)
    return SparseTensor(feats, coords.int().contiguous(), spatial_range=grid)


def with_cache(x, feats: torch.Tensor):
    """A new tensor of `feats` at `x`'s sites sharing `x`'s map cache (what torchsparse's own
    feature-wise ops return)."""
    from torchsparse import SparseTensor

    out = SparseTensor(feats, x.coords, stride=x.stride, spatial_range=x.spatial_range)
    out._caches = x._caches
    return out


CUDA_ONLY = "TorchSparse++ 2.1 builds kernel maps with a GPU hash table only (no CPU path)"
# backend/convolution/*_cuda.cu dispatch on half, else read float: bf16 features would be misread.
NO_BF16 = "TorchSparse++ 2.1 has fp16 and fp32 kernels only (no bf16)"
# Its conv functions are not autocast-aware; an fp16 operand makes them run fp16 (implicit_gemm.py).
FP16_INPUT_NOTE = "input features given in fp16: TorchSparse++'s convs ignore autocast"


def check(device: torch.device, dtype_name: str) -> str | None:
    """Why TorchSparse++ cannot run this case, or None."""
    if device.type != "cuda":
        return CUDA_ONLY
    if dtype_name == "bf16":
        return NO_BF16
    return None


def conv(cin: int, cout: int, kernel_size: int, stride: int, transposed: bool):
    import torchsparse.nn as spnn

    padding = (kernel_size - 1) // 2 if kernel_size % 2 else 0
    return spnn.Conv3d(
        cin,
        cout,
        kernel_size,
        stride=stride,
        padding=padding,
        bias=False,
        transposed=transposed,
    )


def layer(op: str, cin: int, cout: int) -> nn.Module:
    o = OPS[op]
    return conv(cin, cout, o.kernel, o.stride, o.transposed)


def load_weight(module: nn.Module, weight: torch.Tensor, kernel_size: tuple[int, int, int]) -> None:
    with torch.no_grad():
        module.kernel.copy_(to_torchsparse(weight, kernel_size))


def keys(x) -> torch.Tensor:
    """(b, x, y, z) of each row in fine-grid units (TorchSparse++ keeps coarse grid indices)."""
    k = x.coords.long().clone()
    k[:, 1:] *= torch.tensor(x.stride, dtype=torch.long, device=k.device)
    return k


@contextlib.contextmanager
def precision(dtype_name: str):
    """TF32 off for "fp32" rows (true fp32), the library's default otherwise."""
    import torchsparse.backends

    old = torchsparse.backends.allow_tf32
    if dtype_name == "fp32":
        torchsparse.backends.allow_tf32 = False
    try:
        yield
    finally:
        torchsparse.backends.allow_tf32 = old


class TorchSparseMinkUNet(nn.Module):
    """SparseResUNet42 (relconv's MinkUNet channel plan and blocks) with a linear classifier on its
    last output, which the backbone does not have."""

    def __init__(self, in_channels: int, num_classes: int, width: float):
        super().__init__()
        from torchsparse.backbones import SparseResUNet42

        from relconv.voxel.models.minkunet import BASE_CHANNELS

        self.backbone = SparseResUNet42(in_channels=in_channels, width_multiplier=width)
        self.classifier = nn.Linear(int(width * BASE_CHANNELS[8]), num_classes)

    def forward(self, x) -> torch.Tensor:
        return self.classifier(self.backbone(x)[-1].feats)


def _relconv_order(model: nn.Module) -> list[nn.Module]:
    """relconv MinkUNet's parameter modules in SparseResUNet42's order: stem, encoders, then per
    decoder stage its upsampling block and its fuse blocks, then the classifier."""
    from relconv.voxel import Conv3d

    parts = [model.stem, *model.down]
    for up, fuse in zip(model.up, model.fuse, strict=True):
        parts += [up, fuse]
    parts.append(model.classifier)
    kinds = (Conv3d, nn.BatchNorm1d, nn.Linear)
    return [m for part in parts for m in part.modules() if isinstance(m, kinds)]


def copy_weights(relconv_model: nn.Module, peer: TorchSparseMinkUNet) -> None:
    """relconv's MinkUNet weights into the TorchSparse++ network, module by module."""
    import torchsparse.nn as spnn

    from relconv.voxel import Conv3d

    src = _relconv_order(relconv_model)
    dst = [m for m in peer.modules() if isinstance(m, (spnn.Conv3d, nn.BatchNorm1d, nn.Linear))]
    if len(src) != len(dst):
        raise RuntimeError(f"relconv MinkUNet has {len(src)} parameter modules, SparseResUNet42 {len(dst)}")
    with torch.no_grad():
        for a, b in zip(src, dst, strict=True):
            if isinstance(a, Conv3d) and isinstance(b, spnn.Conv3d):
                if tuple(b.kernel_size) != tuple(a.kernel_size):
                    raise RuntimeError(f"kernel sizes differ: {a.kernel_size} vs {b.kernel_size}")
                load_weight(b, a.weight, a.kernel_size)
            elif (
                type(a) is nn.Linear
                and type(b) is nn.Linear
                or (isinstance(a, nn.BatchNorm1d) and isinstance(b, nn.BatchNorm1d))
            ):
                b.load_state_dict(a.state_dict())
            else:
                raise RuntimeError(f"module order differs: {type(a).__name__} vs {type(b).__name__}")


def layer_case(setup: LayerSetup) -> Prepared:
    """One `torchsparse.nn.Conv3d` as its README shows, maps reused through the tensors' caches."""
    spec, scene, c = setup.spec, setup.scene, setup.spec["C"]
    device, dtype = setup.device, setup.dtype
    if why := check(device, spec["dtype"]):
        raise Unsupported(why)
    op = OPS[spec["op"]]
    train = prepare.training(spec)
    conv3d = layer(spec["op"], c, c).to(device, dtype).train(train)
    load_weight(conv3d, setup.weight.to(device, dtype), setup.kernel_size)
    bs = scene.batch_size
    grid = spatial_range(scene.coords, bs)  # once, as for spconv's grid
    if op.transposed:
        if spec["map"] == "fresh":
            raise Unsupported("a transposed conv reuses its strided conv's map (no fresh build)")
        down = layer("down2", c, c).to(device, dtype).train(train)
        zeros = torch.zeros(len(scene.coords), c, device=device, dtype=dtype)
        with torch.no_grad():
            fine = sparse_tensor(zeros, scene.coords, bs, grid)
            # A transposed conv finds its output sites in the cache under the fine stride, which
            # TorchSparse++ registers for every conv OUTPUT; a raw input tensor has no entry
            # (KeyError (1, 1, 1)), so register it as a preceding layer would have.
            fine._caches.cmaps.setdefault(fine.stride, (fine.coords, fine.spatial_range))
            coarse = down(fine)
        inputs = [prepare.reorder(f, setup.in_coords.long(), keys(coarse)) for f in setup.inputs]

        def make_input(f):
            return with_cache(coarse, f)
    else:
        base = sparse_tensor(setup.inputs[0], scene.coords, bs, grid)
        inputs = setup.inputs

        def make_input(f):
            if spec["map"] == "cached":
                return with_cache(base, f)
            return sparse_tensor(f, scene.coords, bs, grid)

    with torch.no_grad(), precision(spec["dtype"]):
        first = conv3d(make_input(inputs[0]))
    upstream = prepare.features(first.feats.shape[0], c, dtype, device, seed=2, count=1)[0]
    fn, held = prepare.layer_fn(
        spec,
        lambda f: conv3d(make_input(f)).feats,
        [conv3d.kernel],
        inputs,
        upstream,
        device,
        library_precision=precision,
    )

    def output():
        with torch.no_grad(), prepare.precision(spec["dtype"], device), precision(spec["dtype"]):
            out = conv3d(make_input(inputs[0]))
        return keys(out), out.feats.float()

    notes = ["padding 1: outputs every coarse site in reach"] if spec["op"] == "down3" else []
    if spec["dtype"] == "fp32":
        notes.append(EXACT_FP32_NOTE)
    return Prepared(fn=fn, inputs=inputs, output=output, note="; ".join(notes), held=held)


def e2e_case(setup: E2ESetup) -> Prepared:
    """TorchSparse++'s own SparseResUNet42 (+ linear classifier) with relconv's initial weights."""
    spec, device = setup.spec, setup.device
    if why := check(device, spec["dtype"]):
        raise Unsupported(why)
    peer = TorchSparseMinkUNet(setup.in_channels, setup.num_classes, spec["width"]).to(device)
    copy_weights(setup.initial_model(), peer)
    coords, bs = setup.scene.coords, setup.scene.batch_size
    grid = spatial_range(coords, bs)
    dt = spec["dtype"]
    note = EXACT_FP32_NOTE if dt == "fp32" else FP16_INPUT_NOTE
    # The fp32 agreement call (output()) runs outside autocast: features stay fp32 there.
    cast = DTYPES[dt] if dt == "fp16" else None

    def make_input(f):
        if cast is not None and torch.is_autocast_enabled():
            f = f.to(cast)
        return sparse_tensor(f, coords, bs, grid)

    return setup.prepared(peer, make_input, precision, note)


PEER = VoxelPeer("torchsparse", available, layer_case, e2e_case)
