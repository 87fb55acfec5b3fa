"""Loads the compiled extension `relconv._C`, which registers the `torch.ops.relconv` ops."""

import torch

try:
    from relconv import _C
except ImportError as err:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "relconv's compiled extension relconv._C is missing or was built against another torch. "
        "Reinstall with `pip install --no-build-isolation -e .` in the relconv checkout."
    ) from err


def _check_cuda_version() -> None:
    built = _C.cuda_version()
    if built < 0 or torch.version.cuda is None:
        return
    major, minor = (int(v) for v in torch.version.cuda.split(".")[:2])
    built_major, built_minor = built // 1000, (built % 1000) // 10
    if (built_major, built_minor) != (major, minor):
        raise RuntimeError(
            f"relconv was compiled with CUDA {built_major}.{built_minor} but torch uses CUDA "
            f"{major}.{minor}. Rebuild relconv against this torch: "
            "`pip install --no-build-isolation --force-reinstall --no-deps -e .`"
        )


_check_cuda_version()
cuda_built = _C.cuda_version() >= 0


def direct_ok(tensors: tuple) -> bool:
    """Whether a direct entry of `_C` (a typed dispatcher call, no torch.ops argument parsing) may
    run an op over `tensors` (the tensor arguments that can carry a `__torch_function__` override or
    mode): not while torch.compile traces, and not past an override, which only torch.ops sees.
    Both reach the same kernels at every dispatch key (autograd, autocast, device)."""
    return not torch.compiler.is_compiling() and not torch.overrides.has_torch_function(tensors)


def call_op(direct, boxed, args: tuple, tensors: tuple):
    """Calls a relconv op with `args` through its direct entry `direct` (a function of `_C`: ~1.7 us
    less host time per 13-argument call than torch.ops' boxed argument parsing, measured on a CPU
    host), or through `boxed` (its torch.ops overload) where the direct entry would bypass something
    (`direct_ok`)."""
    return direct(*args) if direct_ok(tensors) else boxed(*args)
