"""`install()`: registers relconv.spconv under spconv's module names, for code bases that import
spconv in many files (`import spconv`, `import spconv.pytorch as spconv`, `from spconv.utils import ...`)."""

from __future__ import annotations

import sys
import types

_MARK = "__relconv_spconv__"


def _top_level(pytorch: types.ModuleType) -> types.ModuleType:
    from relconv.spconv import algo, constants
    from relconv.spconv._missing import missing

    top = types.ModuleType("spconv", "relconv's stand-in for spconv (relconv.spconv.install()).")
    top.__path__ = []  # a package, so that `import spconv.pytorch` resolves through sys.modules
    top.__version__ = pytorch.__version__
    top.pytorch, top.constants, top.core = pytorch, constants, algo
    top.ConvAlgo, top.AlgoHint = algo.ConvAlgo, algo.AlgoHint
    top.SPCONV_VERSION_NUMBERS = [int(v) for v in pytorch.__version__.split(".")]
    setattr(top, _MARK, True)

    def top_missing(name: str):
        raise missing("spconv", name)

    top.__getattr__ = top_missing
    utils = types.ModuleType("spconv.utils", "spconv's top-level utils; none are provided by relconv.")

    def utils_missing(name: str):
        raise missing("spconv.utils", name)

    utils.__getattr__ = utils_missing
    setattr(utils, _MARK, True)
    top.utils = utils
    return top


def install() -> None:
    """Makes `import spconv...` load relconv.spconv: registers `spconv`, `spconv.pytorch` and its
    submodules (`conv`, `core`, `functional`, `modules`, `ops`, `pool`, `tables`, `identity`,
    `utils`, `constants`), `spconv.core`, `spconv.constants` and `spconv.utils` in `sys.modules`.

    Idempotent. Raises RuntimeError when the real spconv is already imported (its classes would mix
    with relconv's); call it before anything imports spconv.
    """
    theirs = sorted(
        name
        for name, module in sys.modules.items()
        if (name == "spconv" or name.startswith("spconv."))
        and not getattr(module, _MARK, False)
        and not (module is not None and getattr(module, "__name__", "").startswith("relconv."))
    )
    if theirs:
        raise RuntimeError(
            f"the real spconv is already imported ({', '.join(theirs[:4])}); call "
            "relconv.spconv.install() before anything imports spconv, or import relconv.spconv as spconv"
        )
    if "spconv" in sys.modules:
        return
    import relconv.spconv as pytorch
    from relconv.spconv import (
        algo,
        constants,
        conv,
        core,
        functional,
        identity,
        modules,
        ops,
        pool,
        tables,
        utils,
    )

    top = _top_level(pytorch)
    aliases = {
        "spconv": top,
        "spconv.pytorch": pytorch,
        "spconv.pytorch.conv": conv,
        "spconv.pytorch.core": core,
        "spconv.pytorch.functional": functional,
        "spconv.pytorch.modules": modules,
        "spconv.pytorch.ops": ops,
        "spconv.pytorch.pool": pool,
        "spconv.pytorch.tables": tables,
        "spconv.pytorch.identity": identity,
        "spconv.pytorch.utils": utils,
        "spconv.pytorch.constants": constants,
        "spconv.core": algo,
        "spconv.constants": constants,
        "spconv.utils": top.utils,
    }
    sys.modules.update(aliases)


def uninstall() -> None:
    """Removes the aliases `install()` registered (tests; a later `import spconv` finds the real one)."""
    for name in [n for n in sys.modules if n == "spconv" or n.startswith("spconv.")]:
        module = sys.modules[name]
        if getattr(module, _MARK, False) or getattr(module, "__name__", "").startswith("relconv."):
            del sys.modules[name]
