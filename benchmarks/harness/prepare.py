"""Generic pieces every voxel implementation (relconv and each peer adapter) builds its `Prepared` from.

Kept apart from benchmarks/voxel_suite.py so that the peer adapters (benchmarks/peers/<peer>.py)
import them without importing the suite that imports them.
"""

from __future__ import annotations

import contextlib

import torch

from benchmarks.harness.bench import _align
from benchmarks.harness.floor import DTYPES
from benchmarks.harness.timing import rotation_count


def set_tf32(enabled: bool) -> None:
    """TF32 on or off for matmuls and cuDNN, left that way (every timed call sets what it needs).
    Set only on a change: this runs inside timed calls, and the setters cost microseconds."""
    if torch.backends.cuda.matmul.allow_tf32 != enabled or torch.backends.cudnn.allow_tf32 != enabled:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled


@contextlib.contextmanager
def precision(dtype_name: str, device: torch.device, autocast: bool = False):
    """TF32 on only for "tf32"; autocast to fp16/bf16 when asked (end-to-end mixed precision)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    want = dtype_name == "tf32"
    switch = old != (want, want)
    set_tf32(want)
    try:
        if autocast and dtype_name in ("fp16", "bf16"):
            with torch.autocast(device.type, dtype=DTYPES[dtype_name]):
                yield
        else:
            yield
    finally:
        if switch:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def features(n: int, c: int, dtype: torch.dtype, device: torch.device, seed: int, count: int | None = None):
    """`count` (default: enough to rotate through caches) seeded random [n, c] feature tensors."""
    gen = torch.Generator().manual_seed(seed)
    count = count or rotation_count(n * c * dtype.itemsize, device)
    return [torch.randn(n, c, generator=gen).to(device, dtype) for _ in range(count)]


def reorder(values: torch.Tensor, keys: torch.Tensor, ref_keys: torch.Tensor) -> torch.Tensor:
    """Rows of `values` (ordered by `keys`) in the order of `ref_keys`."""
    out = _align(keys, values, ref_keys)
    if out is None:
        raise RuntimeError("the peer's coarse sites differ from relconv's")
    # Detached: `values` may already require grad (relconv's fwd+bwd setup marks the shared inputs),
    # and a gather that stays in the graph made every timed backward after the first one fail with
    # "Trying to backward through the graph a second time" (up2 fwd+bwd of both peers).
    return out.to(values.device).detach()


def training(spec: dict) -> bool:
    """Layers run in training mode only for fwd+bwd rows. spconv (and TorchSparse++) build extra
    backward maps and split their forward kernel in training mode, so a forward-only row with a
    module left in its default training mode timed work an inference user never runs."""
    return spec["pass_"] == "fwd+bwd"


def layer_fn(spec: dict, make_output, params, inputs, upstream, device, library_precision=None):
    """The timed function of a layer case and the state it runs under, `(fn, held)` for `Prepared`.

    fn: the forward (under no_grad, as a user's inference loop runs it), or forward + backward of
    `upstream`. held: TF32 as the dtype asks and the peer's own precision switch
    (`library_precision(dtype_name)`), set once around the timed loop like a user sets them."""
    lib = library_precision or (lambda _: contextlib.nullcontext())

    @contextlib.contextmanager
    def held():
        with precision(spec["dtype"], device), lib(spec["dtype"]):
            yield

    if spec["pass_"] == "fwd":

        def fn(f):
            with torch.no_grad():
                return make_output(f)

        return fn, held
    # Every input becomes a leaf (replaced in place in the list the Prepared rotates through), so a
    # timed run's graph starts at its input and never reaches anything built before timing.
    for i, f in enumerate(inputs):
        inputs[i] = f.detach().requires_grad_(True)

    def fn(f):
        for p in params:
            p.grad = None
        f.grad = None
        make_output(f).backward(upstream)

    return fn, held
