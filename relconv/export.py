"""`torch.export` of relconv networks: kernel maps built inside the exported graph.

relconv's eager map builders read coordinate bounds and duplicate checks back to the host
(`relconv.voxel.kernel_map.bounds`, the packing's range checks, `RelationalMap`'s int sizes), and the
voxel network finds its maps in a `MapCache` kept on the tensors. Host reads of device values cannot
be traced: `torch.export` of `MinkUNet` over `VoxelTensor(feats, coords)` stops at the first of them
(`make_packing`'s `lo[0] < 0`, a guard on a data-dependent value). This module builds the same maps
from tensors alone, so that an exported program takes `(feats, coords)` and derives every map itself:

* keys are packed with fixed field widths (`KEY_BITS` per axis, `BATCH_BITS` for the batch index)
  around the minimum coordinate computed on the device, instead of spans read to the host;
* a strided layer's output coordinates are `torch.unique` of the coarsened keys (an output size
  that is known only at run time: an unbacked size in the exported graph);
* the maps go into the network's `MapCache` before it runs, under the keys the network looks up,
  so the model code runs unchanged.

The exported builders trust their input as eager voxelisation leaves it: coordinates unique per
(batch, x, y, z) row, 2 to MAX_VOXELS rows, batch indices in [0, 2^BATCH_BITS), and each axis' extent below
2^KEY_BITS - 2 * MARGIN. They do not check it (a check would be a host read). `voxel_export_check`
checks a scene eagerly before it is fed to an exported program.

R-GCN graphs are built the same way (`GraphExport`): the (relation, target) sort, the relation
offsets and the mean scale from tensors of static size, edge ids unchecked.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relconv.core import RelationalMap
from relconv.graph.graph_map import RGCNMap
from relconv.voxel.kernel_map import MapCache, MapEntry, kernel_offsets
from relconv.voxel.nn import inference_folding
from relconv.voxel.tensor import VoxelTensor
from relconv.voxel.utils import Triple

KEY_BITS = 18
BATCH_BITS = 62 - 3 * KEY_BITS
# Room below the smallest and above the largest coordinate for kernel offsets and coarsened sites:
# covers a tensor stride times kernel reach up to this many voxels.
MARGIN = 1024

# Voxels per exported scene.
MAX_VOXELS = 1 << 24

_MULT = (1 << (3 * KEY_BITS), 1 << (2 * KEY_BITS), 1 << KEY_BITS, 1)


def _map(in_index: Tensor, out_index: Tensor, rel_ptr: Tensor, num_in, num_out, scale=None) -> RelationalMap:
    """A `RelationalMap` whose sizes may be symbolic. `RelationalMap.__init__` stores `int(num_in)`,
    which under tracing would fix a dynamic size to the example's value (or fail for a size known
    only at run time), and its checks compare sizes on the host; the pairs built here are valid by
    construction, so the fields are set directly."""
    rmap = RelationalMap.__new__(RelationalMap)
    rmap._in_index, rmap._out_index, rmap._rel_ptr = in_index, out_index, rel_ptr
    rmap.scale = scale
    rmap.num_in, rmap.num_out = num_in, num_out
    rmap.num_relations = rel_ptr.shape[0] - 1
    # Not flagged as tables: a CUDA table forward sizes its schedule from float(num_out) on the
    # host (`relconv.ops.relational_conv.table_work`), which a run-time size cannot give. The maps
    # run the pair kernels on every device.
    rmap.injective = rmap.unique_slots = False
    rmap.index_dtype, rmap.device = in_index.dtype, in_index.device
    rmap._cache = {}
    return rmap


# ---------------------------------------------------------------------------- voxel maps
class _Packing:
    """Keys `(b, x - lo_x, y - lo_y, z - lo_z)` in fixed bit fields; `lo` stays on the device."""

    def __init__(self, coords: Tensor) -> None:
        lo = coords.long().amin(0) - MARGIN
        self.lo = torch.cat([torch.zeros_like(lo[:1]), lo[1:]])
        self.mult = torch.tensor(_MULT, dtype=torch.int64, device=coords.device)

    def pack(self, coords: Tensor) -> Tensor:
        return ((coords.long() - self.lo) * self.mult).sum(1)

    def unpack(self, keys: Tensor) -> Tensor:
        # The batch field needs no mask: batch indices stay below 2^BATCH_BITS < 2^KEY_BITS.
        fields = keys.unsqueeze(1).div(self.mult, rounding_mode="floor") % (1 << KEY_BITS)
        return (fields + self.lo).to(torch.int32)

    def delta(self, offsets: Tensor) -> Tensor:
        return (offsets * self.mult[1:]).sum(1)


def _search(packing: _Packing, in_coords: Tensor, out_keys: Tensor, offsets: Tensor) -> RelationalMap:
    """Pairs (i, o, k) with p_i = q_o + offsets[k], grouped by k and sorted by o within k (the order
    of relconv's eager CPU builder)."""
    keys, perm = torch.sort(packing.pack(in_coords))
    queries = packing.delta(offsets)[:, None] + out_keys[None, :]
    pos = torch.searchsorted(keys, queries).clamp_(max=keys.shape[0] - 1)
    hit = keys[pos] == queries
    rel, out = hit.nonzero(as_tuple=True)
    inp = perm[pos[rel, out]]
    rel_ptr = torch.cat([hit.new_zeros(1, dtype=torch.int64), hit.sum(1).cumsum(0)])
    return _map(inp.int(), out.int(), rel_ptr, in_coords.shape[0], out_keys.shape[0])


def _step_offsets(kernel_size: Triple, step: Triple, device: torch.device) -> Tensor:
    return kernel_offsets(kernel_size, device) * torch.tensor(step, dtype=torch.int64, device=device)


def build_voxel_maps(coords: Tensor, keys: list[tuple]) -> MapCache:
    """A `MapCache` over `coords` (tensor stride 1) holding the maps named by `keys` (the
    submanifold and strided keys of `relconv.voxel.kernel_map`), built from tensors alone."""
    packing = _Packing(coords)
    cache = MapCache()
    cache.coords[(1, 1, 1)] = coords
    # A strided map's input stride is reached by the maps of smaller strides: build in stride order.
    for key in sorted(keys, key=lambda k: (k[1], k[0] == "strided")):
        kind, ts, k = key[0], key[1], key[2]
        if ts not in cache.coords:
            raise NotImplementedError(f"map {key}: no layer reaches tensor stride {ts} first")
        in_coords = cache.coords[ts]
        if kind == "submanifold":
            step = tuple(d * t for d, t in zip(key[3], ts, strict=True))
            offsets = _step_offsets(k, step, coords.device)
            rmap = _search(packing, in_coords, packing.pack(in_coords), offsets)
            cache.maps[key] = MapEntry(rmap, in_coords, ts, in_coords, ts)
        elif kind == "strided":
            s, d = key[3], key[4]
            out_ts = tuple(si * t for si, t in zip(s, ts, strict=True))
            out_coords = cache.coords.get(out_ts)
            if out_coords is None:
                span = torch.tensor((1, *out_ts), dtype=torch.int64, device=coords.device)
                coarse = torch.div(in_coords.long(), span, rounding_mode="floor") * span
                out_coords = packing.unpack(torch.unique(packing.pack(coarse), sorted=True))
                # A non-empty scene has a non-empty coarse level: tells the tracer that this
                # run-time size is not 0, which layers that special-case empty inputs (BatchNorm)
                # would otherwise have to decide on the host.
                torch._check(out_coords.shape[0] > 0)
                # And bounded: bounds the sizes derived from it (a map's pair count) so that
                # AOTInductor's size checks stay within int64. A constant bound, not the input's
                # size: AOTInductor's CUDA wrapper checks it before it declares the input's size.
                torch._check(out_coords.shape[0] <= MAX_VOXELS)
                cache.coords[out_ts] = out_coords
            step = tuple(di * t for di, t in zip(d, ts, strict=True))
            offsets = _step_offsets(k, step, coords.device)
            rmap = _search(packing, in_coords, packing.pack(out_coords), offsets)
            # The transposed conv's map (the same pairs swapped), made here for the same reason as
            # the fields of `_map`; its pairs stay grouped by offset.
            swapped = _map(rmap.out_index, rmap.in_index, rmap.rel_ptr, rmap.num_out, rmap.num_in)
            cache.maps[key] = MapEntry(rmap, in_coords, ts, out_coords, out_ts, transposed=swapped)
        else:
            raise NotImplementedError(
                f"map {key}: only submanifold and strided maps build inside an exported graph "
                "(a generative conv's output coordinates are not supported)"
            )
    return cache


def voxel_map_keys(model: nn.Module, feats: Tensor, coords: Tensor) -> list[tuple]:
    """The kernel-map keys `model` looks up over a scene (one eager forward over the example).
    A network's layers fix them: every scene needs the same keys."""
    x = VoxelTensor(feats, coords)
    with torch.no_grad():
        model(x)
    if x.cache.named:
        raise NotImplementedError("maps shared by indice_key are not supported inside an exported graph")
    return list(x.cache.maps)


def voxel_export_check(coords: Tensor) -> None:
    """Raises ValueError unless `coords` ([N, 4] int32) meet what the exported builders assume: unique
    rows, 2 to MAX_VOXELS of them, batch indices in [0, 2^BATCH_BITS), each axis' extent within the
    key field (eager)."""
    if coords.dim() != 2 or coords.shape[1] != 4 or coords.dtype != torch.int32:
        raise ValueError(f"coords must be int32 [N, 4], got {coords.dtype} {tuple(coords.shape)}")
    if not 2 <= coords.shape[0] <= MAX_VOXELS:
        raise ValueError(
            f"coords must hold 2 to {MAX_VOXELS} voxels (the exported size range), got {coords.shape[0]}"
        )
    lo, hi = (v.tolist() for v in torch.aminmax(coords.long(), dim=0))
    if lo[0] < 0 or hi[0] >= 1 << BATCH_BITS:
        raise ValueError(f"coords batch indices must lie in [0, {1 << BATCH_BITS}), got [{lo[0]}, {hi[0]}]")
    for a in range(1, 4):
        if hi[a] - lo[a] + 2 * MARGIN >= 1 << KEY_BITS:
            raise ValueError(
                f"coords axis {'xyz'[a - 1]} extent {hi[a] - lo[a]} exceeds {(1 << KEY_BITS) - 2 * MARGIN}"
            )
    if torch.unique(coords, dim=0).shape[0] != coords.shape[0]:
        raise ValueError("coords contain duplicate (batch, x, y, z) rows; merge them first (voxelize)")


class VoxelExport(nn.Module):
    """`model(VoxelTensor(feats, coords))` as a function of tensors, its maps built from `coords`
    in the graph; `keys` from `voxel_map_keys`. The model's output must be a tensor (MinkUNet's
    per-voxel logits) or a VoxelTensor (its features are returned)."""

    def __init__(self, model: nn.Module, keys: list[tuple]) -> None:
        super().__init__()
        self.model = model
        self.keys = list(keys)

    def forward(self, feats: Tensor, coords: Tensor) -> Tensor:
        cache = build_voxel_maps(coords, self.keys)
        out = self.model(VoxelTensor._trusted(feats, coords, (1, 1, 1), cache))
        return out.feats if isinstance(out, VoxelTensor) else out


# ---------------------------------------------------------------------------- R-GCN graphs
def build_graph_map(
    edge_index: Tensor, edge_type: Tensor, num_nodes, num_relations: int, aggr: str
) -> RGCNMap:
    """The `RGCNMap` of `relconv.graph.build_rgcn_map` ("mean" or "sum") from tensors alone: pairs
    sorted by (relation, target), each mean scale 1 / (edges into its (target, relation) slot)."""
    if aggr not in ("mean", "sum"):
        raise NotImplementedError(
            f"aggr={aggr!r}: only 'mean' and 'sum' graphs build inside an exported graph"
        )
    src, dst, rel = edge_index[0], edge_index[1], edge_type.long()
    key, perm = torch.sort(rel * num_nodes + dst, stable=True)
    bounds = torch.arange(num_relations + 1, device=key.device) * num_nodes
    rel_ptr = torch.searchsorted(key, bounds)
    scale = None
    if aggr == "mean":
        degree = torch.searchsorted(key, key, right=True) - torch.searchsorted(key, key)
        scale = degree.float().reciprocal()
    rmap = _map(src[perm].int(), dst[perm].int(), rel_ptr, num_nodes, num_nodes, scale)
    return RGCNMap(rmap, aggr, perm)


class GraphExport(nn.Module):
    """`model(x, graph)` as a function of `(x, edge_index, edge_type)`: the graph (one node set,
    `num_relations` edge types, `aggr` "mean" or "sum") is built in the graph. `model` takes the
    `RGCNMap` where relconv's RGCNConv takes `edge_index`."""

    def __init__(self, model: nn.Module, num_relations: int, aggr: str = "mean") -> None:
        super().__init__()
        if aggr not in ("mean", "sum"):
            raise NotImplementedError(f"aggr={aggr!r}: only 'mean' and 'sum' graphs export")
        self.model = model
        self.num_relations = num_relations
        self.aggr = aggr

    def forward(self, x: Tensor, edge_index: Tensor, edge_type: Tensor) -> Tensor:
        graph = build_graph_map(edge_index, edge_type, x.shape[0], self.num_relations, self.aggr)
        return self.model(x, graph)


def export_minkunet(model: nn.Module, feats: Tensor, coords: Tensor) -> torch.export.ExportedProgram:
    """`torch.export` of a voxel network (eval mode) as `(feats, coords) -> output` with a dynamic
    voxel count; maps built in the graph (see the module docstring for the input contract)."""
    wrapper = VoxelExport(model.eval(), voxel_map_keys(model, feats, coords))
    # The bound keeps the size expressions AOTInductor prints (products of run-time sizes, e.g. a
    # level's pair count against the voxel count) within int64.
    n = torch.export.Dim("num_voxels", min=2, max=MAX_VOXELS)
    # Without autograd and without the eval-mode BatchNorm folding: the folded parameters are a
    # cache on the modules, which a trace must not fill.
    with torch.no_grad(), inference_folding(False):
        return torch.export.export(wrapper, (feats, coords), dynamic_shapes=({0: n}, {0: n}))


def export_rgcn(
    model: nn.Module, x: Tensor, edge_index: Tensor, edge_type: Tensor, num_relations: int, aggr: str = "mean"
) -> torch.export.ExportedProgram:
    """`torch.export` of an R-GCN `model(x, graph)` as `(x, edge_index, edge_type) -> output`, node
    and edge counts dynamic."""
    wrapper = GraphExport(model.eval(), num_relations, aggr)
    n = torch.export.Dim("num_nodes", min=2, max=(1 << 31) - 1)
    e = torch.export.Dim("num_edges", min=2, max=(1 << 31) - 1)
    with torch.no_grad():
        return torch.export.export(
            wrapper, (x, edge_index, edge_type), dynamic_shapes=({0: n}, {1: e}, {0: e})
        )
