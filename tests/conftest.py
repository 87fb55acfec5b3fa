"""Shared test configuration: the device axis, the CUDA skip and the global-switch helpers."""

import contextlib

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


@contextlib.contextmanager
def no_host_sync():
    """Fails any CUDA host synchronisation inside the block (torch's sync debug mode), after
    draining the work queued before it."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@contextlib.contextmanager
def allow_tf32(enabled: bool):
    """torch.backends.cuda.matmul.allow_tf32 set to `enabled` inside the block."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
