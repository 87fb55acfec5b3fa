"""The one table of agreement tolerances: relative error max |a - b| / max |ref| a peer (or a
standalone twin) must meet against relconv before it is timed."""

from __future__ import annotations

# One layer, by compute dtype.
TOLERANCE = {"fp64": 1e-9, "fp32": 1e-4, "tf32": 5e-3, "fp16": 1e-2, "bf16": 4e-2}
# Whole networks compare their fp32 eval-mode outputs (tens of layers of accumulation).
E2E_TOLERANCE = 1e-3
