"""The dataflows of the CUDA forward, as a public choice (the CPU kernel has a single dataflow).

- `FETCH_ON_DEMAND`: tiles of the pair lists; each block gathers its input rows, multiplies them by
  W[r] on tensor cores (SIMT for fp32/fp64) and adds into the output with atomics. Any map; the
  summation order varies between runs.
- `OUTPUT_STATIONARY`: implicit GEMM over the neighbour table `[num_out, R]`; each block owns a tile
  of output rows and loops over the relations, skipping empty (tile, relation) blocks. No atomics,
  bitwise reproducible; needs at most one input per (output, relation) slot and no per-pair scale
  (voxel maps), and reads no pair lists, so a map built as a table never materialises them.
- `AUTO`: output-stationary for fp16/bf16 (tensor cores, and no fp32 scratch buffer to cast back),
  for fp32 when torch allows TF32 matmuls (`torch.backends.cuda.matmul.allow_tf32`; the kernel then
  runs on TF32 tensor cores, as torch's own matmuls do), for exact fp32 up to
  `EXACT_TABLE_MAX_CHANNELS` output channels per group and, under
  `torch.use_deterministic_algorithms(True)`, for every dtype; fetch-on-demand otherwise, since wider
  exact fp32 layers measured slower output-stationary (2.5x on an H200 with the first SIMT kernel,
  benchmarks/results/ops; 1.15-2.4x on an H100 with the pipelined one, C64-C256). The rule reads only
  dtypes, map properties, the layer's width and those two global torch switches, so every rank of a
  distributed job makes the same choice.

Precision: the output-stationary kernel computes fp32 inputs in TF32 exactly when TF32 matmuls are
allowed (sm_80+), whichever way the dataflow was chosen; fetch-on-demand is always exact fp32.
"""

from __future__ import annotations

import enum

import torch


class Dataflow(enum.Enum):
    AUTO = "auto"
    FETCH_ON_DEMAND = "fetch_on_demand"
    OUTPUT_STATIONARY = "output_stationary"


# Exact fp32 layers up to this many output channels per group run output-stationary under AUTO: one
# launch and no pair lists, and a pipelined kernel that beats fetch-on-demand's there (measurements at
# csrc/cuda/conv_launch.cuh, forward_table_by_width).
EXACT_TABLE_MAX_CHANNELS = 32


def resolve_dataflow(
    dataflow: Dataflow,
    compute_dtype: torch.dtype,
    unique_slots: bool,
    has_scale: bool,
    out_channels: int | None = None,
) -> Dataflow:
    """The dataflow a CUDA forward runs: `dataflow` itself, or AUTO's rule. `out_channels` (per
    group; None: unknown) lets narrow exact fp32 layers take the table. Raises ValueError when
    OUTPUT_STATIONARY is asked for a map it cannot run."""
    if not isinstance(dataflow, Dataflow):
        raise TypeError(f"dataflow must be a relconv.ops.Dataflow, got {dataflow!r}")
    table_ok = unique_slots and not has_scale
    if dataflow is Dataflow.OUTPUT_STATIONARY and not table_ok:
        raise ValueError(
            "dataflow=OUTPUT_STATIONARY needs a map with at most one input per (output, relation) slot "
            "(unique_slots=True) and no per-pair scale; use FETCH_ON_DEMAND or AUTO for this map"
        )
    if dataflow is not Dataflow.AUTO:
        return dataflow
    tensor_cores = compute_dtype in (torch.float16, torch.bfloat16) or (
        compute_dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    )
    narrow = out_channels is not None and out_channels <= EXACT_TABLE_MAX_CHANNELS
    narrow_exact = compute_dtype == torch.float32 and narrow
    if table_ok and (tensor_cores or narrow_exact or torch.are_deterministic_algorithms_enabled()):
        return Dataflow.OUTPUT_STATIONARY
    return Dataflow.FETCH_ON_DEMAND
