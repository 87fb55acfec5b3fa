"""`install()`: makes `import torchsparse...` load relconv.torchsparse, for code bases that import
TorchSparse in many files."""

from __future__ import annotations

import importlib
import sys

# The TorchSparse module names a user may import, and the relconv modules that serve them.
ALIASES = {
    "torchsparse": "relconv.torchsparse",
    "torchsparse.tensor": "relconv.torchsparse.tensor",
    "torchsparse.operators": "relconv.torchsparse.operators",
    "torchsparse.backends": "relconv.torchsparse.backends",
    "torchsparse.nn": "relconv.torchsparse.nn",
    "torchsparse.nn.modules": "relconv.torchsparse.nn.modules",
    **{
        f"torchsparse.nn.modules.{m}": "relconv.torchsparse.nn.modules"
        for m in ("activation", "bev", "conv", "crop", "norm", "pooling")
    },
    "torchsparse.nn.functional": "relconv.torchsparse.nn.functional",
    "torchsparse.nn.functional.conv": "relconv.torchsparse.nn.functional.conv",
    "torchsparse.nn.functional.conv.conv_config": "relconv.torchsparse.nn.functional.conv_config",
    "torchsparse.nn.functional.conv.conv_mode": "relconv.torchsparse.nn.functional.conv_config",
    "torchsparse.nn.utils": "relconv.torchsparse.nn.utils",
    "torchsparse.utils": "relconv.torchsparse.utils",
    "torchsparse.utils.quantize": "relconv.torchsparse.utils.quantize",
    "torchsparse.utils.collate": "relconv.torchsparse.utils.collate",
    "torchsparse.utils.tensor_cache": "relconv.torchsparse.utils.tensor_cache",
    "torchsparse.backbones": "relconv.torchsparse.backbones",
    "torchsparse.backbones.modules": "relconv.torchsparse.backbones.modules",
    "torchsparse.backbones.resnet": "relconv.torchsparse.backbones.resnet",
    "torchsparse.backbones.unet": "relconv.torchsparse.backbones.unet",
}


def install() -> None:
    """Registers relconv.torchsparse under TorchSparse's module names in `sys.modules`, so that
    `import torchsparse`, `import torchsparse.nn as spnn`, `from torchsparse.utils.quantize import
    sparse_quantize` ... load the shim. Call it before anything imports TorchSparse; calling it
    again is harmless.

    Raises:
        RuntimeError: the real TorchSparse is already imported (its modules would mix with the
            shim's: tensors of one passed to layers of the other).
    """
    for name in ALIASES:
        present = sys.modules.get(name)
        if present is not None and not getattr(present, "__name__", "").startswith("relconv.torchsparse"):
            raise RuntimeError(
                f"the real TorchSparse is already imported ({name!r} from "
                f"{getattr(present, '__file__', '?')}); "
                "call relconv.torchsparse.install() before anything imports torchsparse, or import "
                "relconv.torchsparse directly instead"
            )
    for name, target in ALIASES.items():
        sys.modules[name] = importlib.import_module(target)
