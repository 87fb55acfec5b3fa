"""relconv::grid_conv_map (the CUDA builder of grid maps: spconv's strided layers, TorchSparse's
strided convs) against the torch-op builder that serves the CPU: the same output sites in the same
order and the same neighbour table, over regular and transposed layers, even and odd kernels,
padding, dilation and 2-D grids; and its errors."""

import itertools

import pytest
import torch

from relconv.voxel import grid_map as geometry

pytestmark = pytest.mark.cuda

GRID_OP = torch.ops.relconv.grid_conv_map.default

# (spatial shape, kernel, stride, padding, dilation, transposed); a third axis of 1 is a 2-D grid
GEOMETRIES = [
    ([21, 17, 9], [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], False),
    ([21, 17, 9], [3, 3, 3], [1, 1, 1], [0, 0, 0], [1, 1, 1], False),
    ([21, 17, 9], [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False),
    ([21, 17, 9], [3, 1, 1], [2, 1, 1], [0, 0, 0], [1, 1, 1], False),
    ([21, 17, 9], [3, 3, 3], [2, 2, 2], [1, 1, 1], [2, 2, 2], False),
    ([21, 17, 9], [3, 2, 3], [3, 2, 1], [2, 0, 1], [1, 2, 1], False),
    ([21, 17, 9], [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], True),
    ([21, 17, 9], [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], True),
    ([21, 17, 9], [3, 2, 1], [1, 2, 3], [1, 0, 0], [2, 1, 1], True),
    ([40, 33, 1], [3, 3, 1], [2, 2, 1], [1, 1, 0], [1, 1, 1], False),
    ([40, 33, 1], [3, 3, 1], [2, 2, 1], [1, 1, 0], [1, 1, 1], True),
]


# Grids far larger than their sites: the op finds the sites through a hash set of keys and a sort,
# where the grids above fit a bitmap (grid_map.cu, sites_by_key_set and sites_by_bits).
SPARSE_GEOMETRIES = [
    ([3000, 2000, 400], [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], False),
    ([3000, 2000, 400], [3, 2, 3], [3, 2, 1], [2, 0, 1], [1, 2, 1], False),
    ([3000, 2000, 400], [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], True),
]


def sparse_sites(shape, batch_size, n, seed):
    g = torch.Generator().manual_seed(seed)
    cols = [torch.randint(0, extent, (n,), generator=g) for extent in (batch_size, *shape)]
    return torch.unique(torch.stack(cols, 1), dim=0).int()


def random_sites(shape, batch_size, n, seed):
    g = torch.Generator().manual_seed(seed)
    space = batch_size * shape[0] * shape[1] * shape[2]
    keys = torch.randperm(space, generator=g)[: min(n, space)]
    cols = []
    for extent in reversed(shape):
        cols.append(keys % extent)
        keys = keys // extent
    return torch.stack([keys, *cols[::-1]], 1).int()


def output_shape(shape, k, s, p, d, transposed):
    if transposed:
        return geometry.deconv_output_size(shape, k, s, p, [0, 0, 0])
    return geometry.conv_output_size(shape, k, s, p, d)


def assert_op_equals_builder(geometry_case, coords, batch_size):
    shape, k, s, p, d, transposed = geometry_case
    out_shape = output_shape(shape, k, s, p, d, transposed)
    ref_map, ref_coords = geometry.build_map(coords, batch_size, shape, out_shape, k, s, p, d, transposed)
    got_coords, table = GRID_OP(coords.cuda(), batch_size, shape, out_shape, k, s, p, d, transposed)
    assert torch.equal(got_coords.cpu(), ref_coords)
    assert table.dtype == torch.int32
    assert torch.equal(table.cpu(), ref_map.neighbor_table().int())


@pytest.mark.parametrize("case", range(len(GEOMETRIES)))
@pytest.mark.parametrize("batch_size", [1, 3])
def test_grid_op_equals_the_torch_builder(case, batch_size):
    coords = random_sites(GEOMETRIES[case][0], batch_size, 700, seed=case)
    assert_op_equals_builder(GEOMETRIES[case], coords, batch_size)


@pytest.mark.parametrize("case", range(len(SPARSE_GEOMETRIES)))
@pytest.mark.parametrize("batch_size", [1, 3])
def test_grid_op_equals_the_torch_builder_on_sparse_grids(case, batch_size):
    coords = sparse_sites(SPARSE_GEOMETRIES[case][0], batch_size, 700, seed=case)
    assert_op_equals_builder(SPARSE_GEOMETRIES[case], coords, batch_size)


def test_layers_build_their_cuda_maps_with_the_grid_op():
    coords = random_sites([21, 17, 9], 2, 500, seed=5).cuda()
    one, three = [1] * 3, [3] * 3
    rmap, out_coords = geometry.build_map(coords, 2, [21, 17, 9], [11, 9, 5], three, [2] * 3, one, one, False)
    assert not rmap.has_pairs  # the table map of the op, not torch-built pair lists
    assert out_coords.is_cuda and rmap.injective


def test_every_site_is_reached_once_per_kernel_index():
    # a dense block: every output of a stride-1 conv without padding sees all 27 inputs
    shape = [6, 5, 4]
    grid = torch.tensor(list(itertools.product(range(1), *map(range, shape))), dtype=torch.int32)
    out_coords, table = GRID_OP(grid.cuda(), 1, shape, [4, 3, 2], [3] * 3, [1] * 3, [0] * 3, [1] * 3, False)
    assert out_coords.shape == (24, 4)
    assert bool((table >= 0).all())
    assert bool((table.sort(1).values.diff(dim=1) > 0).all())  # 27 distinct inputs per output


@pytest.mark.parametrize("extent", [10, 100_000])  # sites as bits over the grid, or as a key set
def test_grid_op_errors_name_the_problem(extent):
    coords = random_sites([10, 10, 10], 1, 50, seed=1).cuda()
    args = (1, [extent] * 3, [(extent + 1) // 2] * 3, [3] * 3, [2] * 3, [1] * 3, [1] * 3, False)
    outside = coords.clone()
    outside[3, 2] = extent
    with pytest.raises(ValueError, match="inside spatial_shape"):
        GRID_OP(outside, *args)
    bad_batch = coords.clone()
    bad_batch[0, 0] = 1
    with pytest.raises(ValueError, match="batch indices in"):
        GRID_OP(bad_batch, *args)
    with pytest.raises(ValueError, match="duplicate"):
        GRID_OP(torch.cat([coords, coords[:1]]), *args)
    with pytest.raises(ValueError, match="int32"):
        GRID_OP(coords.long(), *args)
    with pytest.raises(ValueError, match="stride"):
        GRID_OP(coords, 1, [10] * 3, [5] * 3, [3] * 3, [0, 2, 2], [1] * 3, [1] * 3, False)
    with pytest.raises(ValueError, match="shape"):
        GRID_OP(coords[:, :3].contiguous(), *args)


def test_empty_input_gives_an_empty_map():
    empty = torch.empty(0, 4, dtype=torch.int32, device="cuda")
    out_coords, table = GRID_OP(empty, 1, [8] * 3, [4] * 3, [3] * 3, [2] * 3, [1] * 3, [1] * 3, False)
    assert out_coords.shape == (0, 4) and table.shape == (0, 27)
