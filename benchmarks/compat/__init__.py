"""Parity and speed of relconv's spconv / TorchSparse shims on downstream backbones.

The backbones come from snapshots of OpenPCDet, Pointcept and TorchSparse unpacked under
`.peers/downstream` (never part of this repository); each (backbone, library) runs in its own child
process (`child.py`), because the real libraries and the shims register the same module names.
`parity.py` compares outputs and gradients, `speed.py` times them; both write JSON and markdown.
"""
