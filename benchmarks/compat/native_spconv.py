"""relconv-native twins of the spconv backbones: OpenPCDet's `VoxelBackBone8x` and
`VoxelResBackBone8x`, Pointcept's `SpUNet-v1m1`.

Module for module under the downstream code's names, so a spconv state_dict loads through
`relconv.convert.convert_state_dict` (BatchNorm keys under relconv's `.module`). Submanifold convs
are relconv.voxel `Conv3d`s; OpenPCDet's padded 3^3 stride-2 convs keep spconv's sites through
`grid_conv.GridBlock`; Pointcept's 2^3 stride-2 convs keep floor(p / 2), the same sites as spconv's
on its grid (96 cells of margin past the largest coordinate), so they are relconv.voxel strided and
transposed `Conv3d`s. The inputs are what the downstream model builds its SparseConvTensor from.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from benchmarks.compat.grid_conv import GridBlock, set_grids
from benchmarks.compat.scenes import Voxels
from relconv.voxel import BatchNorm, Conv3d, ReLU, Sequential, VoxelTensor

# OpenPCDet's and Pointcept's norm_fn: BatchNorm1d(eps=1e-3, momentum=0.01)
NORM = {"eps": 1e-3, "momentum": 0.01}


def _norm(channels: int) -> BatchNorm:
    return BatchNorm(channels, **NORM)


def _subm_block(cin: int, cout: int, kernel_size: int = 3) -> Sequential:
    """OpenPCDet's post_act_block with conv_type 'subm' (and its conv_input)."""
    return Sequential(Conv3d(cin, cout, kernel_size), _norm(cout), ReLU(True))


def _down_block(cin: int, cout: int, kernel_size, stride, padding) -> GridBlock:
    return GridBlock(cin, cout, kernel_size, stride, padding, **NORM)


class _BasicBlock(nn.Module):
    """OpenPCDet's SparseBasicBlock (biased convs, equal widths) and Pointcept's BasicBlock (a 1x1
    projection where the widths differ): two submanifold 3^3 convs, BatchNorm, residual."""

    def __init__(self, cin: int, cout: int, bias: bool = False) -> None:
        super().__init__()
        self.proj = None if cin == cout else Sequential(Conv3d(cin, cout, 1), _norm(cout))
        self.conv1, self.bn1 = Conv3d(cin, cout, 3, bias=bias), _norm(cout)
        self.conv2, self.bn2 = Conv3d(cout, cout, 3, bias=bias), _norm(cout)

    def forward(self, x: VoxelTensor) -> VoxelTensor:
        out = self.conv1(x)
        out = out.replace_feature(self.bn1.normalise(out.feats, relu=True))
        out = self.conv2(out)
        skip = x.feats if self.proj is None else self.proj(x).feats
        return out.replace_feature((self.bn2.normalise(out.feats, relu=False) + skip).relu_())


class VoxelBackBone8x(nn.Module):
    """OpenPCDet's VoxelBackBone8x (`residual=False`) or VoxelResBackBone8x; input (tensor over
    (batch, z, y, x) voxel coordinates, (batch size, *sparse_shape))."""

    def __init__(self, in_channels: int = 4, residual: bool = False) -> None:
        super().__init__()
        width = (16, 32, 64, 128 if residual else 64)

        def blocks(channels: int, plain: int) -> list[nn.Module]:
            if residual:
                return [_BasicBlock(channels, channels, bias=True) for _ in range(2)]
            return [_subm_block(channels, channels) for _ in range(plain)]

        self.conv_input = _subm_block(in_channels, 16)
        self.conv1 = Sequential(*blocks(16, 1))
        self.conv2 = Sequential(_down_block(16, width[1], 3, 2, 1), *blocks(width[1], 2))
        self.conv3 = Sequential(_down_block(width[1], width[2], 3, 2, 1), *blocks(width[2], 2))
        self.conv4 = Sequential(_down_block(width[2], width[3], 3, 2, (0, 1, 1)), *blocks(width[3], 2))
        self.conv_out = _down_block(width[3], 128, (3, 1, 1), (2, 1, 1), 0)

    def forward(self, inp: tuple[VoxelTensor, tuple[int, ...]]) -> dict[str, VoxelTensor]:
        x, grid = inp
        set_grids(self, grid)
        x1 = self.conv1(self.conv_input(x))
        x2 = self.conv2(x1)
        x3 = self.conv3(x2)
        x4 = self.conv4(x3)
        return {
            "encoded_spconv_tensor": self.conv_out(x4),
            "x_conv1": x1,
            "x_conv2": x2,
            "x_conv3": x3,
            "x_conv4": x4,
        }


class SpUNet(nn.Module):
    """Pointcept's SpUNet-v1m1 (SpUNetBase, 19 classes); input a tensor over (batch, x, y, z)."""

    CHANNELS = (32, 64, 128, 256, 256, 128, 96, 96)
    LAYERS = (2, 3, 4, 6, 2, 2, 2, 2)

    def __init__(self, in_channels: int = 4, num_classes: int = 19, base_channels: int = 32) -> None:
        super().__init__()
        c, layers, n = self.CHANNELS, self.LAYERS, len(self.CHANNELS)
        self.conv_input = Sequential(Conv3d(in_channels, base_channels, 5), _norm(base_channels), ReLU(True))
        self.down, self.up, self.enc, self.dec = (
            nn.ModuleList(),
            nn.ModuleList(),
            nn.ModuleList(),
            nn.ModuleList(),
        )
        enc_channels, dec_channels = base_channels, c[-1]
        for s in range(n // 2):
            self.down.append(Sequential(Conv3d(enc_channels, c[s], 2, stride=2), _norm(c[s]), ReLU(True)))
            blocks = ((f"block{i}", _BasicBlock(c[s], c[s])) for i in range(layers[s]))
            self.enc.append(Sequential(OrderedDict(blocks)))
            up = Conv3d(c[n - s - 2], dec_channels, 2, stride=2, transposed=True)
            self.up.append(Sequential(up, _norm(dec_channels), ReLU(True)))
            widths = [dec_channels + enc_channels] + [dec_channels] * (layers[n - s - 1] - 1)
            blocks = ((f"block{i}", _BasicBlock(w, dec_channels)) for i, w in enumerate(widths))
            self.dec.append(Sequential(OrderedDict(blocks)))
            enc_channels, dec_channels = c[s], c[n - s - 2]
        self.final = Conv3d(c[-1], num_classes, 1, bias=True)

    def forward(self, x: VoxelTensor) -> dict[str, VoxelTensor]:
        x = self.conv_input(x)
        skips = [x]
        for down, enc in zip(self.down, self.enc, strict=True):
            x = enc(down(x))
            skips.append(x)
        x = skips.pop()
        for s in reversed(range(len(self.up))):
            x = self.up[s](x)
            skip = skips.pop()
            x = self.dec[s](x.replace_feature(torch.cat((x.feats, skip.feats), 1)))
        return {"seg_logits": self.final(x)}


def pcdet_input(v: Voxels, feats) -> tuple[VoxelTensor, tuple[int, ...]]:
    """OpenPCDet's voxel_coords and its sparse_shape: grid_size[::-1] + [1, 0, 0]."""
    gx, gy, gz = v.grid_size
    return VoxelTensor(feats, v.coords_bzyx.to(feats.device)), (v.batch_size, gz + 1, gy, gx)


TWINS = {
    "VoxelBackBone8x": VoxelBackBone8x,
    "VoxelResBackBone8x": lambda: VoxelBackBone8x(residual=True),
    "SpUNet-v1m1": SpUNet,
}
# SpUNet-v1m1's input is the plain tensor over the loader's coordinates (native.make_input).
INPUTS = {"VoxelBackBone8x": pcdet_input, "VoxelResBackBone8x": pcdet_input}
