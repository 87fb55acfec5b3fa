"""CPU <-> CUDA parity of voxelisation, kernel maps, convs and a MinkUNet step (GPU host only).

Strided output sites come out sorted by coordinate on the CPU and in order of first occurrence on
CUDA (deterministic either way), so strided maps and outputs are compared by coordinate, not by row.
"""

import pytest
import torch
from voxel_refs import as_triples, random_voxels

from relconv.voxel import conv3d, generative_map, strided_map, submanifold_map, voxelize
from relconv.voxel.models import MinkUNet
from relconv.voxel.synthetic import raycast_scan

pytestmark = pytest.mark.cuda


def test_voxelize_parity():
    points, intensity = raycast_scan(beams=32, azimuth_steps=512)
    pts = torch.from_numpy(points)
    feats = torch.cat([pts, torch.from_numpy(intensity)[:, None]], 1)
    cpu = voxelize(pts, 0.1, feats=feats)
    gpu = voxelize(pts.cuda(), 0.1, feats=feats.cuda())
    assert torch.equal(gpu.tensor.coords.cpu(), cpu.tensor.coords)
    assert torch.equal(gpu.point_to_voxel.cpu(), cpu.point_to_voxel)
    torch.testing.assert_close(gpu.tensor.feats.cpu(), cpu.tensor.feats)


@pytest.mark.parametrize("kernel", [(3, 3, 3), (2, 2, 2), (5, 1, 3), (7, 7, 7)])
def test_map_parity(kernel):
    x = random_voxels(3000, 20, 1, batch=2)
    c, g = x.coords, x.coords.cuda()
    for build in (
        lambda t: submanifold_map(t, kernel, (1, 1, 1), (1, 1, 1)),
        lambda t: generative_map(t, kernel, (1, 1, 1), (1, 1, 1), (1, 1, 1))[0],
    ):
        mc, mg = build(c), build(g)
        assert torch.equal(mc.rel_ptr, mg.rel_ptr.cpu())
        assert torch.equal(mc.in_index, mg.in_index.cpu()) and torch.equal(mc.out_index, mg.out_index.cpu())
        assert as_triples(mc) == as_triples(mg.to("cpu"))
    (mc, out_c), (mg, out_g) = (strided_map(t, kernel, (2, 2, 2), (1, 1, 1), (1, 1, 1)) for t in (c, g))
    assert torch.equal(mc.rel_ptr, mg.rel_ptr.cpu())
    assert _coord_triples(mc, c, out_c) == _coord_triples(mg.to("cpu"), c, out_g.cpu())


def _coord_triples(rmap, in_coords, out_coords):
    """Pairs as (input site, output site, offset): independent of the output row order."""
    ins = [tuple(r) for r in in_coords[rmap.in_index.long()].tolist()]
    outs = [tuple(r) for r in out_coords[rmap.out_index.long()].tolist()]
    return set(zip(ins, outs, rmap.relation_of_pairs().tolist(), strict=True))


def _by_coordinate(x):
    """(coords, feats) with rows sorted lexicographically by (batch, x, y, z)."""
    c = x.coords.long().cpu()
    order = torch.arange(len(c))
    for col in range(3, -1, -1):  # stable sorts, last key first
        order = order[torch.sort(c[order, col], stable=True).indices]
    return c[order], x.feats.float().cpu()[order]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("stride,transposed", [(1, False), (2, False), (2, True)])
def test_conv_parity(dtype, stride, transposed):
    fine = random_voxels(3000, 20, 16, batch=2, dtype=torch.float32)
    w_down = torch.randn(8, 16, 16) / 10
    k = 2 if stride == 2 else 3
    w = torch.randn(k**3, 16, 32) / 10

    def run(device, dt):
        x = fine.to(device)
        if transposed:  # the transposed conv needs the fine coordinates in the tensor's map cache
            x = conv3d(x, w_down.to(device), 2, 2)
        return conv3d(x.to(dt), w.to(device, dt), k, stride, transposed=transposed)

    (cc, cf), (gc, gf) = _by_coordinate(run("cpu", torch.float32)), _by_coordinate(run("cuda", dtype))
    assert torch.equal(gc, cc)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(gf, cf, atol=tol, rtol=tol)


def test_minkunet_cuda_forward_backward():
    points, intensity = raycast_scan(beams=32, azimuth_steps=512)
    pts = torch.from_numpy(points)
    feats = torch.cat([pts, torch.from_numpy(intensity)[:, None]], 1)
    v = voxelize(pts.cuda(), 0.1, feats=feats.cuda())
    model = MinkUNet(4, 19, width=0.5).cuda()
    logits = model(v.tensor)
    logits.square().mean().backward()
    assert logits.shape == (len(v.tensor), 19)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
