"""Bad input raises a clear error naming the argument; nothing crashes or returns garbage."""

import pytest
import torch

from relconv import RelationalMap, relational_conv
from tests.ops.maps import random_map

op = torch.ops.relconv.relational_conv.default
wg_op = torch.ops.relconv.relational_conv_weight_grad.default


@pytest.fixture
def setup():
    rmap = random_map(10, 8, 3, 40, with_scale=False)
    return rmap, torch.randn(10, 6), torch.randn(3, 6, 4)


def test_wrapper_checks(setup):
    rmap, x, w = setup
    with pytest.raises(ValueError, match="x has 9 rows"):
        relational_conv(x[:9], w, rmap)
    with pytest.raises(ValueError, match="x has 5 channels"):
        relational_conv(x[:, :5], w, rmap)
    with pytest.raises(ValueError, match="weight has 2 relations"):
        relational_conv(x, w[:2], rmap)
    with pytest.raises(ValueError, match="weight must be 4-D"):
        relational_conv(x, w, rmap, groups=2)
    with pytest.raises(ValueError, match=r"weight.shape\[1\] \(2\) must equal groups \(3\)"):
        relational_conv(x, w.view(3, 2, 3, 4), rmap, groups=3)
    with pytest.raises(ValueError, match="groups must be a positive"):
        relational_conv(x, w, rmap, groups=0)
    with pytest.raises(ValueError, match="x is on meta"):
        relational_conv(x.to("meta"), w, rmap)
    with pytest.raises(TypeError, match="rmap must be a RelationalMap"):
        relational_conv(x, w, None)


def test_op_checks_dtypes_and_shapes(setup):
    rmap, x, w = setup
    w4 = w.unsqueeze(1)
    ii, oi, rp = rmap.in_index, rmap.out_index, rmap.rel_ptr
    with pytest.raises(ValueError, match="weight dtype"):
        op(x, w4.double(), ii, oi, rp, None, 8)
    with pytest.raises(ValueError, match="x must be float32, float64"):
        op(x.int(), w4.int(), ii, oi, rp, None, 8)
    with pytest.raises(ValueError, match="in_index must be int32 or int64"):
        op(x, w4, ii.float(), oi.float(), rp, None, 8)
    with pytest.raises(ValueError, match="out_index dtype"):
        op(x, w4, ii, oi.long(), rp, None, 8)
    with pytest.raises(ValueError, match="same length"):
        op(x, w4, ii, oi[:-1], rp, None, 8)
    with pytest.raises(ValueError, match="rel_ptr must be int64"):
        op(x, w4, ii, oi, rp.int(), None, 8)
    with pytest.raises(ValueError, match="rel_ptr has 3 entries"):
        op(x, w4, ii, oi, rp[:3], None, 8)
    with pytest.raises(ValueError, match="scale must have shape"):
        op(x, w4, ii, oi, rp, torch.ones(3), 8)
    with pytest.raises(ValueError, match="scale must be Float"):
        op(x, w4, ii, oi, rp, torch.ones(40, dtype=torch.float64), 8)
    with pytest.raises(ValueError, match="num_out must be non-negative"):
        op(x, w4, ii, oi, rp, None, -1)


def test_op_checks_index_ranges_and_rel_ptr(setup):
    rmap, x, w = setup
    w4 = w.unsqueeze(1)
    ii, oi, rp = rmap.in_index, rmap.out_index, rmap.rel_ptr
    bad = ii.clone()
    bad[5] = 10
    with pytest.raises(ValueError, match=r"in_index values must lie in \[0, 10\)"):
        op(x, w4, bad, oi, rp, None, 8)
    bad = oi.clone()
    bad[0] = -1
    with pytest.raises(ValueError, match=r"out_index values must lie in \[0, 8\)"):
        op(x, w4, ii, bad, rp, None, 8)
    with pytest.raises(ValueError, match="monotone"):
        op(x, w4, ii, oi, torch.tensor([0, 30, 20, 40]), None, 8)
    with pytest.raises(ValueError, match=r"rel_ptr\[-1\] = 39 must equal the number of pairs"):
        op(x, w4, ii, oi, torch.tensor([0, 10, 20, 39]), None, 8)
    with pytest.raises(ValueError, match="groups"):
        wg_op(x, torch.randn(8, 4), ii, oi, rp, None, 4)


def test_map_validation():
    ii, oi, rel = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]), torch.tensor([0, 1, 1])
    with pytest.raises(ValueError, match=r"relation values must lie in \[0, 2\)"):
        RelationalMap.from_triples(ii, oi, rel + 1, 3, 2, 2)
    with pytest.raises(ValueError, match=r"in_index values must lie in \[0, 2\)"):
        RelationalMap.from_triples(ii, oi, rel, 2, 2, 2)
    with pytest.raises(ValueError, match=r"out_index values must lie in \[0, 1\)"):
        RelationalMap.from_triples(ii, oi, rel, 3, 1, 2)
    with pytest.raises(ValueError, match="relation has 2 entries"):
        RelationalMap.from_triples(ii, oi, rel[:2], 3, 2, 2)
    with pytest.raises(ValueError, match="in_index must be an integer tensor"):
        RelationalMap.from_triples(ii.float(), oi, rel, 3, 2, 2)
    with pytest.raises(ValueError, match="num_relations must be positive"):
        RelationalMap.from_triples(ii, oi, rel, 3, 2, 0)
    with pytest.raises(ValueError, match="scale must have shape"):
        RelationalMap.from_triples(ii, oi, rel, 3, 2, 2, scale=torch.ones(2))
    with pytest.raises(ValueError, match="rel_ptr must be monotone"):
        RelationalMap(ii.int(), oi.int(), torch.tensor([0, 2, 1, 3]), 3, 2)
    with pytest.raises(ValueError, match="rel_ptr must start at 0"):
        RelationalMap(ii.int(), oi.int(), torch.tensor([1, 3]), 3, 2)
    with pytest.raises(ValueError, match=r"rel_ptr\[-1\] = 2 must equal the number of pairs \(3\)"):
        RelationalMap(ii.int(), oi.int(), torch.tensor([0, 2]), 3, 2)
    with pytest.raises(ValueError, match="out_index dtype"):
        RelationalMap(ii.int(), oi.long(), torch.tensor([0, 3]), 3, 2)
    with pytest.raises(ValueError, match="rel_ptr must be int64"):
        RelationalMap(ii.int(), oi.int(), torch.tensor([0, 3], dtype=torch.int32), 3, 2)
