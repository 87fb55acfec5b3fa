"""SparseResNet21D and SparseResUNet42: state_dict keys and shapes as TorchSparse 2.1's source
builds them (generated below from that structure), loading such a state_dict, forward and backward
on a tiny scene."""

from __future__ import annotations

import pytest
import torch
from torchsparse_refs import scene

from relconv.torchsparse.backbones import SparseResNet21D, SparseResUNet42

BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _conv(prefix, cin, cout, kernel_volume, strided=False):
    shape = (kernel_volume, cin, cout) if kernel_volume > 1 or strided else (cin, cout)
    return {f"{prefix}.kernel": shape}


def _bn(prefix, c):
    return {f"{prefix}.{name}": (() if name == "num_batches_tracked" else (c,)) for name in BN}


def _conv_block(prefix, cin, cout, kv, strided=False):  # SparseConvBlock / SparseConvTransposeBlock
    return {**_conv(f"{prefix}.0", cin, cout, kv, strided), **_bn(f"{prefix}.1", cout)}


def _res_block(prefix, cin, cout, kv):  # SparseResBlock (stride 1 in both backbones)
    keys = {
        **_conv(f"{prefix}.main.0", cin, cout, kv),
        **_bn(f"{prefix}.main.1", cout),
        **_conv(f"{prefix}.main.3", cout, cout, kv),
        **_bn(f"{prefix}.main.4", cout),
    }
    if cin != cout:
        keys.update({**_conv(f"{prefix}.shortcut.0", cin, cout, 1), **_bn(f"{prefix}.shortcut.1", cout)})
    return keys


def expected_resnet21d(in_channels=4, width=1.0):
    stages = [(3, 16, 27, True), (3, 32, 27, True), (3, 64, 27, True), (3, 128, 27, True), (1, 128, 3, True)]
    keys, cin = {}, in_channels
    for s, (blocks, cout, kv, _) in enumerate(stages):
        cout = int(cout * width)
        for b in range(blocks):
            if b == 0:
                keys.update(_conv_block(f"{s}.{b}", cin, cout, kv))
            else:
                keys.update(_res_block(f"{s}.{b}", cin, cout, kv))
            cin = cout
    return keys


def expected_unet42(in_channels=4, width=1.0):
    c = [int(width * n) for n in (32, 32, 64, 128, 256, 256, 128, 96, 96)]
    keys = {
        **_conv("stem.0", in_channels, c[0], 27),
        **_bn("stem.1", c[0]),
        **_conv("stem.3", c[0], c[0], 27),
        **_bn("stem.4", c[0]),
    }
    for k in range(4):
        keys.update(_conv_block(f"encoders.{k}.0", c[k], c[k], 8))
        keys.update(_res_block(f"encoders.{k}.1", c[k], c[k + 1], 27))
        keys.update(_res_block(f"encoders.{k}.2", c[k + 1], c[k + 1], 27))
    for k in range(4):
        keys.update(_conv_block(f"decoders.{k}.upsample", c[k + 4], c[k + 5], 8))
        keys.update(_res_block(f"decoders.{k}.fuse.0", c[k + 5] + c[3 - k], c[k + 5], 27))
        keys.update(_res_block(f"decoders.{k}.fuse.1", c[k + 5], c[k + 5], 27))
    return keys


CASES = [
    (SparseResNet21D, expected_resnet21d),
    (SparseResUNet42, expected_unet42),
]


@pytest.mark.parametrize(("cls", "expected"), CASES, ids=["resnet21d", "unet42"])
@pytest.mark.parametrize("width", [1.0, 0.5])
def test_state_dict_keys_and_shapes_are_torchsparse(cls, expected, width):
    model = cls(in_channels=4, width_multiplier=width)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == expected(4, width)


@pytest.mark.parametrize(("cls", "expected"), CASES, ids=["resnet21d", "unet42"])
def test_a_torchsparse_state_dict_loads_strictly(cls, expected):
    g = torch.Generator().manual_seed(0)
    state = {
        k: (torch.tensor(7) if not shape else torch.randn(shape, generator=g))
        for k, shape in expected(4, 0.25).items()
    }
    model = cls(in_channels=4, width_multiplier=0.25)
    model.load_state_dict(state, strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


def _tiny_scene():
    x = scene(n=400, grid=32, batch=2, channels=4, seed=3)
    x.feats = x.feats.float().requires_grad_(True)
    return x


def test_resnet21d_forward_backward():
    model = SparseResNet21D(in_channels=4, width_multiplier=0.25)
    x = _tiny_scene()
    outputs = model(x)
    assert [o.stride for o in outputs] == [(1, 1, 1), (2, 2, 2), (4, 4, 4), (8, 8, 8), (8, 16, 8)]
    assert [o.feats.shape[1] for o in outputs] == [4, 8, 16, 32, 32]
    assert outputs[0].coords is x.coords
    sum(o.feats.sum() for o in outputs).backward()
    assert x.feats.grad is not None and model[0][0][0].kernel.grad.abs().sum() > 0
    assert model[4][0][0].kernel.grad.abs().sum() > 0


def test_unet42_forward_backward():
    model = SparseResUNet42(in_channels=4, width_multiplier=0.25)
    x = _tiny_scene()
    outputs = model(x)
    strides = [o.stride[0] for o in outputs]
    assert strides == [1, 2, 4, 8, 16, 8, 4, 2, 1]
    for enc, dec in ((outputs[3], outputs[5]), (outputs[2], outputs[6]), (outputs[1], outputs[7])):
        assert dec.coords is enc.coords  # decoders return to the encoders' sites
    assert torch.equal(outputs[8].coords, x.coords)
    outputs[-1].feats.square().mean().backward()
    assert x.feats.grad is not None
    assert model.encoders[3][0][0].kernel.grad.abs().sum() > 0
    assert model.decoders[0]["upsample"][0].kernel.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        again = model(_tiny_scene())
    assert again[-1].feats.shape == outputs[-1].feats.shape
