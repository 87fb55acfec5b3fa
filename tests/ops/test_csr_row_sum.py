"""relconv::csr_row_sum against a dense product, on every dtype, index dtype and channel layout."""

import pytest
import torch

import relconv  # noqa: F401  (loads the ops)
from tests.conftest import DEVICES, no_host_sync

op = torch.ops.relconv.csr_row_sum


def random_csr(rows: int, cols: int, entries: int, index_dtype=torch.int64, seed: int = 0):
    """(row_ptr, col, values float64) of `entries` entries sorted by row; repeated columns allowed,
    some rows empty."""
    gen = torch.Generator().manual_seed(seed)
    row = torch.sort(torch.randint(0, rows, (entries,), generator=gen))[0]
    col = torch.randint(0, cols, (entries,), generator=gen)
    values = torch.rand(entries, generator=gen, dtype=torch.float64) - 0.5
    row_ptr = torch.searchsorted(row, torch.arange(rows + 1))
    return row_ptr.to(index_dtype), col.to(index_dtype), values


def dense_product(row_ptr, col, values, x) -> torch.Tensor:
    """The same sum in float64 through a dense [rows, cols] matrix."""
    rows = row_ptr.numel() - 1
    row = torch.repeat_interleave(torch.arange(rows), row_ptr.diff().long())
    dense = torch.zeros(rows, x.size(0), dtype=torch.float64)
    dense.index_put_((row, col.long()), values.double().cpu(), accumulate=True)
    return dense @ x.double().cpu()


TOLERANCE = {
    torch.float64: {"atol": 1e-12, "rtol": 1e-12},
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 1e-2, "rtol": 1e-2},
    torch.bfloat16: {"atol": 4e-2, "rtol": 2e-2},
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("channels", [1, 3, 8, 64, 100, 264])
def test_matches_the_dense_product(device, dtype, index_dtype, channels):
    row_ptr, col, values = random_csr(37, 29, 300, index_dtype)
    values = values.to(dtype)
    x = torch.randn(29, channels, dtype=torch.float64).to(dtype)
    got = op(row_ptr.to(device), col.to(device), values.to(device), x.to(device))
    assert got.dtype == dtype and got.shape == (37, channels)
    torch.testing.assert_close(got.double().cpu(), dense_product(row_ptr, col, values, x), **TOLERANCE[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_unaligned_features_take_the_element_path(device):
    # x starts one element into its storage: 16-byte loads would be misaligned.
    row_ptr, col, values = random_csr(20, 10, 80)
    x = torch.randn(10 * 64 + 1, device=device)[1:].view(10, 64)
    got = op(row_ptr.to(device), col.to(device), values.float().to(device), x)
    expected = dense_product(row_ptr, col, values.float(), x)
    torch.testing.assert_close(got.double().cpu(), expected, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
def test_empty_rows_and_empty_inputs(device):
    x = torch.randn(4, 8, device=device)
    no_entries = torch.zeros(6, dtype=torch.long, device=device)
    empty = torch.zeros(0, dtype=torch.long, device=device)
    got = op(no_entries, empty, torch.zeros(0, device=device), x)
    assert got.shape == (5, 8) and not got.any()
    assert op(
        torch.zeros(1, dtype=torch.long, device=device), empty, torch.zeros(0, device=device), x
    ).shape == (0, 8)
    # No features to gather: every row is zero.
    row_ptr = torch.tensor([0, 2, 3], device=device)
    got = op(row_ptr, torch.tensor([0, 1, 0], device=device), torch.ones(3, device=device), x[:0])
    assert got.shape == (2, 8) and not got.any()


@pytest.mark.parametrize("device", DEVICES)
def test_entries_out_of_range_are_skipped(device):
    x = torch.arange(12.0, device=device).view(4, 3)
    row_ptr = torch.tensor([-5, 2, 9], device=device)  # clamped to the 4 entries
    col = torch.tensor([1, 7, -1, 3], device=device)  # 7 and -1 lie outside x
    got = op(row_ptr, col, torch.ones(4, device=device), x)
    torch.testing.assert_close(got.cpu(), torch.stack([x[1], x[3]]).cpu())


@pytest.mark.cuda
def test_cuda_call_does_not_synchronise():
    row_ptr, col, values = random_csr(300, 200, 3000)
    args = (row_ptr.cuda(), col.cuda(), values.float().cuda(), torch.randn(200, 64, device="cuda"))
    first = op(*args)
    with no_host_sync():
        second = op(*args)
    torch.testing.assert_close(second, first)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"x": torch.zeros(3)}, "x must be 2-D"),
        ({"x": torch.zeros(3, 2, dtype=torch.int32)}, "x must be float32"),
        ({"row_ptr": torch.zeros(2, 2, dtype=torch.long)}, "row_ptr must be 1-D"),
        ({"row_ptr": torch.zeros(0, dtype=torch.long)}, "row_ptr must be 1-D"),
        ({"row_ptr": torch.zeros(3)}, "row_ptr must be int32 or int64"),
        ({"col": torch.zeros(2, dtype=torch.int32)}, "col must be 1-D with row_ptr's dtype"),
        ({"values": torch.zeros(3)}, "one entry per col entry"),
        ({"values": torch.zeros(2, dtype=torch.float64)}, "values dtype"),
    ],
)
def test_bad_arguments_name_the_argument(change, message):
    args = {
        "row_ptr": torch.tensor([0, 1, 2]),
        "col": torch.tensor([0, 1]),
        "values": torch.ones(2),
        "x": torch.ones(2, 3),
    }
    args.update(change)
    with pytest.raises(ValueError, match=message):
        op(**args)


@pytest.mark.cuda
def test_arguments_on_another_device_are_refused():
    with pytest.raises(ValueError, match="must be on x's device"):
        op(torch.tensor([0, 1]), torch.tensor([0]), torch.ones(1), torch.ones(1, 3, device="cuda"))


def hub_csr(index_dtype=torch.int64):
    """Rows of 1000, 64, 65, 0, 129 and 3 entries: shorter than, at and past the length at which the
    CUDA kernel cuts a row into chunks."""
    lengths = torch.tensor([1000, 64, 65, 0, 129, 3])
    row_ptr = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    gen = torch.Generator().manual_seed(1)
    col = torch.randint(0, 50, (int(lengths.sum()),), generator=gen)
    values = torch.rand(col.numel(), generator=gen, dtype=torch.float64)
    return row_ptr.to(index_dtype), col.to(index_dtype), values


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_long_rows_match_the_dense_product(device, dtype, index_dtype):
    row_ptr, col, values = hub_csr(index_dtype)
    values = values.to(dtype)
    x = torch.randn(50, 24, dtype=torch.float64).to(dtype)
    got = op(row_ptr.to(device), col.to(device), values.to(device), x.to(device))
    # A 1000-entry row of [0, 1) weights: the tolerance scales with the row's magnitude.
    expected = dense_product(row_ptr, col, values, x)
    scale = expected.abs().amax(1, keepdim=True).clamp_min(1)
    torch.testing.assert_close(got.double().cpu() / scale, expected / scale, **TOLERANCE[dtype])


@pytest.mark.cuda
def test_deterministic_mode_walks_long_rows_whole():
    row_ptr, col, values = hub_csr()
    x = torch.randn(50, 64, dtype=torch.float64)
    args = (row_ptr.cuda(), col.cuda(), values.float().cuda(), x.float().cuda())
    torch.use_deterministic_algorithms(True)
    try:
        first, second = op(*args), op(*args)
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(first, second)
    expected = dense_product(row_ptr, col, values.float(), x.float())
    scale = expected.abs().amax(1, keepdim=True).clamp_min(1)
    torch.testing.assert_close(first.double().cpu() / scale, expected / scale, **TOLERANCE[torch.float32])
