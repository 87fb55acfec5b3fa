"""The error every `relconv.spconv` module raises for a name of spconv's API it does not provide."""

from __future__ import annotations


def missing(module: str, name: str) -> AttributeError:
    """AttributeError naming the spconv attribute that is missing (an ImportError for `from ... import`)."""
    return AttributeError(
        f"relconv.spconv does not provide {module}.{name}; the shim covers spconv.pytorch 2.3's "
        "layers, SparseConvTensor, functional.sparse_add, utils.PointToVoxel and constants "
        "(docs/compat/spconv.md lists what it provides and what it does not)"
    )
