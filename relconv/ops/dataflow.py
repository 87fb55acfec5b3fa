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
  `EXACT_TABLE_MAX_CHANNELS` (relconv.ops.planning) output channels per group and, under
  `torch.use_deterministic_algorithms(True)`, for every dtype; fetch-on-demand otherwise, since wider
  exact fp32 layers measured slower output-stationary (2.5x on an H200 with the first SIMT kernel,
  benchmarks/results/ops; 1.15-2.4x on an H100 with the pipelined one, C64-C256). The rule reads only
  dtypes, map properties, the layer's width and those two global torch switches, so every rank of a
  distributed job makes the same choice. `relconv.ops.planning.resolve_dataflow` is the rule.

Precision: the output-stationary kernel computes fp32 inputs in TF32 exactly when TF32 matmuls are
allowed (sm_80+), whichever way the dataflow was chosen; fetch-on-demand is always exact fp32.
"""

from __future__ import annotations

import enum


class Dataflow(enum.Enum):
    AUTO = "auto"
    FETCH_ON_DEMAND = "fetch_on_demand"
    OUTPUT_STATIONARY = "output_stationary"
