"""The voxel suite's peer interface (peers/base.VoxelPeer), exercised on CPU by a peer built from
relconv's own layers: what the suite hands a peer (LayerSetup / E2ESetup, harness/prepare.py) is
enough to build a case that agrees with relconv and gets timed, and the MinkUNet skeleton the spconv
and WarpConvNet adapters share reproduces relconv's network."""

from __future__ import annotations

import pytest
import torch

from benchmarks import voxel_suite
from benchmarks.harness import prepare
from benchmarks.harness.bench import Prepared
from benchmarks.harness.floor import measure_ceilings
from benchmarks.harness.ops import OPS
from benchmarks.harness.timing import TimingConfig
from benchmarks.peers.base import VoxelPeer
from benchmarks.peers.minkunet import Backend, PeerMinkUNet, copy_weights, skeleton_case
from relconv.voxel import Conv3d, MapCache, VoxelTensor


class RelconvBackend(Backend):
    """relconv's layers behind the skeleton's Backend, as a CPU stand-in for a peer library."""

    conv_types = (Conv3d,)

    def tensor(self, feats, coords, batch_size):
        return VoxelTensor(feats, coords)

    def conv(self, cin, cout, kernel_size, stride, transposed, key):
        return Conv3d(cin, cout, kernel_size, stride=stride, transposed=transposed)

    def run_conv(self, conv, x, target=None):
        return conv(x)

    def feats(self, x):
        return x.feats

    def replace(self, x, feats):
        return x.replace_feature(feats)

    def load_conv_weight(self, conv, weight, kernel_size):
        conv.weight.copy_(weight)


def _layer_case(setup) -> Prepared:
    """A peer adapter written as the real ones are: its own coarse tensor for up2 (inputs reordered
    onto its rows), fresh or cached maps, the harness's timed function."""
    spec, scene, c = setup.spec, setup.scene, setup.spec["C"]
    op = OPS[spec["op"]]
    conv = Conv3d(c, c, op.kernel, stride=op.stride, transposed=op.transposed)
    conv = conv.to(setup.device, setup.dtype).train(prepare.training(spec))
    with torch.no_grad():
        conv.weight.copy_(setup.weight)
    if op.transposed:
        down = Conv3d(c, c, 2, stride=2).to(setup.device, setup.dtype)
        zeros = torch.zeros(len(scene.coords), c, device=setup.device, dtype=setup.dtype)
        with torch.no_grad():
            coarse = down(VoxelTensor(zeros, scene.coords))
        # Its coarse rows reversed, so that the reorder onto this peer's rows is not the identity; a
        # new cache holds the fine sites the transposed conv must produce (its map is built once).
        cache = MapCache()
        cache.coords[(1, 1, 1)] = scene.coords
        cache.coords[(2, 2, 2)] = coarse.coords.flip(0)
        coarse = VoxelTensor(coarse.feats.flip(0), cache.coords[(2, 2, 2)], 2, cache=cache)
        inputs = [prepare.reorder(f, setup.in_coords.long(), coarse.coords.long()) for f in setup.inputs]

        def make_input(f):
            return coarse.replace_feature(f)
    else:
        base = VoxelTensor(setup.inputs[0], scene.coords)
        inputs = setup.inputs

        def make_input(f):
            return base.replace_feature(f) if spec["map"] == "cached" else VoxelTensor(f, scene.coords)

    with torch.no_grad():
        first = conv(make_input(inputs[0]))
    upstream = prepare.features(len(first.coords), c, setup.dtype, setup.device, seed=2, count=1)[0]
    fn, held = prepare.layer_fn(
        spec, lambda f: conv(make_input(f)).feats, [conv.weight], inputs, upstream, setup.device
    )

    def output():
        with torch.no_grad():
            out = conv(make_input(inputs[0]))
        return out.coords.long(), out.feats.float()

    return Prepared(fn=fn, inputs=inputs, output=output, held=held)


STAND_IN = VoxelPeer(
    "relconv-peer",
    lambda: (True, "test"),
    _layer_case,
    lambda setup: skeleton_case(setup, RelconvBackend()),
)


@pytest.fixture(scope="module")
def ceilings():
    return measure_ceilings(torch.device("cpu"), tiny=True)


@pytest.mark.parametrize(
    "suffix",
    [
        "/layer/tiny/subm3/C8/fp32/fresh/fwd",
        "/layer/tiny/down3/C8/fp32/cached/fwd+bwd",
        "/layer/tiny/up2/C8/fp32/cached/fwd+bwd",
        "/e2e/minkunet0.5/tiny/infer/fp32",
        "/e2e/minkunet0.5/tiny2/train/fp32",
    ],
)
def test_registered_peer_agrees_and_is_timed(monkeypatch, ceilings, suffix):
    monkeypatch.setattr(voxel_suite, "VOXEL_PEERS", (STAND_IN,))
    (spec,) = [s for s in voxel_suite.case_specs(["cpu"], tiny=True) if s["case"].endswith(suffix)]
    timing = TimingConfig(warmup_runs=1, warmup_seconds=0.0, runs=2)
    peers = {STAND_IN.name: STAND_IN.available()}
    rows = {r["impl"]: r for r in voxel_suite.run(spec, {}, peers, timing, ceilings)}
    assert rows["relconv"]["status"] == "ok", rows["relconv"]
    row = rows[STAND_IN.name]
    assert row["status"] == "ok" and row["agrees_with"] == "relconv", row
    assert row["max_rel_err"] <= 1e-4 and row["latency_ms"] > 0 and row["throughput_ms"] > 0


def test_unavailable_peer_is_reported_missing_without_building(monkeypatch, ceilings):
    def never_built(setup):
        raise AssertionError("a missing peer's case was built")

    missing = VoxelPeer("absent", lambda: (False, "not importable"), never_built, never_built)
    monkeypatch.setattr(voxel_suite, "VOXEL_PEERS", (missing,))
    spec = voxel_suite.case_specs(["cpu"], tiny=True)[0]
    timing = TimingConfig(warmup_runs=1, warmup_seconds=0.0, runs=2)
    peers = {missing.name: missing.available()}
    rows = {r["impl"]: r for r in voxel_suite.run(spec, {}, peers, timing, ceilings)}
    assert rows["absent"]["status"] == "missing: not importable"


def test_suite_peer_names_are_the_registry():
    names = [p.name for p in voxel_suite.VOXEL_PEERS]
    assert names == ["spconv", "warpconvnet", "torchsparse"]
    assert list(voxel_suite.PEERS) == names


def test_minkunet_skeleton_matches_relconv():
    """The peers' MinkUNet skeleton, run on relconv's own layers, reproduces relconv's MinkUNet:
    module order, channel plan, concatenation order and weight copying are right."""
    from benchmarks.workloads.voxels import load_scene
    from relconv.voxel.models import MinkUNet

    scene = load_scene("tiny", torch.device("cpu"))
    torch.manual_seed(0)
    ref = MinkUNet(4, 5, width=0.25).eval()
    be = RelconvBackend()
    peer = PeerMinkUNet(be, 4, 5, 0.25).eval()
    copy_weights(ref, peer)
    with torch.no_grad():
        want = ref(VoxelTensor(scene.feats, scene.coords))
        got = peer(be.tensor(scene.feats, scene.coords, 1))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
