"""relconv.voxel.utils.small_constant: the values asked for on the device asked for; on CUDA one
tensor per (values, device, dtype, stream), made afresh while a CUDA graph is captured."""

import pytest
import torch

from relconv.voxel.utils import small_constant


def test_cpu_constant_has_the_values_and_dtype():
    t = small_constant((1, 2, 3), torch.device("cpu"), torch.int32)
    assert t.dtype == torch.int32 and t.tolist() == [1, 2, 3]


@pytest.mark.cuda
def test_cuda_constant_is_kept_per_stream():
    device = torch.device("cuda")
    a = small_constant((1, 4, 4, 4), device, torch.int32)
    assert a.device.type == "cuda" and a.dtype == torch.int32 and a.tolist() == [1, 4, 4, 4]
    assert small_constant([1, 4, 4, 4], device, torch.int32) is a
    assert small_constant((1, 4, 4, 4), device, torch.int64) is not a
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        b = small_constant((1, 4, 4, 4), device, torch.int32)
        assert b is not a
        assert small_constant((1, 4, 4, 4), device, torch.int32) is b
        assert b.tolist() == [1, 4, 4, 4]


@pytest.mark.cuda
def test_cuda_constant_made_in_a_graph_capture_is_its_own_and_filled_on_replay():
    device = torch.device("cuda")
    kept = small_constant((7, 8), device)
    coords = torch.ones(5, 2, dtype=torch.int64, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            captured = small_constant((7, 8), device)
            out = coords * captured
    assert captured is not kept
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [[7, 8]] * 5
    assert small_constant((7, 8), device) is kept
