"""Shared test configuration: the device axis and the CUDA skip."""

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Every device-parametrised test runs on CPU everywhere and on CUDA where a GPU exists; the CUDA
# case carries the `cuda` marker so `pytest -m cuda` selects exactly the GPU tests on the GPU host.
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, requires_cuda]),
]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cuda" in item.keywords and not item.get_closest_marker("cuda"):
            item.add_marker(pytest.mark.cuda)
