"""Inference folding for TorchSparse models: a conv's BatchNorm and ReLU run inside the conv.

TorchSparse's blocks are torch `nn.Sequential`s of `Conv3d`, `BatchNorm` and `ReLU`, so no container
of relconv's sees a conv-BatchNorm-ReLU run (as `relconv.voxel.Sequential` and
`relconv.spconv.SparseSequential` do). Instead, with autograd off, `Conv3d` returns a `PendingConv`:
a SparseTensor whose conv has not run yet. An eval-mode `BatchNorm` applied to it folds into the
conv's weight and bias (`relconv.voxel.fold`, cached per pair), a `ReLU` becomes the conv's
epilogue, and the first other use of the tensor (its features, coordinates, stride, any method)
runs the conv once: one relconv call where the unfolded network runs three passes over the features.
`relconv.voxel.inference_folding(False)` turns it off.

The conv reads its input when it runs, so the input's features must not be changed in place in
between (as for a tensor autograd saved); a change is detected and raises instead of computing on the
changed values.
"""

from __future__ import annotations

import torch
from torch import nn

from relconv.torchsparse.tensor import SparseTensor
from relconv.voxel.fold import FoldCache


class PendingConv(SparseTensor):
    """The output of `conv(input)` before the conv has run; see the module docstring."""

    def __init__(
        self,
        conv: nn.Module,
        input: SparseTensor,
        version: int | None = None,
        norm: nn.BatchNorm1d | None = None,
        relu: bool = False,
    ) -> None:
        # A plain SparseTensor's state appears in __dict__ only when the conv runs (`_run`).
        version = input.feats._version if version is None else version
        object.__setattr__(self, "_pending", (conv, input, version, norm, relu))

    def __getattr__(self, name: str):
        # Reached only for names not yet in __dict__: before the run, the SparseTensor's state.
        if "_pending" not in self.__dict__ or name.startswith("__"):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        self._run()
        return object.__getattribute__(self, name)

    def __setattr__(self, name: str, value) -> None:
        if "_pending" in self.__dict__:
            self._run()
        object.__setattr__(self, name, value)

    def with_norm(self, norm: nn.BatchNorm1d) -> PendingConv | None:
        """This conv with `norm` folded in, or None where it cannot fold: `norm` normalises by batch
        statistics, has none, autograd is recording, or a norm or ReLU is already in."""
        conv, input, version, old_norm, relu = self._pending_state()
        if old_norm is not None or relu or norm.training or norm.running_mean is None:
            return None
        if torch.is_grad_enabled():
            return None
        return PendingConv(conv, input, version, norm, False)

    def with_relu(self) -> PendingConv | None:
        """This conv with a ReLU epilogue, or None where one is already in or autograd records."""
        conv, input, version, norm, relu = self._pending_state()
        if relu or torch.is_grad_enabled():
            return None
        return PendingConv(conv, input, version, norm, True)

    def _pending_state(self) -> tuple:
        state = self.__dict__.get("_pending")
        if state is None:
            raise RuntimeError("this conv output has already run")
        return state

    def _run(self) -> None:
        conv, input, version, norm, relu = self.__dict__["_pending"]
        if input.feats._version != version:
            raise RuntimeError(
                "the input of a deferred relconv.torchsparse conv was modified in place before the conv "
                "ran; modify a copy instead, or run without inference folding "
                "(relconv.voxel.inference_folding(False))"
            )
        kernel, bias = conv.kernel, conv.bias
        if norm is not None:
            cache = norm.__dict__.get("_relconv_fold")
            if cache is None:
                cache = norm.__dict__["_relconv_fold"] = FoldCache()
            kernel, bias = cache.get_tensors(kernel, bias, 1, norm, input.feats)
        out = conv.run(input, kernel, bias, "relu" if relu else None)
        del self.__dict__["_pending"]
        self.__dict__.update(out.__dict__)

