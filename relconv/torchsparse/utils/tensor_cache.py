"""TorchSparse's tensor-cache switches: only the per-tensor cache (its default) is provided."""

from __future__ import annotations

from enum import Enum

from relconv.torchsparse.tensor import TensorCache

__all__ = ["TensorCache", "TensorCacheMode", "get_tensor_cache_mode", "set_tensor_cache_mode"]


class TensorCacheMode(Enum):
    SEPARATE_TENSOR_CACHE = 0
    GLOBAL_TENSOR_CACHE = 1


def get_tensor_cache_mode() -> TensorCacheMode:
    return TensorCacheMode.SEPARATE_TENSOR_CACHE


def set_tensor_cache_mode(mode: TensorCacheMode) -> None:
    if not isinstance(mode, TensorCacheMode):
        raise TypeError(f"mode must be a TensorCacheMode, got {mode!r}")
    if mode is not TensorCacheMode.SEPARATE_TENSOR_CACHE:
        raise NotImplementedError(
            "GLOBAL_TENSOR_CACHE is not provided by relconv.torchsparse: maps are cached per input "
            "tensor (SEPARATE_TENSOR_CACHE), which every layer output shares"
        )
