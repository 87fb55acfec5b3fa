"""TorchSparse 2.1's convolution configuration (`get_default_conv_config`, `set_global_conv_config`,
`set_conv_mode` ...), accepted so that code setting them runs unchanged.

Two fields change results and are honoured, read from a conv's `config`, else the global config,
else the default, as TorchSparse does:
- `kmap_mode`: "hashmap_on_the_fly" (default) or "hashmap". The latter centres every kernel at
  `-(k - 1) // 2` per axis whatever the padding, and (with kernel = stride per axis or
  `downsample_mode = "minkowski"`) takes the unbounded `unique(floor(p / s))` as a strided conv's
  output sites.
- `downsample_mode`: "spconv" (default) or "minkowski", read in "hashmap" mode.
The dataflow fields (`dataflow`, `ifsort`, `split_mask_num`, ...) are accepted and ignored: relconv
chooses each layer's dataflow itself. `set_kmap_mode` / `set_downsample_mode` / `set_conv_mode`
validate and store their value and, as in TorchSparse 2.1, no conv reads them.

TorchSparse's API is these process-wide switches; they live in one-element holders here.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

__all__ = [
    "ConvMode",
    "Dataflow",
    "clear_global_conv_config",
    "get_conv_mode",
    "get_default_conv_config",
    "get_downsample_mode",
    "get_global_conv_config",
    "get_kmap_mode",
    "set_conv_mode",
    "set_downsample_mode",
    "set_global_conv_config",
    "set_kmap_mode",
]

KMAP_MODES = ("hashmap_on_the_fly", "hashmap")
DOWNSAMPLE_MODES = ("spconv", "minkowski")


class Dataflow(Enum):
    ImplicitGEMM = 0
    GatherScatter = 1
    FetchOnDemand = 2
    CodedCSR = 3


class ConvMode(Enum):
    mode0 = 0
    mode1 = 1
    mode2 = 2


class ConvConfig(dict):
    """A dict whose keys read and write as attributes (TorchSparse's `AttributeDict`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"conv config has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


def _defaults() -> ConvConfig:
    return ConvConfig(
        dataflow=Dataflow.ImplicitGEMM,
        ifsort=False,
        kmap_mode="hashmap_on_the_fly",
        downsample_mode="spconv",
        split_mask_num=1,
        split_mask_num_bwd=3,
        epsilon=0.0,
        mm_thresh=0,
        FOD_fusion=True,
    )


# TorchSparse hands out one shared default object (edits to it apply to every later conv).
_DEFAULT = [_defaults()]
_GLOBAL: list[ConvConfig | None] = [None]
_SWITCHES = {"kmap_mode": "hashmap_on_the_fly", "downsample_mode": "spconv", "conv_mode": ConvMode.mode0}


def get_default_conv_config(conv_mode: ConvMode = ConvMode.mode0, training: bool = False) -> ConvConfig:
    config = _DEFAULT[0]
    if conv_mode in (ConvMode.mode1, ConvMode.mode2):
        config.ifsort = True
    if conv_mode == ConvMode.mode2:
        config.split_mask_num = 3
    return config


def set_global_conv_config(conv_config: dict) -> None:
    if not isinstance(conv_config, dict):
        raise TypeError(f"conv_config must be a dict / conv config, got {type(conv_config).__name__}")
    config = conv_config if isinstance(conv_config, ConvConfig) else ConvConfig(conv_config)
    for key, value in _defaults().items():
        config.setdefault(key, value)
    _GLOBAL[0] = config


def get_global_conv_config() -> ConvConfig | None:
    return _GLOBAL[0]


def clear_global_conv_config() -> None:
    _GLOBAL[0] = None


def _choice(value: Any, allowed: tuple, name: str) -> Any:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def set_kmap_mode(kmap_mode: str) -> None:
    _SWITCHES["kmap_mode"] = _choice(kmap_mode, KMAP_MODES, "kmap_mode")


def get_kmap_mode() -> str:
    return _SWITCHES["kmap_mode"]


def set_downsample_mode(downsample_mode: str) -> None:
    _SWITCHES["downsample_mode"] = _choice(downsample_mode, DOWNSAMPLE_MODES, "downsample_mode")


def get_downsample_mode() -> str:
    return _SWITCHES["downsample_mode"]


def set_conv_mode(conv_mode: int | ConvMode) -> None:
    if isinstance(conv_mode, int) and not isinstance(conv_mode, bool) and conv_mode in (0, 1, 2):
        conv_mode = ConvMode(conv_mode)
    if not isinstance(conv_mode, ConvMode):
        raise ValueError(f"conv_mode must be 0, 1, 2 or a ConvMode, got {conv_mode!r}")
    _SWITCHES["conv_mode"] = conv_mode


def get_conv_mode() -> ConvMode:
    return _SWITCHES["conv_mode"]


def map_modes(config: dict | None) -> tuple[bool, bool]:
    """(hashmap mode, minkowski downsampling) of the config a conv runs under."""
    if config is None:
        config = _GLOBAL[0] if _GLOBAL[0] is not None else _DEFAULT[0]
    kmap, down = config.get("kmap_mode", "hashmap_on_the_fly"), config.get("downsample_mode", "spconv")
    # Checked inline: this runs in every conv call, and `_choice` is there to name a bad value.
    if kmap not in KMAP_MODES or down not in DOWNSAMPLE_MODES:
        _choice(kmap, KMAP_MODES, "conv config kmap_mode")
        _choice(down, DOWNSAMPLE_MODES, "conv config downsample_mode")
    return kmap == "hashmap", down == "minkowski"
