"""Kernel maps against a brute-force neighbour search, and map invariants."""

import itertools

import pytest
import torch
from voxel_refs import as_triples, brute_force, random_voxels

from relconv.voxel import (
    generative_map,
    kernel_offsets,
    strided_map,
    strided_output_coords,
    submanifold_map,
)
from relconv.voxel.kernel_map import axis_offsets


def test_offset_order_x_slowest_z_fastest():
    offs = kernel_offsets((3, 2, 1))
    expected = [(x, y, 0) for x in (-1, 0, 1) for y in (0, 1)]
    assert offs.tolist() == [list(e) for e in expected]
    assert list(axis_offsets(4)) == [0, 1, 2, 3] and list(axis_offsets(5)) == [-2, -1, 0, 1, 2]


@pytest.mark.parametrize(
    "kernel,dilation,ts",
    [((3, 3, 3), (1, 1, 1), (1, 1, 1)), ((2, 4, 1), (1, 2, 1), (1, 1, 1)), ((5, 5, 5), (1, 1, 1), (2, 2, 2))],
)
def test_submanifold_against_brute_force(kernel, dilation, ts):
    x = random_voxels(80, 5, 1, batch=2, stride=ts[0])
    coords = x.coords.clone()
    coords[:, 1] -= 7  # negative coordinates are shifted internally
    rmap = submanifold_map(coords, kernel, dilation, ts)
    step = tuple(d * t for d, t in zip(dilation, ts, strict=True))
    assert as_triples(rmap) == brute_force(coords, coords, kernel, step)
    assert rmap.unique_slots and rmap.num_in == rmap.num_out == len(x)


@pytest.mark.parametrize(
    "kernel,stride,dilation",
    [((2, 2, 2), (2, 2, 2), (1, 1, 1)), ((3, 3, 3), (2, 2, 2), (1, 1, 1)), ((3, 1, 2), (3, 1, 2), (2, 1, 1))],
)
def test_strided_against_brute_force(kernel, stride, dilation):
    x = random_voxels(100, 7, 1, batch=2)
    coords = x.coords - torch.tensor([0, 3, 2, 5], dtype=torch.int32)
    rmap, out = strided_map(coords, kernel, stride, dilation, (1, 1, 1))
    s = torch.tensor(stride)
    expected = torch.unique(
        torch.cat([coords[:, :1].long(), torch.div(coords[:, 1:].long(), s, rounding_mode="floor") * s], 1),
        dim=0,
    )
    assert torch.equal(out.long(), expected)
    assert torch.equal(strided_output_coords(coords, stride, (1, 1, 1)), out)
    assert as_triples(rmap) == brute_force(coords, out, kernel, dilation)


def test_generative_against_brute_force():
    x = random_voxels(30, 4, 1, batch=2)
    coords = x.coords * torch.tensor([1, 2, 2, 2], dtype=torch.int32)
    rmap, out = generative_map(coords, (3, 3, 3), (2, 2, 2), (1, 1, 1), (2, 2, 2))
    offs = kernel_offsets((3, 3, 3))
    gen = {tuple([int(c[0]), *(int(v) for v in c[1:] + o)]) for c in coords.long() for o in offs}
    assert {tuple(r) for r in out.tolist()} == gen
    # out = in + offset  <=>  in = out + offset * (-1)
    assert as_triples(rmap) == brute_force(coords, out, (3, 3, 3), (-1, -1, -1))


def test_pairs_canonical_order():
    x = random_voxels(200, 6, 1, batch=2)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    rmap = submanifold_map(x.coords[perm], (3, 3, 3), (1, 1, 1), (1, 1, 1))
    key = rmap.relation_of_pairs() * rmap.num_out + rmap.out_index.long()
    assert bool((key.diff() > 0).all())
    table = rmap.neighbor_table()
    assert bool((table[:, 13] == torch.arange(len(x), dtype=table.dtype)).all())


def test_all_kernel_sizes_build():
    x = random_voxels(50, 5, 1)
    for k in itertools.product(range(1, 8), repeat=1):
        rmap = submanifold_map(x.coords, (k[0], k[0], k[0]), (1, 1, 1), (1, 1, 1))
        assert rmap.num_relations == k[0] ** 3
