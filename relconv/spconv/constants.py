"""spconv's switches that user code sets (`spconv.constants`, `spconv.pytorch.constants`).

They are accepted and have no effect: relconv picks its own kernels and map builders.
"""

from __future__ import annotations

import torch

from relconv.spconv._missing import missing

SPCONV_USE_DIRECT_TABLE = True
SPCONV_ALLOW_TF32 = False
SPCONV_FX_TRACE_MODE = False
SPCONV_DEBUG_WEIGHT = False
SAVED_WEIGHT_LAYOUT = ""
ALL_WEIGHT_IS_KRSC = True
FILTER_HWIO = False
PYTORCH_VERSION = [int(v) for v in torch.__version__.split("+")[0].split(".")[:3] if v.isdigit()]
TORCH_HAS_AMP = True


def is_amp_enabled() -> bool:
    return torch.is_autocast_enabled()


def __getattr__(name: str):
    raise missing("spconv.constants", name)
