"""spconv's algorithm enums (`spconv.core.ConvAlgo`, `spconv.pytorch.ConvAlgo`): accepted, ignored."""

from __future__ import annotations

from enum import Enum

from relconv.spconv._missing import missing


class ConvAlgo(Enum):
    Native = 0
    MaskImplicitGemm = 1
    MaskSplitImplicitGemm = 2


class AlgoHint(Enum):
    NoHint = 0b000
    Fowrard = 0b001  # spconv's spelling, kept for code that names it
    BackwardInput = 0b010
    BackwardWeight = 0b100


def __getattr__(name: str):
    raise missing("spconv.core", name)
