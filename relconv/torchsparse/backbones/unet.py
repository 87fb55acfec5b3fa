"""TorchSparse's sparse residual U-Net backbones (same module tree and parameter names)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from relconv.torchsparse import nn as spnn
from relconv.torchsparse.backbones.modules import SparseConvBlock, SparseConvTransposeBlock, SparseResBlock
from relconv.torchsparse.operators import cat
from relconv.torchsparse.tensor import SparseTensor

__all__ = ["SparseResUNet", "SparseResUNet42"]


class SparseResUNet(nn.Module):
    """Stem (two 3^3 conv-BN-ReLU), four encoders (2^3 stride-2 block + two residual blocks),
    four decoders ({"upsample": 2^3 transposed block, "fuse": two residual blocks over the
    upsampled features concatenated with the skip}). Forward returns
    [stem, encoder outputs..., decoder outputs...] (9 tensors)."""

    def __init__(
        self,
        stem_channels: int,
        encoder_channels: Sequence[int],
        decoder_channels: Sequence[int],
        *,
        in_channels: int = 4,
        width_multiplier: float = 1.0,
    ) -> None:
        super().__init__()
        if len(encoder_channels) != 4 or len(decoder_channels) != 4:
            raise ValueError(
                f"encoder_channels and decoder_channels must have 4 entries each, got "
                f"{len(encoder_channels)} and {len(decoder_channels)}"
            )
        self.stem_channels = stem_channels
        self.encoder_channels = encoder_channels
        self.decoder_channels = decoder_channels
        self.in_channels = in_channels
        self.width_multiplier = width_multiplier
        c = [int(width_multiplier * n) for n in [stem_channels, *encoder_channels, *decoder_channels]]
        self.stem = nn.Sequential(
            spnn.Conv3d(in_channels, c[0], 3),
            spnn.BatchNorm(c[0]),
            spnn.ReLU(True),
            spnn.Conv3d(c[0], c[0], 3),
            spnn.BatchNorm(c[0]),
            spnn.ReLU(True),
        )
        self.encoders = nn.ModuleList(
            nn.Sequential(
                SparseConvBlock(c[k], c[k], 2, stride=2),
                SparseResBlock(c[k], c[k + 1], 3),
                SparseResBlock(c[k + 1], c[k + 1], 3),
            )
            for k in range(4)
        )
        self.decoders = nn.ModuleList(
            nn.ModuleDict(
                {
                    "upsample": SparseConvTransposeBlock(c[k + 4], c[k + 5], 2, stride=2),
                    "fuse": nn.Sequential(
                        SparseResBlock(c[k + 5] + c[3 - k], c[k + 5], 3),
                        SparseResBlock(c[k + 5], c[k + 5], 3),
                    ),
                }
            )
            for k in range(4)
        )

    def forward(self, x: SparseTensor) -> list[SparseTensor]:
        skips = [self.stem(x)]
        for encoder in self.encoders:
            skips.append(encoder(skips[-1]))
        y = skips[-1]
        decoded = []
        for k, decoder in enumerate(self.decoders):
            y = decoder["fuse"](cat([decoder["upsample"](y), skips[3 - k]]))
            decoded.append(y)
        return skips + decoded


class SparseResUNet42(SparseResUNet):
    """Stem 32; encoders 32, 64, 128, 256; decoders 256, 128, 96, 96."""

    def __init__(self, **kwargs) -> None:
        super().__init__(
            stem_channels=32,
            encoder_channels=[32, 64, 128, 256],
            decoder_channels=[256, 128, 96, 96],
            **kwargs,
        )
