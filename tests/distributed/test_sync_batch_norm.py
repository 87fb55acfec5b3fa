"""Synchronized BatchNorm over two ranks equals one process's BatchNorm over the concatenated batch:
outputs, running statistics, input gradients and (summed over ranks) the weight and bias gradients.
Both converters: relconv's (`relconv.voxel.SyncBatchNorm`) and torch's (`relconv.voxel.BatchNorm`
around a `torch.nn.SyncBatchNorm`)."""

import pytest
import torch
from torch import nn

from relconv.voxel import BatchNorm, ReLU, Sequential, SyncBatchNorm, VoxelTensor, convert_sync_batchnorm
from relconv.voxel.sync_batch_norm import sync_batch_norm
from tests.distributed.launch import run_ranks

CHANNELS = 6
# (rows per rank, momentum, BatchNorm -> ReLU as one step); rank 1 empty and one row per rank are
# legal as long as the global batch has two rows.
CASES = [((37, 50), 0.1, False), ((23, 0), None, True), ((1, 1), 0.1, True)]
STEPS = 2
CONVERTERS = ("relconv", "torch")


def _model(momentum, relu: bool) -> nn.Module:
    torch.manual_seed(1)
    bn = BatchNorm(CHANNELS, momentum=momentum)
    with torch.no_grad():
        bn.module.weight.uniform_(0.5, 1.5)
        bn.module.bias.uniform_(-1.0, 1.0)
    return Sequential(bn, ReLU()) if relu else Sequential(bn)


def _batch(rows: int, step: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Global features and output gradient. The mean is moderate: at |mean| >> std the fp32
    single-process reference itself strays past 1e-5 (its `x - mean` loses the low bits)."""
    gen = torch.Generator().manual_seed(100 + step)
    feats = torch.randn(rows, CHANNELS, generator=gen) * 3.0 + 4.0
    grad = torch.randn(rows, CHANNELS, generator=gen)
    return feats.to(device), grad.to(device)


def _run(model: nn.Module, feats: torch.Tensor, grad: torch.Tensor) -> dict:
    x = feats.clone().requires_grad_(True)
    coords = torch.zeros(len(x), 4, dtype=torch.int32, device=x.device)
    coords[:, 1] = torch.arange(len(x), device=x.device)
    model.zero_grad()
    out = model(VoxelTensor(x, coords)).feats
    out.backward(grad)
    bn = model[0].module
    return {
        "out": out.detach().cpu(),
        "grad_x": x.grad.cpu(),
        "grad_w": bn.weight.grad.cpu().clone(),
        "grad_b": bn.bias.grad.cpu().clone(),
    }


def _stats(model: nn.Module) -> dict:
    bn = model[0].module
    keys = ("running_mean", "running_var", "num_batches_tracked")
    return {k: getattr(bn, k).detach().cpu().clone() for k in keys}


def reference(sizes, momentum, relu, device: str) -> tuple[list, dict]:
    model = _model(momentum, relu).to(device).train()
    steps = [_run(model, *_batch(sum(sizes), s, device)) for s in range(STEPS)]
    return steps, _stats(model)


def synchronised(rank: int, world: int, device: str) -> dict:
    return {converter: _synchronised(rank, device, converter) for converter in CONVERTERS}


def _synchronised(rank: int, device: str, converter: str) -> list:
    results = []
    for sizes, momentum, relu in CASES:
        if converter == "relconv":
            model = convert_sync_batchnorm(_model(momentum, relu)).to(device).train()
            assert isinstance(model[0], SyncBatchNorm)
        else:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(_model(momentum, relu)).to(device).train()
            assert isinstance(model[0].module, nn.SyncBatchNorm)
        lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
        steps = []
        for s in range(STEPS):
            feats, grad = _batch(sum(sizes), s, device)
            steps.append(_run(model, feats[lo:hi], grad[lo:hi]))
        results.append((steps, _stats(model)))
    return results


def _check(results: list, device: str) -> None:
    tol = dict(rtol=1e-5, atol=1e-5)
    for case, (sizes, momentum, relu) in enumerate(CASES):
        ref_steps, ref_stats = reference(sizes, momentum, relu, device)
        for s, ref in enumerate(ref_steps):
            for rank, per_rank in enumerate(results):
                got = per_rank[case][0][s]
                lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
                torch.testing.assert_close(got["out"], ref["out"][lo:hi], **tol)
                torch.testing.assert_close(got["grad_x"], ref["grad_x"][lo:hi], **tol)
            for key in ("grad_w", "grad_b"):
                total = sum(per_rank[case][0][s][key] for per_rank in results)
                torch.testing.assert_close(total, ref[key], **tol)
        for per_rank in results:
            for key, value in ref_stats.items():
                torch.testing.assert_close(per_rank[case][1][key], value, **tol)


def test_sync_batchnorm_matches_concatenated_batch_gloo():
    results = run_ranks(synchronised, 2, "cpu")
    for converter in CONVERTERS:
        _check([r[converter] for r in results], "cpu")


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_sync_batchnorm_matches_concatenated_batch_nccl():
    # both converters run relconv's collectives over torch's CUDA BatchNorm kernels; the
    # reference runs relconv's fused op.
    results = run_ranks(synchronised, 2, "cuda", backend="nccl")
    for converter in CONVERTERS:
        _check([r[converter] for r in results], "cuda")


def _training_step_without_host_reads(rank: int, world: int) -> bool:
    model = convert_sync_batchnorm(_model(0.1, True)).cuda().train()
    feats, grad = _batch(8 * world, 0, "cuda")
    x = feats[8 * rank : 8 * (rank + 1)].clone().requires_grad_(True)
    coords = torch.zeros(len(x), 4, dtype=torch.int32, device="cuda")
    coords[:, 1] = torch.arange(len(x), device="cuda")
    vt = VoxelTensor(x, coords)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(vt).feats.backward(grad[8 * rank : 8 * (rank + 1)])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return bool(torch.isfinite(x.grad).all())


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_sync_batchnorm_training_step_never_reads_the_device_nccl():
    """torch's SyncBatchNorm reads the gathered counts back every layer; relconv's keeps them on
    the device, so the host never waits for a collective."""
    assert run_ranks(_training_step_without_host_reads, 2, backend="nccl") == [True, True]


def test_convert_sync_batchnorm_keeps_parameters_and_state_dict():
    model = _model(0.1, True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model[0].module.weight
    converted = convert_sync_batchnorm(model)
    assert converted is model and isinstance(model[0], SyncBatchNorm)
    assert model[0].module.weight is weight
    assert model.state_dict().keys() == before.keys()
    single = convert_sync_batchnorm(BatchNorm(3).eval())
    assert isinstance(single, SyncBatchNorm) and not single.training
    with pytest.raises(TypeError, match="module"):
        convert_sync_batchnorm("model")


def test_sync_batch_norm_rejects_bad_input():
    bn = nn.SyncBatchNorm(CHANNELS)
    with pytest.raises(ValueError, match="shape"):
        sync_batch_norm(torch.zeros(3, CHANNELS + 1), bn)
    with pytest.raises(TypeError, match="BatchNorm1d or SyncBatchNorm"):
        sync_batch_norm(torch.zeros(3, CHANNELS), nn.LayerNorm(CHANNELS))
    with pytest.raises(ValueError, match="training"):
        sync_batch_norm(torch.zeros(3, CHANNELS), bn.eval())


def test_sync_batchnorm_without_process_group_is_batchnorm():
    # No process group (a plain single-process run): relconv's SyncBatchNorm is BatchNorm.
    ref_steps, ref_stats = reference((20,), 0.1, True, "cpu")
    model = convert_sync_batchnorm(_model(0.1, True)).train()
    steps = [_run(model, *_batch(20, s, "cpu")) for s in range(STEPS)]
    for got, ref in zip(steps, ref_steps, strict=True):
        for key in ref:
            torch.testing.assert_close(got[key], ref[key], rtol=0, atol=0)
    for key, value in ref_stats.items():
        torch.testing.assert_close(_stats(model)[key], value, rtol=0, atol=0)
