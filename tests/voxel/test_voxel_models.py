"""MinkUNet and ResNet forward/backward smoke on a small synthetic scan; training step works."""

import pickle

import torch

from relconv.voxel import BatchNorm, Conv3d, Dropout, LeakyReLU, Sequential, VoxelTensor, voxelize
from relconv.voxel.models import MinkUNet, ResNet
from relconv.voxel.synthetic import raycast_scan
from tests.conftest import cyclic_garbage


def _small_scan(voxel=0.4):
    points, intensity = raycast_scan(beams=16, azimuth_steps=256, seed=0)
    pts = torch.from_numpy(points)
    feats = torch.cat([pts, torch.from_numpy(intensity)[:, None]], 1)
    return voxelize(pts, voxel, feats=feats)


def test_minkunet_forward_backward():
    torch.manual_seed(0)
    v = _small_scan()
    model = MinkUNet(in_channels=4, num_classes=5, width=0.25)
    logits = model(v.tensor)
    assert logits.shape == (len(v.tensor), 5)
    logits.square().mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_minkunet_frees_its_maps_without_the_cycle_collector():
    # Every map a call builds (and its transpose, for the decoder) goes with the call's tensors.
    torch.manual_seed(0)
    v = _small_scan()
    model = MinkUNet(in_channels=4, num_classes=5, width=0.25)

    def step():  # a new tensor each time, as a data loader gives: its maps are built in the call
        model(VoxelTensor(v.tensor.feats, v.tensor.coords)).square().mean().backward()

    step()
    assert cyclic_garbage(step) == []


def test_a_tensor_pickles_with_the_maps_a_minkunet_built_on_it():
    # The tensor's cache holds the strided maps and their transposes; a pickled copy reuses them.
    torch.manual_seed(0)
    v = _small_scan()
    model = MinkUNet(in_channels=4, num_classes=5, width=0.25).eval()
    x = VoxelTensor(v.tensor.feats, v.tensor.coords)
    with torch.no_grad():
        want = model(x)
        got = model(pickle.loads(pickle.dumps(x)))
    torch.testing.assert_close(got, want)


def test_resnet_classifier_and_training_step():
    torch.manual_seed(0)
    v = _small_scan(0.5)
    model = ResNet(4, channels=(8, 16), layers=(1, 1), num_classes=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    target = torch.tensor([1])
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(v.tensor), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_sequential_wrappers():
    v = _small_scan(0.5)
    net = Sequential(Conv3d(4, 8, 3), BatchNorm(8), LeakyReLU(0.1), Dropout(0.0))
    y = net(v.tensor)
    assert y.feats.shape == (len(v.tensor), 8) and y.coords is v.tensor.coords
