"""Names of TorchSparse 2.1's API that relconv.torchsparse does not provide, with the reason.

Each package's module-level `__getattr__` raises NotImplementedError for these (also through
`from ... import name`), so code that needs one fails at the name, saying what is missing.
"""

from __future__ import annotations

KERNEL_MAPS = "TorchSparse's kernel-map internals are not provided: relconv builds and caches its own maps"

_BEV = {
    name: (
        f"{name} is not provided by relconv.torchsparse: TorchSparse 2.1's own forward fails (it reads "
        "the indices of a tensor it has made dense); ToDenseBEVConvolution and ToBEVHeightCompression are"
    )
    for name in ("ToBEVConvolution", "ToBEVReduction")
}

MISSING = {
    "torchsparse.nn": _BEV,
    "torchsparse.nn.modules": _BEV,
    "torchsparse.nn.functional": {
        name: KERNEL_MAPS
        for name in ("build_kernel_map", "transpose_kernel_map", "spdownsample", "spupsample_generative")
    },
}


def missing(package: str, name: str) -> NotImplementedError | AttributeError:
    """The error for `package.name`: NotImplementedError for a known TorchSparse name, else the
    usual AttributeError."""
    reason = MISSING.get(package, {}).get(name)
    if reason is not None:
        return NotImplementedError(f"{package}.{name}: {reason}")
    return AttributeError(f"module {package!r} (relconv.torchsparse) has no attribute {name!r}")
