"""Shared test configuration: the device axis, the CUDA skip and the global-switch helpers.

A GPU test says so in one way only: the `cuda` marker (on the test, its module's `pytestmark`, or the
`pytest.param` of its CUDA case; `DEVICES` carries it for device-parametrised tests). Marked tests
are skipped here where no GPU exists, and `pytest -m cuda` selects exactly them on the GPU host."""

import contextlib
import gc

import pytest
import torch

# Every device-parametrised test runs on CPU everywhere and on CUDA where a GPU exists.
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


def _cuda_case(item) -> bool:
    """Whether a parametrised test's case hands it a CUDA device."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(v, (str, torch.device)) and str(v).startswith("cuda") for v in params.values())


def pytest_collection_modifyitems(config, items):
    unmarked = [item.nodeid for item in items if _cuda_case(item) and not item.get_closest_marker("cuda")]
    if unmarked:
        raise pytest.UsageError("CUDA cases without the `cuda` marker: " + ", ".join(unmarked))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)


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


def cuda_kernels(fn) -> list[str]:
    """Names of the CUDA kernels (and copies, memsets) that `fn` launches, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def cyclic_garbage(fn) -> list[str]:
    """Type names of the objects that `fn()` leaves in reference cycles: what only Python's cycle
    collector would free (device memory, for tensors on a GPU)."""
    # Earlier tests' cycles go first, to the last: freeing some (compiled graphs' fake tensors)
    # leaves others for the next pass.
    while gc.collect():
        pass
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fn()
        gc.collect()
        return sorted(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
