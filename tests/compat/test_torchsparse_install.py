"""relconv.torchsparse.install(): TorchSparse's module names load the shim, user code written for
TorchSparse runs unchanged, and a real TorchSparse already imported is refused."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

import relconv.torchsparse
from relconv.torchsparse.install import ALIASES


@pytest.fixture
def clean_modules():
    saved = {name: sys.modules[name] for name in list(sys.modules) if name.split(".")[0] == "torchsparse"}
    for name in saved:
        del sys.modules[name]
    yield
    for name in [n for n in sys.modules if n.split(".")[0] == "torchsparse"]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_install_registers_every_alias(clean_modules):
    relconv.torchsparse.install()
    for name, target in ALIASES.items():
        assert sys.modules[name] is sys.modules[target]
    relconv.torchsparse.install()  # again: harmless


def test_torchsparse_user_code_runs_unchanged(clean_modules):
    relconv.torchsparse.install()
    import torchsparse
    from torch import nn
    from torchsparse import SparseTensor
    from torchsparse import nn as spnn
    from torchsparse.backbones import SparseResUNet42
    from torchsparse.nn import functional as F
    from torchsparse.utils.collate import sparse_collate_fn
    from torchsparse.utils.quantize import sparse_quantize

    assert torchsparse.__version__ == "2.1.0"
    conv_config = F.get_default_conv_config()
    F.set_global_conv_config(conv_config)
    F.clear_global_conv_config()
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(2):
        inputs = rng.uniform(-10, 10, size=(500, 4))
        coords, feats = inputs[:, :3], inputs
        coords -= np.min(coords, axis=0, keepdims=True)
        coords, indices = sparse_quantize(coords, 1.0, return_index=True)
        coords = torch.tensor(coords, dtype=torch.int)
        samples.append(
            {"input": SparseTensor(coords=coords, feats=torch.tensor(feats[indices], dtype=torch.float))}
        )
    batch = sparse_collate_fn(samples)["input"]
    model = nn.Sequential(
        spnn.Conv3d(4, 8, 3),
        spnn.BatchNorm(8),
        spnn.ReLU(True),
        spnn.Conv3d(8, 8, 2, stride=2),
        spnn.Conv3d(8, 8, 2, stride=2, transposed=True),
        spnn.Conv3d(8, 3, 1),
    )
    out = model(batch)
    assert out.F.shape == (batch.F.shape[0], 3) and out.C is batch.C
    out.F.sum().backward()
    unet = SparseResUNet42(in_channels=4, width_multiplier=0.25)
    assert len(unet(batch)) == 9


def test_refuses_when_the_real_torchsparse_is_imported(clean_modules):
    real = types.ModuleType("torchsparse")
    real.__file__ = "/site-packages/torchsparse/__init__.py"
    sys.modules["torchsparse"] = real
    with pytest.raises(RuntimeError, match="real TorchSparse is already imported"):
        relconv.torchsparse.install()
    assert "torchsparse.nn" not in sys.modules


def test_missing_top_level_names():
    with pytest.raises(AttributeError, match="SparseConvTensor"):
        relconv.torchsparse.SparseConvTensor  # noqa: B018
    assert relconv.torchsparse.tune(None) is None
