"""What the voxel suite needs from a peer: one `VoxelPeer` per adapter module, which the suite iterates.

Each benchmarks/peers/<peer>.py ends with `PEER = VoxelPeer(...)`; benchmarks/voxel_suite.py lists
those and never names a peer's API. A case function receives the set-up object of the case
(relconv's side, built first: spec, scene, device, weights and inputs; see `LayerSetup` and
`E2ESetup` in benchmarks/harness/voxel_setup.py) and returns the peer's `Prepared`, or raises
`Unsupported` with the reason. The peer's own sparse tensor, layers, weight layout, map-caching
idiom and notes all stay in its module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.harness.bench import Prepared
    from benchmarks.harness.voxel_setup import E2ESetup, LayerSetup


@dataclass(frozen=True)
class VoxelPeer:
    """name: the implementation name of the peer's rows (and of `--peers`).
    available: () -> (importable, version or why not); called once per run, before any case.
    layer_case: one conv layer of a `layer/...` case, timed as `Prepared.fn`.
    e2e_case: the whole MinkUNet of an `e2e/...` case (inference or a training step)."""

    name: str
    available: Callable[[], tuple[bool, str]]
    layer_case: Callable[[LayerSetup], Prepared]
    e2e_case: Callable[[E2ESetup], Prepared]
