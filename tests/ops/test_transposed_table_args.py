"""The op's transposed_table / transposed_order arguments: metadata checks on every device.

The forward never reads the transposed table (only the CUDA backward does), so the CPU kernel
checks its metadata and computes the same output with or without it; a bad argument raises a
ValueError naming it on every device.
"""

import pytest
import torch

from relconv.voxel import submanifold_map
from tests.conftest import DEVICES

op = torch.ops.relconv.relational_conv.default


def _args(device):
    """A small injective voxel map's op arguments: x, weight, pairs, num_out and both tables."""
    g = torch.Generator().manual_seed(0)
    coords = torch.randint(0, 5, (80, 4), generator=g)
    coords[:, 0] = 0  # one batch
    coords = torch.unique(coords, dim=0).int().to(device)
    rmap = submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1))
    assert rmap.injective
    x = torch.randn(rmap.num_in, 4, generator=g).to(device)
    w = torch.randn(rmap.num_relations, 1, 4, 3, generator=g).to(device)
    pairs = (rmap.in_index, rmap.out_index, rmap.rel_ptr, None, rmap.num_out)
    return x, w, pairs, rmap.neighbor_table(), rmap.transposed_neighbor_table()


def _call(x, w, pairs, table, transposed, transposed_order=None):
    return op(x, w, *pairs, table, None, None, False, transposed, transposed_order)


@pytest.mark.parametrize("device", DEVICES)
def test_transposed_table_leaves_the_forward_unchanged(device):
    x, w, pairs, table, transposed = _args(device)
    order = torch.arange(x.shape[0], dtype=table.dtype, device=device).flip(0)
    plain = op(x, w, *pairs, table)
    assert torch.equal(_call(x, w, pairs, table, transposed, order), plain)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_transposed_table_names_the_argument(device):
    x, w, pairs, table, transposed = _args(device)
    with pytest.raises(ValueError, match=r"transposed_table must have shape \[num_in, R\]"):
        _call(x, w, pairs, table, transposed[:-1])
    with pytest.raises(ValueError, match=r"transposed_table must have shape \[num_in, R\]"):
        _call(x, w, pairs, table, transposed[:, :-1])
    with pytest.raises(ValueError, match="transposed_table dtype"):
        _call(x, w, pairs, table, transposed.long())
    with pytest.raises(ValueError, match="transposed_table needs a neighbor_table"):
        _call(x, w, pairs, None, transposed)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_transposed_order_names_the_argument(device):
    x, w, pairs, table, transposed = _args(device)
    order = torch.arange(x.shape[0], dtype=table.dtype, device=device)
    with pytest.raises(ValueError, match=r"transposed_order must have shape \[num_in\]"):
        _call(x, w, pairs, table, transposed, order[:-1])
    with pytest.raises(ValueError, match="transposed_order dtype"):
        _call(x, w, pairs, table, transposed, order.long())
    with pytest.raises(ValueError, match="transposed_order needs a transposed_table"):
        _call(x, w, pairs, table, None, order)


# A device mismatch needs two devices the dispatcher sends to the same kernel: a CUDA op with one
# argument left on the CPU (a "meta" argument would route the whole call to the fake kernel).
@pytest.mark.cuda
def test_transposed_arguments_on_another_device_name_the_argument():
    x, w, pairs, table, transposed = _args("cuda")
    order = torch.arange(x.shape[0], dtype=table.dtype, device="cuda")
    with pytest.raises(ValueError, match="transposed_table must be on cuda"):
        _call(x, w, pairs, table, transposed.cpu())
    with pytest.raises(ValueError, match="transposed_order must be on cuda"):
        _call(x, w, pairs, table, transposed, order.cpu())
