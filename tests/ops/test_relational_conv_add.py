"""`relational_conv_add_(out, x, weight, rmap)` adds the pairs' sum into `out` in place: it equals
`out + relational_conv(x, weight, rmap)` on the CPU and on CUDA (where fp32 / fp64 pairs land in out
straight from the pair kernel), refuses what autograd would need, and names every bad argument."""

import pytest
import torch

from relconv import RelationalMap
from relconv.ops import Dataflow, adds_in_place, relational_conv, relational_conv_add_
from relconv.ops.reference import relational_conv_reference
from tests.ops.maps import TOLERANCE, random_map, rel_error

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _rand(shape, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype)


def _case(device, dtype, groups=1, index_dtype=torch.int32, with_scale=True):
    rmap = random_map(41, 33, 7, 500, device=device, index_dtype=index_dtype, with_scale=with_scale)
    x = _rand((41, 16), dtype, device, 1)
    shape = (7, 16, 24) if groups == 1 else (7, groups, 16 // groups, 24 // groups)
    w = _rand(shape, dtype, device, 2) * 0.25
    base = _rand((33, 24), dtype, device, 3)
    return rmap, x, w, base


def _expected(rmap, x, w, base, groups):
    return base.double() + relational_conv_reference(x.double(), w.double(), rmap, groups=groups)


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, cuda])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_adds_the_sum_onto_out(device, dtype, groups, index_dtype):
    rmap, x, w, base = _case(device, dtype, groups, index_dtype)
    out = base.clone()
    returned = relational_conv_add_(out, x, w, rmap, groups)
    assert returned is out and out.dtype == dtype
    assert rel_error(out, _expected(rmap, x, w, base, groups)) < 2 * TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
def test_float32_equals_the_functional_conv_plus_out(device):
    # In float32 the CUDA pair kernel adds onto out exactly as it adds onto the op's own accumulator
    # started from zero; only the order of the atomic additions differs, so compare to a tolerance.
    rmap, x, w, base = _case(device, torch.float32, with_scale=False)
    out = relational_conv_add_(base.clone(), x, w, rmap)
    ref = base + relational_conv(x, w, rmap, dataflow=Dataflow.FETCH_ON_DEMAND)
    assert rel_error(out, ref) < 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_a_strided_out_is_updated_in_place(device):
    rmap, x, w, base = _case(device, torch.float32)
    wide = torch.zeros(33, 48, device=device)
    wide[:, ::2] = base
    view = wide[:, ::2]
    relational_conv_add_(view, x, w, rmap)
    assert rel_error(wide[:, ::2], _expected(rmap, x, w, base, 1)) < 1e-5
    assert torch.count_nonzero(wide[:, 1::2]) == 0  # the columns between are untouched


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_map_leaves_out_unchanged(device):
    rmap = random_map(5, 6, 3, 0, device=device)
    x, w = _rand((5, 4), torch.float32, device, 1), _rand((3, 4, 8), torch.float32, device, 2)
    base = _rand((6, 8), torch.float32, device, 3)
    out = relational_conv_add_(base.clone(), x, w, rmap)
    assert torch.equal(out, base)


def test_refuses_autograd():
    rmap, x, w, base = _case("cpu", torch.float32)
    with pytest.raises(RuntimeError, match="not differentiable"):
        relational_conv_add_(base.clone(), x.requires_grad_(), w, rmap)
    with torch.no_grad():
        relational_conv_add_(base.clone(), x, w, rmap)  # fine once no gradient is recorded


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda b: b[:, :10], "out must have shape"),
        (lambda b: b[:5], "out must have shape"),
        (lambda b: b.double(), "out dtype"),
        (lambda b: b.unsqueeze(0), "out must have shape"),
    ],
)
def test_bad_out_is_named(bad, message):
    rmap, x, w, base = _case("cpu", torch.float32)
    with pytest.raises(ValueError, match=message):
        relational_conv_add_(bad(base.clone()), x, w, rmap)


def test_out_sharing_memory_with_x_is_refused():
    rmap = random_map(33, 33, 3, 100)
    x = _rand((33, 8), torch.float32, "cpu", 1)
    w = _rand((3, 8, 8), torch.float32, "cpu", 2)
    with pytest.raises(ValueError, match="must not share memory"):
        relational_conv_add_(x, x, w, rmap)


def test_out_must_be_a_tensor():
    rmap, x, w, _ = _case("cpu", torch.float32)
    with pytest.raises(TypeError, match="out must be a Tensor"):
        relational_conv_add_([[0.0]], x, w, rmap)


def test_adds_in_place_is_false_on_the_cpu():
    rmap, x, w, _ = _case("cpu", torch.float32)
    assert not adds_in_place(x, w, rmap)  # the CPU gains nothing over adding afterwards


@cuda
@pytest.mark.cuda
def test_adds_in_place_follows_the_plan():
    rmap, x, w, _ = _case("cuda", torch.float32)
    assert adds_in_place(x, w, rmap)  # a scaled map runs on the pairs
    assert not adds_in_place(x.half(), w.half(), rmap)  # 16-bit has an accumulator of its own
    ids = torch.arange(33, dtype=torch.int32, device="cuda")
    rel_ptr = torch.tensor([0] + [33] * 7, device="cuda")
    unique = RelationalMap(ids, ids, rel_ptr, 41, 33, unique_slots=True)
    assert not adds_in_place(x, w[:, :, :16].contiguous(), unique)  # a narrow exact layer runs on the table


def test_opcheck():
    rmap, x, w, base = _case("cpu", torch.float32)
    in_index, out_index, rel_ptr = rmap.in_index, rmap.out_index, rmap.rel_ptr
    torch.library.opcheck(
        torch.ops.relconv.relational_conv_add_.default,
        (base.clone(), x, w, in_index, out_index, rel_ptr, rmap.scale.float()),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_a_voxel_map_built_as_a_table_and_torch_compile():
    from relconv.voxel import submanifold_map

    gen = torch.Generator().manual_seed(0)
    xyz = torch.randint(0, 6, (50, 3), generator=gen)
    coords = torch.unique(torch.cat([torch.zeros(50, 1, dtype=torch.long), xyz], 1), dim=0).int()
    rmap = submanifold_map(coords, (3, 3, 3), (1, 1, 1), (1, 1, 1))
    x, w = _rand((coords.shape[0], 8), torch.float32, "cpu", 1), _rand((27, 8, 4), torch.float32, "cpu", 2)
    base = _rand((coords.shape[0], 4), torch.float32, "cpu", 3)
    expected = base + relational_conv(x, w, rmap)
    assert rel_error(relational_conv_add_(base.clone(), x, w, rmap), expected) < 1e-6
    compiled = torch.compile(lambda o, x, w: relational_conv_add_(o, x, w, rmap), fullgraph=True)
    assert rel_error(compiled(base.clone(), x, w), expected) < 1e-6
