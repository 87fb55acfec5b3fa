"""spconv.pytorch 2.3's API on relconv: replace `import spconv.pytorch as spconv` with
`import relconv.spconv as spconv`, or call `relconv.spconv.install()` once before a code base imports
`spconv` anywhere. Weights keep spconv's layout and load from spconv `state_dict`s unchanged; output
sites and features follow spconv's semantics (docs/compat/spconv.md lists what differs and what is
not provided; anything not provided raises an AttributeError naming it).
"""

from __future__ import annotations

from relconv.spconv import constants, functional, ops, utils
from relconv.spconv._missing import missing
from relconv.spconv.algo import ConvAlgo
from relconv.spconv.conv import (
    SparseConv1d,
    SparseConv2d,
    SparseConv3d,
    SparseConv4d,
    SparseConvolution,
    SparseConvTranspose1d,
    SparseConvTranspose2d,
    SparseConvTranspose3d,
    SparseConvTranspose4d,
    SparseInverseConv1d,
    SparseInverseConv2d,
    SparseInverseConv3d,
    SparseInverseConv4d,
    SubMConv1d,
    SubMConv2d,
    SubMConv3d,
    SubMConv4d,
)
from relconv.spconv.core import SparseConvTensor
from relconv.spconv.identity import Identity
from relconv.spconv.install import install
from relconv.spconv.modules import (
    RemoveGrid,
    SparseBatchNorm,
    SparseIdentity,
    SparseModule,
    SparseReLU,
    SparseSequential,
    ToDense,
    assign_name_for_sparse_modules,
    is_spconv_module,
)
from relconv.spconv.pool import (
    SparseAvgPool1d,
    SparseAvgPool2d,
    SparseAvgPool3d,
    SparseGlobalAvgPool,
    SparseGlobalMaxPool,
    SparseMaxPool1d,
    SparseMaxPool2d,
    SparseMaxPool3d,
    SparseMaxPool4d,
)
from relconv.spconv.tables import AddTable, ConcatTable, JoinTable

__all__ = [
    "AddTable",
    "ConcatTable",
    "ConvAlgo",
    "Identity",
    "JoinTable",
    "RemoveGrid",
    "SparseAvgPool1d",
    "SparseAvgPool2d",
    "SparseAvgPool3d",
    "SparseBatchNorm",
    "SparseConv1d",
    "SparseConv2d",
    "SparseConv3d",
    "SparseConv4d",
    "SparseConvTensor",
    "SparseConvTranspose1d",
    "SparseConvTranspose2d",
    "SparseConvTranspose3d",
    "SparseConvTranspose4d",
    "SparseConvolution",
    "SparseGlobalAvgPool",
    "SparseGlobalMaxPool",
    "SparseIdentity",
    "SparseInverseConv1d",
    "SparseInverseConv2d",
    "SparseInverseConv3d",
    "SparseInverseConv4d",
    "SparseMaxPool1d",
    "SparseMaxPool2d",
    "SparseMaxPool3d",
    "SparseMaxPool4d",
    "SparseModule",
    "SparseReLU",
    "SparseSequential",
    "SubMConv1d",
    "SubMConv2d",
    "SubMConv3d",
    "SubMConv4d",
    "ToDense",
    "assign_name_for_sparse_modules",
    "constants",
    "functional",
    "install",
    "is_spconv_module",
    "ops",
    "utils",
]

# The spconv release whose API this mirrors (OpenPCDet and mmdetection3d read it).
__version__ = "2.3.8"


def __getattr__(name: str):
    raise missing("spconv.pytorch", name)
