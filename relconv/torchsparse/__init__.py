"""TorchSparse 2.1's API on relconv: `import relconv.torchsparse as torchsparse`.

`SparseTensor`, `torchsparse.nn` (`Conv3d` with TorchSparse's `kernel` layout and offset order,
BatchNorm, activations, global pooling, `ToDenseBEVConvolution`), `nn.functional`,
`utils.quantize.sparse_quantize`, `utils.collate.sparse_collate_fn` and the backbones
`SparseResNet21D` and `SparseResUNet42`, with TorchSparse's coordinates and state_dict keys.
`install()` registers the `torchsparse.*` module names. See docs/compat/torchsparse.md.
"""

from relconv.torchsparse import backends
from relconv.torchsparse._missing import missing
from relconv.torchsparse.install import install
from relconv.torchsparse.operators import cat, generative_add
from relconv.torchsparse.tensor import PointTensor, SparseTensor

__version__ = "2.1.0"

__all__ = ["PointTensor", "SparseTensor", "backends", "cat", "generative_add", "install", "tune"]


def tune(*args, **kwargs) -> None:
    """TorchSparse's dataflow tuner; relconv chooses each layer's dataflow itself, so this does
    nothing (it accepts TorchSparse's arguments and returns None)."""


def __getattr__(name: str):
    # Submodules load on first use (`relconv.torchsparse.nn`, `.utils`, `.backbones`).
    if name in ("nn", "utils", "backbones"):
        import importlib

        return importlib.import_module(f"relconv.torchsparse.{name}")
    raise missing("torchsparse", name)
