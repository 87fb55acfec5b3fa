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
changed values. An output used both through a BatchNorm or ReLU and on its own runs its conv once
for each (folded, then plain): the same values, one more conv. Copying or pickling an output runs
its conv first.

In training (or with autograd on) the same deferral joins a `BatchNorm` and the in-place `ReLU`
after it, as `relconv.voxel.Sequential` does: `BatchNorm` returns a `PendingNorm`, and an in-place
`ReLU` applied to it runs the norm once with the ReLU inside (relconv's `batch_norm_act`: no ReLU
kernel forward or backward); any other first use runs the norm alone. Either way the norm runs
exactly once (its running statistics are updated once), with the autograd and training mode of
its call; a norm whose output is never used does not run.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import nn

from relconv.torchsparse.tensor import SparseTensor
from relconv.voxel.fold import FoldCache
from relconv.voxel.nn import norm_act


class _Call(NamedTuple):
    conv: nn.Module
    input: SparseTensor
    version: int  # of the input's features when the conv was called
    norm: nn.BatchNorm1d | None
    relu: bool
    autocast: tuple[str, torch.dtype | None]  # (device type, autocast dtype or None where off) at the call


# Every conv-BatchNorm-ReLU block builds three: from a tuple of all fields, with no Python frame
# (the class call runs namedtuple's generated `__new__`; `_replace` two frames and a keyword dict).
_new_call = functools.partial(tuple.__new__, _Call)


class _Deferred(SparseTensor):
    """A SparseTensor whose features are computed at their first use: `_pending` holds the call
    (with the `input` it reads and that input's feature `version` at the call), the subclass's
    `_result(call)` computes it. After the run it is a plain SparseTensor."""

    # Raised where the input's features were changed in place between the call and the run.
    _modified: str

    @property
    def feats(self):
        # The attribute read most (`F` reads it too): a property, where `__getattr__` would be
        # reached only after a failed lookup (about 4 of the 25 us of a cached conv call on a CPU host).
        state = self.__dict__
        if "_pending" in state:
            self._run()
        return state["feats"]

    @feats.setter
    def feats(self, value) -> None:
        state = self.__dict__
        if "_pending" in state:
            self._run()
        state["feats"] = value

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

    def __reduce_ex__(self, protocol):
        # A copy or a pickle is of the result: the call runs first (and the tensor becomes a plain
        # SparseTensor, which is what is copied).
        if "_pending" in self.__dict__:
            self._run()
        return object.__reduce_ex__(self, protocol)

    def _run(self) -> None:
        state = self.__dict__
        call = state["_pending"]
        if call.input.feats._version != call.version:
            raise RuntimeError(self._modified)
        out = self._result(call)
        del state["_pending"]
        state.update(out.__dict__)
        # Run, it is a plain SparseTensor: later reads of its features skip the property.
        object.__setattr__(self, "__class__", SparseTensor)


class PendingConv(_Deferred):
    """The output of `conv(input)` before the conv has run; see the module docstring."""

    _modified = (
        "the input of a deferred relconv.torchsparse conv was modified in place before the conv "
        "ran; modify a copy instead, or run without inference folding "
        "(relconv.voxel.inference_folding(False))"
    )

    def __init__(self, conv: nn.Module, input: SparseTensor) -> None:
        # A plain SparseTensor's state appears in __dict__ only when the conv runs (`_run`).
        feats = input.feats
        device = "cuda" if feats.is_cuda else feats.device.type
        autocast = (device, torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None)
        object.__setattr__(self, "_pending", _new_call((conv, input, feats._version, None, False, autocast)))

    def with_norm(self, norm: nn.BatchNorm1d) -> PendingConv | None:
        """This conv with `norm` folded in, or None where it cannot fold: the conv has run, `norm`
        normalises by batch statistics or has none, autograd is recording, or a norm or ReLU is
        already in."""
        call = self.__dict__.get("_pending")
        if call is None or call.norm is not None or call.relu or torch.is_grad_enabled():
            return None
        if norm.training or norm._buffers.get("running_mean") is None:  # the registry: no Module.__getattr__
            return None
        return _pending(_new_call((call.conv, call.input, call.version, norm, False, call.autocast)))

    def with_relu(self) -> PendingConv | None:
        """This conv with a ReLU epilogue, or None where it has run, has one or autograd records."""
        call = self.__dict__.get("_pending")
        if call is None or call.relu or torch.is_grad_enabled():
            return None
        return _pending(_new_call((call.conv, call.input, call.version, call.norm, True, call.autocast)))

    def _result(self, call: _Call) -> SparseTensor:
        device, dtype = call.autocast
        now = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        if torch.is_grad_enabled() or now != dtype:
            # Used elsewhere than called: the conv runs as it would have at its call.
            with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=dtype is not None):
                return _conv(call)
        return _conv(call)


class _NormCall(NamedTuple):
    norm: nn.BatchNorm1d
    input: SparseTensor
    version: int  # of the input's features when the norm was called
    grad: bool  # autograd on at the call
    training: bool  # the norm's mode at the call
    relu: bool


_new_norm_call = functools.partial(tuple.__new__, _NormCall)


class PendingNorm(_Deferred):
    """The output of a BatchNorm before it has run; see the module docstring."""

    _modified = (
        "the input of a relconv.torchsparse BatchNorm was modified in place before the norm's "
        "output was used; modify a copy instead"
    )

    def __init__(self, norm: nn.BatchNorm1d, input: SparseTensor) -> None:
        call = (norm, input, input.feats._version, torch.is_grad_enabled(), norm.training, False)
        object.__setattr__(self, "_pending", _new_norm_call(call))

    def with_relu(self) -> SparseTensor | None:
        """The norm run once with an in-place ReLU inside (this tensor then holds that result, as an
        in-place ReLU leaves it), or None where it has run."""
        state = self.__dict__
        call = state.get("_pending")
        if call is None:
            return None
        state["_pending"] = _new_norm_call((*call[:-1], True))  # relu, the last field
        self._run()
        return self._like(state["feats"])

    def _result(self, call: _NormCall) -> SparseTensor:
        x, norm = call.input, call.norm
        if torch.is_grad_enabled() == call.grad and norm.training == call.training:
            return x._like(norm_act(norm, x.feats, call.relu))
        # Used elsewhere than called: the norm runs as it would have at its call.
        training = norm.training
        try:
            norm.training = call.training
            with torch.set_grad_enabled(call.grad):
                return x._like(norm_act(norm, x.feats, call.relu))
        finally:
            norm.training = training


def _conv(call: _Call) -> SparseTensor:
    conv, norm = call.conv, call.norm
    params = conv._parameters
    kernel, bias = params["kernel"], params["bias"]
    if norm is not None:
        cache = norm.__dict__.get("_relconv_fold")
        if cache is None:
            cache = norm.__dict__["_relconv_fold"] = FoldCache()
        kernel, bias = cache.get_tensors(kernel, bias, 1, norm, call.input.feats)
    return conv.run(call.input, kernel, bias, "relu" if call.relu else None)


def _pending(call: _Call) -> PendingConv:
    out = PendingConv.__new__(PendingConv)
    object.__setattr__(out, "_pending", call)
    return out
