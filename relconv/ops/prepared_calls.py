"""Prepared `relational_conv` calls kept per map, for layers that call the op on maps of their own."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

from torch import Tensor

from relconv._ext import direct_ok
from relconv.core import RelationalMap
from relconv.ops.relational_conv import conv_call, prepare, run_conv


def forgetting_ref(store: dict, key: object, obj: object) -> weakref.ref:
    """A weak reference to `obj` that drops `key` from `store` (held weakly too) once `obj` is gone."""
    return weakref.ref(obj, functools.partial(_forget, weakref.ref(store), key))


def _forget(store: weakref.ref, key: object, _gone: weakref.ref) -> None:
    owner = store()
    if owner is not None:
        owner.pop(key, None)


class MapCalls(dict):
    """One layer's prepared `relational_conv` calls, by `id` of the `RelationalMap` they run over
    and the activation.

    `calls(x, weight, rmap, bias, activation)` is `relational_conv(x, weight, rmap, bias=bias,
    activation=activation)`. The first call over a map marks it, the second keeps its prepared call
    (`relconv.ops.prepare`: the plan, views and checks decided once), and later calls run that,
    which re-checks in C++ the call state it was prepared under and steps aside when it changed.
    Maps are held weakly: an entry leaves with its map. A bias that needs a cast per call keeps no
    call. Copies and pickles start empty.
    """

    def __call__(
        self,
        x: Tensor,
        weight: Tensor,
        rmap: RelationalMap,
        bias: Tensor | None = None,
        activation: str | None = None,
    ) -> Tensor:
        key = (id(rmap), activation)
        seen = self.get(key)
        if seen is not None and seen[0]() is rmap and seen[1] is not None and direct_ok((x, weight, bias)):
            out = seen[1](x, weight, bias)
            if out is not None:
                return out
        call = conv_call(x, weight, rmap, bias=bias, activation=activation)
        if seen is None or seen[0]() is not rmap:
            self[key] = (forgetting_ref(self, key, rmap), None)
        elif call[0].bias is bias:
            self[key] = (seen[0], prepare(call[0], rmap))
        return run_conv(call)

    def __deepcopy__(self, memo: dict) -> MapCalls:
        return MapCalls()

    def __reduce__(self) -> tuple[Callable[[], MapCalls], tuple]:
        return (MapCalls, ())
