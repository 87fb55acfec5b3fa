// Kernel launchers of the relational-convolution ops (defined in conv_launch.cuh, instantiated per
// element type in conv_launch_<type>.cu). Each launches the configuration that common/kernel_choice.h
// names for its arguments, on `stream`; no host synchronisation.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include "common/kernel_choice.h"
#include "cuda/conv_forward.cuh"
#include "cuda/conv_forward_simt_vec.cuh"
#include "cuda/conv_forward_table.cuh"
#include "cuda/conv_weight_grad.cuh"

namespace relconv::launch {

// Atomic pair-list forward into the accumulator a.out.
template <typename T, typename Idx>
void forward_pairs(const cuda::ConvForwardArgs<T, Idx>& a, const at::Tensor& rel_ptr, cudaStream_t stream);

// Output-stationary forward over a neighbour table (allow_tf32: torch allows TF32 matmuls, which
// float then runs in where the device can). Returns false, launching nothing, only for a.weight_t
// (W^T's storage) when no kernel for the shape reads it in place (16-bit whole-tile kernels and
// wgmma do): the caller then passes a contiguous copy.
template <typename T, typename Idx>
bool forward_table(const cuda::ConvTableArgs<T, Idx>& a, bool allow_tf32, cudaStream_t stream);

// Whether this device runs the sm_90a code of this build (conv_launch_wgmma.cu).
bool wgmma_built();

// The Hopper wgmma table forward (conv_launch_wgmma.cu) in the configuration `c` names (one of the
// wgmma ones). T: __half or __nv_bfloat16.
template <typename T>
bool forward_table_wgmma(const cuda::ConvTableArgs<T, int32_t>& a, const choice::TableChoice& c, cudaStream_t stream);

// dW [R, G, C_in/G, C_out/G] in dtype `out` (deterministic: no atomics, bitwise reproducible).
template <typename T, typename Idx>
at::Tensor weight_grad(const cuda::WeightGradArgs<T, Idx>& a, const at::Tensor& rel_ptr, bool deterministic,
                       const at::TensorOptions& opts, at::ScalarType out, cudaStream_t stream);

}  // namespace relconv::launch
