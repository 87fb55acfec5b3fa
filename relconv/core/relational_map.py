"""RelationalMap: the (input, output, relation) pairs that every relconv op consumes."""

from __future__ import annotations

import torch
from torch import Tensor

_INT32_MAX = 2**31 - 1


def index_dtype_for(*sizes: int) -> torch.dtype:
    """int32 while every index and pair count fits, int64 beyond 2^31 - 1."""
    return torch.int32 if max(sizes, default=0) <= _INT32_MAX else torch.int64


class RelationalMap:
    """Pairs `(in_index[p], out_index[p])` grouped by relation.

    Pairs of relation `r` are `p in [rel_ptr[r], rel_ptr[r+1])`. The sizes a kernel launch needs are
    plain ints, so a forward pass over a built map never reads device memory on the host.

    Attributes:
        in_index:  [P] int32/int64, row of the input features.
        out_index: [P] same dtype, row of the output.
        rel_ptr:   [R + 1] int64, CSR offsets over relations (monotone, rel_ptr[-1] == P).
        scale:     optional [P] float per-pair factor (e.g. 1/deg for mean aggregation).
        num_in, num_out, num_relations: plain ints.
        unique_slots: True when every (out, relation) slot has at most one input (voxel maps);
            enables the output-stationary neighbour table.
    """

    __slots__ = (
        "in_index",
        "out_index",
        "rel_ptr",
        "scale",
        "num_in",
        "num_out",
        "num_relations",
        "unique_slots",
        "_cache",
    )

    def __init__(
        self,
        in_index: Tensor,
        out_index: Tensor,
        rel_ptr: Tensor,
        num_in: int,
        num_out: int,
        scale: Tensor | None = None,
        unique_slots: bool = False,
        validate: bool = True,
    ) -> None:
        self.in_index = in_index
        self.out_index = out_index
        self.rel_ptr = rel_ptr
        self.scale = scale
        self.num_in = int(num_in)
        self.num_out = int(num_out)
        self.num_relations = int(rel_ptr.numel()) - 1
        self.unique_slots = bool(unique_slots)
        self._cache: dict[str, object] = {}
        self._check_metadata()
        if validate:
            self.validate()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_triples(
        cls,
        in_index: Tensor,
        out_index: Tensor,
        relation: Tensor,
        num_in: int,
        num_out: int,
        num_relations: int,
        scale: Tensor | None = None,
        index_dtype: torch.dtype | None = None,
    ) -> RelationalMap:
        """Builds a map from unsorted triples `(in_index[e], out_index[e], relation[e])`.

        Pairs are sorted by (relation, out_index, in_index): grouped by relation for the kernels, and
        in a canonical order so that maps built on CPU and CUDA compare equal. Validates ranges
        (one host synchronisation, at build time only).
        """
        for name, t in (("in_index", in_index), ("out_index", out_index), ("relation", relation)):
            if not isinstance(t, Tensor) or t.dim() != 1:
                raise ValueError(f"{name} must be a 1-D tensor, got {_describe(t)}")
            if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
            if t.numel() != in_index.numel():
                raise ValueError(
                    f"{name} has {t.numel()} entries but in_index has {in_index.numel()}; "
                    "triples must have equal lengths"
                )
            if t.device != in_index.device:
                raise ValueError(f"{name} is on {t.device} but in_index is on {in_index.device}")
        if num_relations < 1:
            raise ValueError(f"num_relations must be positive, got {num_relations}")
        for name, n in (("num_in", num_in), ("num_out", num_out)):
            if n < 0:
                raise ValueError(f"{name} must be non-negative, got {n}")
        relation = relation.long()
        if relation.numel():
            lo, hi = torch.aminmax(relation)
            if lo.item() < 0 or hi.item() >= num_relations:
                raise ValueError(
                    f"relation values must lie in [0, {num_relations}), got [{lo.item()}, {hi.item()}]"
                )
        _check_range("in_index", in_index, num_in)
        _check_range("out_index", out_index, num_out)
        # Composite key (relation, out, in) fits int64 whenever R * num_out * num_in < 2^63; otherwise
        # fall back to two stable sorts.
        key_space = max(num_relations, 1) * max(num_out, 1) * max(num_in, 1)
        if key_space < 2**62:
            key = (relation * max(num_out, 1) + out_index.long()) * max(num_in, 1) + in_index.long()
            order = torch.sort(key, stable=True).indices
        else:
            order = torch.sort(in_index.long(), stable=True).indices
            order = order[torch.sort(out_index.long()[order], stable=True).indices]
            order = order[torch.sort(relation[order], stable=True).indices]
        counts = torch.bincount(relation, minlength=num_relations)
        rel_ptr = torch.zeros(num_relations + 1, dtype=torch.int64, device=relation.device)
        torch.cumsum(counts, 0, out=rel_ptr[1:])
        idt = index_dtype or index_dtype_for(num_in, num_out, in_index.numel())
        if scale is not None:
            scale = _check_scale(scale, in_index.numel(), in_index.device)[order]
        return cls(
            in_index[order].to(idt),
            out_index[order].to(idt),
            rel_ptr,
            num_in,
            num_out,
            scale=scale,
            unique_slots=False,
            validate=False,
        )

    # ------------------------------------------------------------------ properties
    @property
    def num_pairs(self) -> int:
        return self.in_index.numel()

    @property
    def device(self) -> torch.device:
        return self.in_index.device

    def __repr__(self) -> str:
        return (
            f"RelationalMap(num_in={self.num_in}, num_out={self.num_out}, "
            f"num_relations={self.num_relations}, num_pairs={self.num_pairs}, "
            f"index_dtype={self.in_index.dtype}, scale={self.scale is not None}, device={self.device})"
        )

    # ------------------------------------------------------------------ derived maps
    def transpose(self) -> RelationalMap:
        """The map with inputs and outputs swapped (transposed conv, input gradient). Cached."""
        t = self._cache.get("transpose")
        if t is None:
            t = RelationalMap(
                self.out_index,
                self.in_index,
                self.rel_ptr,
                self.num_out,
                self.num_in,
                scale=self.scale,
                unique_slots=False,
                validate=False,
            )
            t._cache["transpose"] = self
            self._cache["transpose"] = t
        return t

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RelationalMap:
        device = torch.device(device)
        if device == self.device:
            return self
        return RelationalMap(
            self.in_index.to(device, non_blocking=non_blocking),
            self.out_index.to(device, non_blocking=non_blocking),
            self.rel_ptr.to(device, non_blocking=non_blocking),
            self.num_in,
            self.num_out,
            scale=None if self.scale is None else self.scale.to(device, non_blocking=non_blocking),
            unique_slots=self.unique_slots,
            validate=False,
        )

    def with_scale(self, scale: Tensor | None) -> RelationalMap:
        """The same pairs with another per-pair scale (given in this map's pair order)."""
        if scale is not None:
            scale = _check_scale(scale, self.num_pairs, self.device)
        m = RelationalMap(
            self.in_index,
            self.out_index,
            self.rel_ptr,
            self.num_in,
            self.num_out,
            scale=scale,
            unique_slots=self.unique_slots,
            validate=False,
        )
        return m

    def relation_of_pairs(self) -> Tensor:
        """[P] int64 relation of each pair (cached)."""
        rel = self._cache.get("relation")
        if rel is None:
            counts = self.rel_ptr.diff()
            rel = torch.repeat_interleave(
                torch.arange(self.num_relations, device=self.device), counts, output_size=self.num_pairs
            )
            self._cache["relation"] = rel
        return rel

    def neighbor_table(self) -> Tensor:
        """Output-stationary table `[num_out, R]`: input row feeding (out, relation), or -1. Cached.

        Only defined when every slot has at most one input (`unique_slots`), as in voxel maps.
        """
        if not self.unique_slots:
            raise ValueError(
                "neighbor_table needs a map with at most one input per (output, relation) slot "
                "(unique_slots=True); graph maps use the pair lists instead"
            )
        table = self._cache.get("neighbor_table")
        if table is None:
            table = torch.full(
                (self.num_out, self.num_relations), -1, dtype=self.in_index.dtype, device=self.device
            )
            table[self.out_index.long(), self.relation_of_pairs()] = self.in_index
            self._cache["neighbor_table"] = table
        return table

    # ------------------------------------------------------------------ validation
    def _check_metadata(self) -> None:
        """Checks shapes, dtypes and devices (no device reads)."""
        ii, oi, rp = self.in_index, self.out_index, self.rel_ptr
        for name, t in (("in_index", ii), ("out_index", oi), ("rel_ptr", rp)):
            if not isinstance(t, Tensor) or t.dim() != 1:
                raise ValueError(f"{name} must be a 1-D tensor, got {_describe(t)}")
        if ii.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"in_index must be int32 or int64, got {ii.dtype}")
        if oi.dtype != ii.dtype:
            raise ValueError(f"out_index dtype {oi.dtype} must match in_index dtype {ii.dtype}")
        if rp.dtype != torch.int64:
            raise ValueError(f"rel_ptr must be int64, got {rp.dtype}")
        if ii.numel() != oi.numel():
            raise ValueError(
                f"in_index ({ii.numel()} pairs) and out_index ({oi.numel()} pairs) differ in length"
            )
        if rp.numel() < 2:
            raise ValueError(f"rel_ptr needs num_relations + 1 >= 2 entries, got {rp.numel()}")
        for name, t in (("out_index", oi), ("rel_ptr", rp)):
            if t.device != ii.device:
                raise ValueError(f"{name} is on {t.device} but in_index is on {ii.device}")
        if self.scale is not None:
            self.scale = _check_scale(self.scale, ii.numel(), ii.device)
        for name, n in (("num_in", self.num_in), ("num_out", self.num_out)):
            if n < 0:
                raise ValueError(f"{name} must be non-negative, got {n}")
        if ii.dtype == torch.int32 and max(self.num_in, self.num_out) > _INT32_MAX:
            raise ValueError("int32 indices cannot address more than 2^31 - 1 rows; use int64")

    def validate(self) -> RelationalMap:
        """Checks index ranges and rel_ptr against the data (synchronises with the device)."""
        rp = self.rel_ptr
        if rp[0].item() != 0:
            raise ValueError(f"rel_ptr must start at 0, got {rp[0].item()}")
        if rp[-1].item() != self.num_pairs:
            raise ValueError(
                f"rel_ptr[-1] = {rp[-1].item()} must equal the number of pairs ({self.num_pairs})"
            )
        if (rp.diff() < 0).any().item():
            raise ValueError("rel_ptr must be monotone non-decreasing")
        _check_range("in_index", self.in_index, self.num_in)
        _check_range("out_index", self.out_index, self.num_out)
        return self


def _describe(t: object) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__


def _check_range(name: str, index: Tensor, size: int) -> None:
    if index.numel() == 0:
        return
    lo, hi = torch.aminmax(index)
    if lo.item() < 0 or hi.item() >= size:
        raise ValueError(f"{name} values must lie in [0, {size}), got [{lo.item()}, {hi.item()}]")


def _check_scale(scale: Tensor, num_pairs: int, device: torch.device) -> Tensor:
    if not isinstance(scale, Tensor) or not scale.dtype.is_floating_point:
        raise ValueError(f"scale must be a floating-point tensor, got {_describe(scale)}")
    if scale.dim() != 1 or scale.numel() != num_pairs:
        raise ValueError(f"scale must have shape [{num_pairs}] (one per pair), got {tuple(scale.shape)}")
    if scale.device != device:
        raise ValueError(f"scale is on {scale.device} but the pairs are on {device}")
    return scale
