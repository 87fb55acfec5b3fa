"""SparseResNet21D, SparseResUNet42 (TorchSparse 2.1) and MinkUNet (TorchSparse's model zoo, SPVNAS):
state_dict keys and shapes as those sources build them (generated below from that structure),
loading such a state_dict, forward and backward on a tiny scene."""

from __future__ import annotations

import pytest
import torch

from relconv.torchsparse.backbones import MinkUNet, SparseResNet21D, SparseResUNet42
from tests.compat.torchsparse_refs import scene
from tests.conftest import cyclic_garbage

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


def _mink_res(prefix, cin, cout):  # SPVNAS ResidualBlock: net / downsample
    keys = {
        **_conv(f"{prefix}.net.0", cin, cout, 27),
        **_bn(f"{prefix}.net.1", cout),
        **_conv(f"{prefix}.net.3", cout, cout, 27),
        **_bn(f"{prefix}.net.4", cout),
    }
    if cin != cout:
        keys.update({**_conv(f"{prefix}.downsample.0", cin, cout, 1), **_bn(f"{prefix}.downsample.1", cout)})
    return keys


def expected_minkunet(num_classes=19, cr=1.0):
    c = [int(cr * n) for n in (32, 32, 64, 128, 256, 256, 128, 96, 96)]
    keys = {
        **_conv("stem.0", 4, c[0], 27),
        **_bn("stem.1", c[0]),
        **_conv("stem.3", c[0], c[0], 27),
        **_bn("stem.4", c[0]),
    }
    for i in range(4):
        keys.update(_conv(f"stage{i + 1}.0.net.0", c[i], c[i], 8))
        keys.update(_bn(f"stage{i + 1}.0.net.1", c[i]))
        keys.update(_mink_res(f"stage{i + 1}.1", c[i], c[i + 1]))
        keys.update(_mink_res(f"stage{i + 1}.2", c[i + 1], c[i + 1]))
    for i in range(4):
        keys.update(_conv(f"up{i + 1}.0.net.0", c[4 + i], c[5 + i], 8))
        keys.update(_bn(f"up{i + 1}.0.net.1", c[5 + i]))
        keys.update(_mink_res(f"up{i + 1}.1.0", c[5 + i] + c[3 - i], c[5 + i]))
        keys.update(_mink_res(f"up{i + 1}.1.1", c[5 + i], c[5 + i]))
    keys.update({"classifier.0.weight": (num_classes, c[8]), "classifier.0.bias": (num_classes,)})
    for j, (a, b) in enumerate(((c[0], c[4]), (c[4], c[6]), (c[6], c[8]))):
        keys.update({f"point_transforms.{j}.0.weight": (b, a), f"point_transforms.{j}.0.bias": (b,)})
        keys.update(_bn(f"point_transforms.{j}.1", b))
    return keys


CASES = [
    (lambda w: SparseResNet21D(in_channels=4, width_multiplier=w), lambda w: expected_resnet21d(4, w)),
    (lambda w: SparseResUNet42(in_channels=4, width_multiplier=w), lambda w: expected_unet42(4, w)),
    (lambda w: MinkUNet(num_classes=19, cr=w), lambda w: expected_minkunet(19, w)),
]
IDS = ["resnet21d", "unet42", "minkunet"]


@pytest.mark.parametrize(("build", "expected"), CASES, ids=IDS)
@pytest.mark.parametrize("width", [1.0, 0.5])
def test_state_dict_keys_and_shapes_are_torchsparse(build, expected, width):
    model = build(width)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert list(got) == list(expected(width))  # same order as well: the same module tree
    assert got == expected(width)


@pytest.mark.parametrize(("build", "expected"), CASES, ids=IDS)
def test_a_torchsparse_state_dict_loads_strictly(build, expected):
    g = torch.Generator().manual_seed(0)
    state = {
        k: (torch.tensor(7) if not shape else torch.randn(shape, generator=g))
        for k, shape in expected(0.25).items()
    }
    model = build(0.25)
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


@pytest.mark.parametrize("training", [True, False])
def test_unet42_frees_its_maps_without_the_cycle_collector(training):
    # The strided maps and their transposes (the decoders') go with the call's tensors, in
    # training and in inference, where the shim defers and folds its convs.
    model = SparseResUNet42(in_channels=4, width_multiplier=0.25).train(training)

    def call():
        with torch.set_grad_enabled(training):
            out = model(_tiny_scene())[-1].feats
            if training:
                out.square().mean().backward()

    call()
    assert cyclic_garbage(call) == []


def test_minkunet_forward_backward():
    model = MinkUNet(num_classes=5, cr=0.25)
    x = _tiny_scene()
    logits = model(x)
    assert logits.shape == (x.feats.shape[0], 5)
    logits.square().mean().backward()
    assert x.feats.grad is not None and model.stage4[0].net[0].kernel.grad.abs().sum() > 0
    with pytest.raises(TypeError, match="num_classes"):
        MinkUNet()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["resnet21d", "unet42"])
def test_cuda_equals_cpu(name):
    build = {"resnet21d": SparseResNet21D, "unet42": SparseResUNet42}[name]
    cpu = build(in_channels=4, width_multiplier=0.5).eval()
    gpu = build(in_channels=4, width_multiplier=0.5).cuda().eval()
    gpu.load_state_dict(cpu.state_dict())
    x = scene(n=3000, grid=48, batch=2, channels=4, seed=5)
    with torch.no_grad():
        want = cpu(type(x)(x.feats.float(), x.coords))
        got = gpu(type(x)(x.feats.float().cuda(), x.coords.cuda()))
    for a, b in zip(want, got, strict=True):
        assert a.stride == b.stride and torch.equal(a.coords, b.coords.cpu())
        err = (b.feats.cpu() - a.feats).norm() / a.feats.norm()
        assert float(err) < 1e-5
