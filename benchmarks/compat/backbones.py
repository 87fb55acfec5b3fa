"""The downstream backbones of the compat harness, loaded from repository snapshots.

Each backbone's source file is loaded from `.peers/downstream/<repo>/...` (see `SOURCES`) with
importlib under stand-in parent packages, so no downstream package has to be installed: the file
imports `spconv` or `torchsparse` exactly as it does at home, and whichever library this process
selected with `use_library` answers. Only the libraries a file imports for its forward pass are
real; stand-ins cover what the backbones import but never call on this path (Pointcept's model
registry, timm's `trunc_normal_` initialiser, PyG's `scatter`, used only in its `enc_mode`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.compat.scenes import Voxels

DEFAULT_DOWNSTREAM = Path(".peers/downstream")

# Files each backbone family needs, relative to the downstream folder.
SOURCES = {
    "openpcdet": [
        "OpenPCDet/pcdet/utils/spconv_utils.py",
        "OpenPCDet/pcdet/models/backbones_3d/spconv_backbone.py",
    ],
    "pointcept": [
        "Pointcept/pointcept/models/utils/misc.py",
        "Pointcept/pointcept/models/sparse_unet/spconv_unet_v1m1_base.py",
    ],
    "torchsparse": [
        "torchsparse/torchsparse/backbones/__init__.py",
        "torchsparse/torchsparse/backbones/modules/blocks.py",
        "torchsparse/torchsparse/backbones/resnet.py",
        "torchsparse/torchsparse/backbones/unet.py",
    ],
}

LIBRARIES = ("real", "shim", "native")


class HarnessError(RuntimeError):
    """A set-up problem the harness reports as the row's result instead of a traceback."""


@dataclass(frozen=True)
class Backbone:
    name: str
    family: str  # the API the file is written against: "spconv" or "torchsparse"
    source: str  # key of SOURCES
    scene: str  # "kitti" (OpenPCDet's voxel set-up) or "fine" (0.05 m)
    build: Callable[[Path, Voxels], torch.nn.Module]
    make_input: Callable[[Voxels, torch.Tensor], object]
    outputs: Callable[[torch.nn.Module, object], dict[str, tuple[torch.Tensor, torch.Tensor]]]


# ----------------------------------------------------------------------------- library selection
def use_library(family: str, library: str) -> str:
    """Makes `import spconv` / `import torchsparse` in this process mean `library`; returns a
    description of what answers. Call once per process, before any backbone is loaded."""
    if library not in LIBRARIES:
        raise HarnessError(f"library must be one of {LIBRARIES}, got {library!r}")
    if library == "native":
        return "relconv native twin (relconv.voxel layers; grid convs on relconv.ops)"
    if library == "shim":
        try:
            shim = importlib.import_module(f"relconv.{family}")
        except ModuleNotFoundError as err:
            if err.name == f"relconv.{family}":
                raise HarnessError(
                    f"relconv.{family} is not in this checkout: the {family} shim has to be merged first"
                ) from None
            raise
        if not hasattr(shim, "install"):
            raise HarnessError(f"relconv.{family} has no install(); cannot register the {family} aliases")
        shim.install()
        return f"relconv.{family} (shim)"
    try:
        real = importlib.import_module("spconv.pytorch" if family == "spconv" else "torchsparse.nn")
    except Exception as err:  # a missing library or an ABI-mismatched extension
        raise HarnessError(
            f"the real {family} is not importable ({type(err).__name__}: {err}); "
            "on the GPU host run `source benchmarks/peers/activate.sh` first"
        ) from None
    shim_dir = Path(importlib.import_module("relconv").__file__).resolve().parent
    if shim_dir in Path(getattr(real, "__file__", None) or "/").resolve().parents:
        raise HarnessError(f"`import {family}` resolves to relconv's shim, not the real library")
    top = sys.modules[family]
    return f"{family} {getattr(top, '__version__', '?')} ({Path(top.__file__).parent})"


# ----------------------------------------------------------------------------- loading snapshot files
def _stub_package(name: str, path: Path | None = None) -> types.ModuleType:
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)] if path is not None else []
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], leaf, mod)
    return mod


def _load_file(name: str, file: Path) -> types.ModuleType:
    if not file.is_file():
        raise HarnessError(
            f"{file} is missing: unpack the downstream snapshots into {file.parents[0]} "
            "(see benchmarks/compat/README.md)"
        )
    spec = importlib.util.spec_from_file_location(name, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], leaf, mod)
    return mod


def _openpcdet(root: Path) -> types.ModuleType:
    base = root / "OpenPCDet" / "pcdet"
    for pkg, sub in (("pcdet", ""), ("pcdet.utils", "utils"), ("pcdet.models", "models")):
        _stub_package(pkg, base / sub)
    _stub_package("pcdet.models.backbones_3d", base / "models" / "backbones_3d")
    _load_file("pcdet.utils.spconv_utils", base / "utils" / "spconv_utils.py")
    return _load_file(
        "pcdet.models.backbones_3d.spconv_backbone", base / "models" / "backbones_3d" / "spconv_backbone.py"
    )


class _Registry:
    """Stand-in for Pointcept's mmcv-style `MODELS` registry: `register_module` only records."""

    def __init__(self) -> None:
        self.modules: dict[str, type] = {}

    def register_module(self, name: str | None = None, module: type | None = None, force: bool = False):
        def record(cls: type) -> type:
            self.modules[name or cls.__name__] = cls
            return cls

        return record(module) if module is not None else record


def _scatter_unused(*args, **kwargs):
    raise HarnessError(
        "torch_geometric.utils.scatter is a stand-in here (SpUNet's enc_mode is not benchmarked)"
    )


def _pointcept(root: Path) -> types.ModuleType:
    base = root / "Pointcept" / "pointcept"
    for pkg, sub in (("pointcept", ""), ("pointcept.models", "models")):
        _stub_package(pkg, base / sub)
    builder = _stub_package("pointcept.models.builder")
    builder.MODELS = _Registry()
    utils = _stub_package("pointcept.models.utils", base / "models" / "utils")
    utils.offset2batch = _load_file(
        "pointcept.models.utils.misc", base / "models" / "utils" / "misc.py"
    ).offset2batch
    _stub_package("timm")
    _stub_package("timm.layers").trunc_normal_ = torch.nn.init.trunc_normal_
    _stub_package("torch_geometric")
    _stub_package("torch_geometric.utils").scatter = _scatter_unused
    _stub_package("pointcept.models.sparse_unet", base / "models" / "sparse_unet")
    return _load_file(
        "pointcept.models.sparse_unet.spconv_unet_v1m1_base",
        base / "models" / "sparse_unet" / "spconv_unet_v1m1_base.py",
    )


def _torchsparse_backbones(root: Path) -> types.ModuleType:
    # A package of its own name: `torchsparse.backbones` belongs to whichever torchsparse is selected.
    folder = root / "torchsparse" / "torchsparse" / "backbones"
    init = folder / "__init__.py"
    if not init.is_file():
        raise HarnessError(
            f"{init} is missing: unpack the downstream snapshots (see benchmarks/compat/README.md)"
        )
    spec = importlib.util.spec_from_file_location(
        "downstream_ts_backbones", init, submodule_search_locations=[str(folder)]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------- per-family inputs/outputs
def _pcdet_input(v: Voxels, feats: torch.Tensor) -> dict:
    return {
        "voxel_features": feats,
        "voxel_coords": v.coords_bzyx.to(feats.device),
        "batch_size": v.batch_size,
    }


def _pcdet_outputs(model, result: dict) -> dict:
    out = {"encoded_spconv_tensor": result["encoded_spconv_tensor"], **result["multi_scale_3d_features"]}
    return {k: (t.indices, t.features) for k, t in out.items()}


def _pointcept_input(v: Voxels, feats: torch.Tensor) -> dict:
    device = feats.device
    return {"grid_coord": v.coords[:, 1:].to(device), "feat": feats, "offset": v.offsets.to(device)}


def _pointcept_outputs(model, result: torch.Tensor) -> dict:
    # The model returns bare features; their coordinates are those of `final`'s output tensor.
    return {"seg_logits": (model.harness_final_indices, result)}


def _pointcept_build(root: Path, v: Voxels) -> torch.nn.Module:
    model = _pointcept(root).SpUNetBase(in_channels=4, num_classes=19)

    def keep_indices(module, args, output):
        model.harness_final_indices = output.indices

    model.final.register_forward_hook(keep_indices)
    return model


def _ts_input(v: Voxels, feats: torch.Tensor):
    from torchsparse import SparseTensor

    coords = v.coords.to(feats.device).int().contiguous()
    return SparseTensor(feats, coords, spatial_range=v.torchsparse_range)


def _ts_outputs(model, result) -> dict:
    return {f"out{i}": (t.C, t.F) for i, t in enumerate(result)}


BACKBONES = {
    b.name: b
    for b in (
        Backbone(
            "VoxelBackBone8x",
            "spconv",
            "openpcdet",
            "kitti",
            lambda root, v: _openpcdet(root).VoxelBackBone8x({}, 4, np.array(v.grid_size)),
            _pcdet_input,
            _pcdet_outputs,
        ),
        Backbone(
            "VoxelResBackBone8x",
            "spconv",
            "openpcdet",
            "kitti",
            lambda root, v: _openpcdet(root).VoxelResBackBone8x({}, 4, np.array(v.grid_size)),
            _pcdet_input,
            _pcdet_outputs,
        ),
        Backbone(
            "SpUNet-v1m1",
            "spconv",
            "pointcept",
            "fine",
            _pointcept_build,
            _pointcept_input,
            _pointcept_outputs,
        ),
        Backbone(
            "SparseResUNet42",
            "torchsparse",
            "torchsparse",
            "fine",
            lambda root, v: _torchsparse_backbones(root).SparseResUNet42(in_channels=4),
            _ts_input,
            _ts_outputs,
        ),
        Backbone(
            "SparseResNet21D",
            "torchsparse",
            "torchsparse",
            "fine",
            lambda root, v: _torchsparse_backbones(root).SparseResNet21D(in_channels=4),
            _ts_input,
            _ts_outputs,
        ),
    )
}
