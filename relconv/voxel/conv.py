"""Sparse 3-D convolution on VoxelTensors, run by the core `relational_conv` op.

Conventions (stable; the benchmarks convert weights to other libraries' layouts with them):

* **Kernel offsets.** A kernel of size (kx, ky, kz) has K = kx * ky * kz offsets, enumerated with x
  slowest and z fastest: `k = (ix * ky + iy) * kz + iz`. Per axis, an odd size k covers the centred
  offsets -(k-1)/2 .. (k-1)/2 and an even size covers 0 .. k-1 (so a 2x2x2 stride-2 kernel covers the
  2^3 children of each coarse voxel). `relconv.voxel.kernel_map.kernel_offsets` returns them.
  Offsets are in units of dilation * tensor stride (for a transposed conv: of the output stride).
* **Weights.** `[K, C_in, C_out]` for groups == 1 and `[K, groups, C_in/groups, C_out/groups]` for
  grouped / depthwise conv (the core op's block-diagonal layout). Offset k multiplies as
  `x[i] @ W[k]`. A dense `torch.nn.functional.conv3d` weight `w [C_out, C_in, kx, ky, kz]` maps to
  `W[k] = w[:, :, ix, iy, iz].T`, with input padding `(k-1)/2 * dilation` per side for odd sizes
  and `(k-1) * dilation` on the high side for even stride-1 sizes (none for even strided ones).
* **Geometry.** stride 1: submanifold, output coordinates = input coordinates,
  `out[p] = sum_k x[p + off_k] W[k]`. stride s > 1: output coordinates
  `q = unique(floor(p / (s t)) * (s t))` for tensor stride t, `out[q] = sum_k x[q + off_k] W[k]`,
  output tensor stride s t. `transposed=True`: the strided map of the same geometry transposed, back
  to the coordinates at tensor stride t / s (found in the shared map cache or via `indice_key`),
  equal to `conv_transpose3d` restricted to those sites. `generative=True` (with transposed):
  outputs every `q + off_k` at tensor stride t / s, the full support of `conv_transpose3d`.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from relconv.ops import ACTIVATIONS, ConvPlan, conv_call, direct_ok, forgetting_ref, plan, prepare, run_conv
from relconv.voxel.kernel_map import LayerMap, MapCache, layer_map
from relconv.voxel.tensor import VoxelTensor
from relconv.voxel.utils import Triple, registered, triple


def conv3d(
    x: VoxelTensor,
    weight: Tensor,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    bias: Tensor | None = None,
    transposed: bool = False,
    generative: bool = False,
    indice_key: str | None = None,
    activation: str | None = None,
    prepared: PreparedCalls | None = None,
    offset_order: Sequence[int] | None = None,
) -> VoxelTensor:
    """Functional sparse conv; see the module docstring for geometry and weight layout.

    Args:
        x: input with features [N, C_in].
        weight: [K, C_in, C_out] or [K, groups, C_in/groups, C_out/groups], K = prod(kernel_size).
        bias: optional [C_out].
        activation: None or "relu", applied after the bias.
        prepared: a layer's `PreparedCalls`, for a module that calls conv3d with the same geometry
            every time (a front end with weights of its own layout): conv3d keeps the prepared op
            call there at the layer's second call over a coordinate set and runs it at later ones,
            skipping the map lookup, the plan and the checks below.
        offset_order: weights that list the kernel offsets in another order (a front end's layout):
            `weight[j]` holds offset `offset_order[j]` of relconv's order, a permutation of
            range(K). The conv then runs over the map with its relations relabelled to that order
            (`RelationalMap.relabeled`, built once per map) and takes the weight as it is, with no
            gather per call. None: relconv's order.
    Returns:
        VoxelTensor with features [M, C_out] at the output coordinates.
    """
    if not isinstance(x, VoxelTensor):
        raise TypeError(f"x must be a VoxelTensor, got {type(x).__name__}")
    if prepared is not None:
        out = prepared.run(x, weight, bias, activation)
        if out is not None:
            return out
    k, s, d = triple(kernel_size, "kernel_size"), triple(stride, "stride"), triple(dilation, "dilation")
    if max(k) > 7:
        raise ValueError(f"kernel_size must lie in 1..7 per axis, got {k}")
    if generative and not transposed:
        raise ValueError("generative=True needs transposed=True (it creates upsampled coordinates)")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device} but x is on {x.device}")
    if weight.shape[0] != math.prod(k):
        raise ValueError(f"weight has {weight.shape[0]} offsets but kernel_size {k} has {math.prod(k)}")
    _check_activation(activation)
    return run_layer(
        x,
        weight,
        k,
        s,
        d,
        groups,
        bias,
        transposed,
        generative,
        indice_key,
        activation,
        prepared,
        None if offset_order is None else checked_offset_order(tuple(offset_order), math.prod(k)),
    )


@functools.lru_cache(maxsize=256)
def checked_offset_order(order: tuple, volume: int) -> tuple[int, ...]:
    """`order` as a tuple of ints, after checking that it permutes range(volume)."""
    if sorted(order) != list(range(volume)) or not all(isinstance(o, int) for o in order):
        raise ValueError(
            f"offset_order must be a permutation of range({volume}) (the kernel's offsets), got {order}"
        )
    return order


def _check_activation(activation: str | None) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def run_layer(
    x: VoxelTensor,
    weight: Tensor,
    k: Triple,
    s: Triple,
    d: Triple,
    groups: int,
    bias: Tensor | None,
    transposed: bool,
    generative: bool,
    indice_key: str | None,
    activation: str | None,
    prepared: PreparedCalls | None = None,
    offset_order: tuple[int, ...] | None = None,
) -> VoxelTensor:
    """conv3d on validated, normalised arguments: the per-call path of `conv3d`, of `Conv3d` and the
    compatibility layers (which pass their `PreparedCalls`, to keep the prepared op call) and of the
    folded layers of `relconv.voxel.Sequential`."""
    if k == (1, 1, 1) and s == (1, 1, 1) and groups == 1 and indice_key is None:
        # A 1x1x1 submanifold conv is a plain matmul; skip the identity map.
        # squeeze, not weight[0]: a select's backward zero-fills and copies (two launches per step).
        w = weight.squeeze(0)
        out = x.feats @ w if bias is None else torch.addmm(bias, x.feats, w)
        return x.replace_feature(out.relu_() if activation == "relu" else out)
    lm = layer_map(x, k, s, d, transposed, generative, indice_key, defer_check=True)
    # Bias and ReLU go into the op: on CUDA's output-stationary path they are the kernel's epilogue.
    rmap = lm.rmap if offset_order is None else lm.rmap.relabeled(offset_order)
    call = conv_call(x.feats, weight, rmap, groups, bias=bias, activation=activation)
    if lm.unchecked is None and prepared is not None and lm.out_cache is x.cache:
        prepared.keep(x, call[0], bias, activation, lm, rmap)
    out = run_conv(call)
    if lm.unchecked is not None:
        # New CUDA coordinates are checked once the conv is queued: the check waits only for the
        # error word the hash insert published to the host (long landed by then), so the host never
        # waits for the map's later kernels and the GPU never idles while the host queues the
        # conv. The conv over a bad set is memory-safe (the table holds valid rows or -1), and
        # its result never leaves: the check raises first. H100, fresh subm 3^3 C64 fp16, in-process
        # A/B (us, latency / queued), check before the conv's launch -> after it: 64-beam 188 / 118
        # -> 176 / 118, 32-beam 128 / 98 -> 113 / 95, real scan 139 / 99 -> 141 / 101, 171k rows
        # 255 / 211 -> 245 / 209 (python -m benchmarks.run --suite voxel).
        lm.unchecked.ensure_valid()
    return VoxelTensor._trusted(out, lm.out_coords, lm.out_stride, lm.out_cache)


def run_checked(
    x: VoxelTensor,
    weight: Tensor,
    k: Triple,
    s: Triple,
    d: Triple,
    bias: Tensor | None = None,
    activation: str | None = None,
    prepared: PreparedCalls | None = None,
    transposed: bool = False,
    offset_order: tuple[int, ...] | None = None,
    *,
    groups: int = 1,
    generative: bool = False,
    indice_key: str | None = None,
) -> VoxelTensor:
    """conv3d for a layer that normalised and checked its geometry when it was built (`Conv3d`,
    the compatibility layers): its prepared call where there is one, else `run_layer`, without
    conv3d's per-call argument checks (the op still checks what reaches it)."""
    if prepared is not None:
        out = prepared.run(x, weight, bias, activation)
        if out is not None:
            return out
    return run_layer(
        x,
        weight,
        k,
        s,
        d,
        groups,
        bias,
        transposed,
        generative,
        indice_key,
        activation,
        prepared,
        offset_order,
    )


class LayerPlan(NamedTuple):
    """A layer's prepared call over one coordinate set with one activation, kept in its
    `PreparedCalls` (keyed by the set's `MapCache` and the activation: the prepared call applies the
    activation it was made with).

    Preparing a call (map lookup, execution plan, table schedule, pair lists, checks) costs about as
    much host time as the op's dispatch and launch: a cached C64 fp16 layer takes 28-31 us to
    enqueue on an H100 host that way, the op alone 12.7. A layer's second call over the same
    coordinates keeps the prepared op call (`relconv.ops.prepare`, which re-checks the call state it
    was made under in C++), and later calls run it straight from `Conv3d.forward`. A network over a
    new scan calls each layer once per scan and so prepares no calls, only the marks (`run` None) of
    first calls, which leave with the scan's coordinates.
    """

    cache: weakref.ref  # the coordinate set's MapCache; its id keys the plan, and ids are reused
    in_stride: Triple
    run: Callable[[Tensor, Tensor, Tensor | None], Tensor | None] | None
    out_coords: Tensor | None
    out_stride: Triple | None


class PreparedCalls(dict):
    """One layer's `LayerPlan`s, by `id` of the coordinate set's `MapCache` and the activation.
    `Conv3d` keeps one, and so does every compatibility layer (`relconv.spconv`,
    `relconv.torchsparse`) that runs a relconv conv with weights of its own layout (through
    `conv3d(..., prepared=)`): `run` is the fast path, `run_layer(..., prepared=)` the full one that
    stores the plans. Copies and pickles start empty: a plan is bound to tensors of this process."""

    def run(
        self, x: VoxelTensor, weight: Tensor, bias: Tensor | None, activation: str | None = None
    ) -> VoxelTensor | None:
        """The stored call over x's coordinates with `activation`, or None where there is none or
        it steps aside."""
        out = self.run_features(x.feats, x.cache, x.stride, weight, bias, activation)
        if out is None:
            return None
        plan = self[(id(x.cache), activation)]
        return VoxelTensor._trusted(out, plan.out_coords, plan.out_stride, x.cache)

    def run_features(
        self,
        feats: Tensor,
        cache: MapCache,
        stride: Triple,
        weight: Tensor,
        bias: Tensor | None,
        activation: str | None = None,
    ) -> Tensor | None:
        """`run`'s output features, for features on `cache`'s coordinates at `stride` that are not
        wrapped in a VoxelTensor (the compatibility layers' own tensors): the stored call checks
        their shape, dtype and device against those it was prepared for, and steps aside (None)
        where they differ."""
        # The plan first: over new coordinates (every layer of a forward over a new scan) there is
        # none, and the lookup is all the miss costs.
        plan = self.get((id(cache), activation))
        if plan is None or plan.run is None or plan.cache() is not cache or plan.in_stride != stride:
            return None
        if not direct_ok((feats, weight, bias)):
            return None
        return plan.run(feats, weight, bias)

    def keep(
        self, x: VoxelTensor, args, bias: Tensor | None, activation: str | None, lm: LayerMap, rmap
    ) -> None:
        """Marks the layer's first call over x's coordinates with `activation` and keeps its
        prepared call (`relconv.ops.prepare`, over `rmap`: `lm`'s map, relabelled where the call's
        weight lists the offsets in another order) at the second. A bias that needs a cast per call
        gets none."""
        cache, key = x.cache, (id(x.cache), activation)
        seen = self.get(key)
        if seen is None or seen.cache() is not cache:
            # The mark leaves with the coordinates: a network over a new scan keeps no marks.
            ref = forgetting_ref(self, key, cache)
            self[key] = LayerPlan(ref, x.stride, None, None, None)
            return
        if args.bias is not bias:
            return
        self[key] = seen._replace(run=prepare(args, rmap), out_coords=lm.out_coords, out_stride=lm.out_stride)

    def __deepcopy__(self, memo: dict) -> PreparedCalls:
        return PreparedCalls()

    def __reduce__(self):
        return (PreparedCalls, ())


class Conv3d(nn.Module):
    """Sparse 3-D convolution (stride 1 = submanifold); weight `[K, C_in, C_out]`.

    Args:
        in_channels, out_channels: C_in, C_out (both divisible by `groups`).
        kernel_size: 1..7 per axis, odd (centred) or even (0..k-1).
        stride, dilation: ints or per-axis triples.
        groups: channel groups; the weight is then `[K, groups, C_in/groups, C_out/groups]`.
        bias: learnable `[C_out]` bias.
        transposed: upsample by `stride` onto the coordinates the matching strided conv came from.
        generative: with `transposed`, create all output coordinates the kernel reaches instead.
        indice_key: name under which the map is shared (a transposed conv reuses the strided one).
        activation: None or "relu", applied after the bias (what `relconv.voxel.fuse_conv_bn`
            folds a following ReLU into).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        bias: bool = False,
        transposed: bool = False,
        generative: bool = False,
        indice_key: str | None = None,
        activation: str | None = None,
    ) -> None:
        super().__init__()
        _check_activation(activation)
        self.activation = activation
        self.kernel_size = triple(kernel_size, "kernel_size")
        if max(self.kernel_size) > 7:
            raise ValueError(f"kernel_size must lie in 1..7 per axis, got {self.kernel_size}")
        self.stride = triple(stride, "stride")
        self.dilation = triple(dilation, "dilation")
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(
                f"groups ({groups}) must be positive and divide in_channels ({in_channels}) "
                f"and out_channels ({out_channels})"
            )
        if generative and not transposed:
            raise ValueError("generative=True needs transposed=True")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.transposed, self.generative, self.indice_key = transposed, generative, indice_key
        kv = math.prod(self.kernel_size)
        shape = (
            (kv, in_channels, out_channels)
            if groups == 1
            else (kv, groups, in_channels // groups, out_channels // groups)
        )
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self._prepared = PreparedCalls()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Same fan-in scaling as torch.nn.Conv3d's default (kaiming_uniform with a = sqrt(5)).
        fan_in = self.weight.shape[0] * self.in_channels // self.groups
        bound = 1.0 / math.sqrt(fan_in)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        if not isinstance(x, VoxelTensor):
            raise TypeError(f"x must be a VoxelTensor, got {type(x).__name__}")
        # Arguments were validated and normalised in __init__: the per-call path does no re-checking.
        return run_checked(
            x,
            registered(self, "weight"),
            self.kernel_size,
            self.stride,
            self.dilation,
            registered(self, "bias"),
            self.activation,
            self._prepared,
            self.transposed,
            groups=self.groups,
            generative=self.generative,
            indice_key=self.indice_key,
        )

    def execution_plan(
        self, x: VoxelTensor, *, requires_grad: bool | None = None, arch: tuple[int, int] | None = None
    ) -> ConvPlan:
        """How this layer's relational convolution runs over `x` (see `relconv.ops.plan`: dataflow,
        kernel and why); `arch` plans for that CUDA compute capability. Builds the layer's map."""
        lm = layer_map(
            x, self.kernel_size, self.stride, self.dilation, self.transposed, self.generative, self.indice_key
        )
        weight = registered(self, "weight")
        return plan(lm.rmap, x.feats, weight, self.groups, requires_grad=requires_grad, arch=arch)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.dilation != (1, 1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.transposed:
            s += ", transposed=True" + (", generative=True" if self.generative else "")
        if self.activation is not None:
            s += f", activation={self.activation!r}"
        return s
