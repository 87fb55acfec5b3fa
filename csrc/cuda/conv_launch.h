// Kernel launchers of the relational-convolution ops (defined in conv_launch.cuh, instantiated per
// element type in conv_launch_<type>.cu). Each picks the tile configuration and launches on `stream`;
// no host synchronisation.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include "cuda/conv_forward.cuh"
#include "cuda/conv_forward_simt_vec.cuh"
#include "cuda/conv_forward_table.cuh"
#include "cuda/conv_weight_grad.cuh"

namespace relconv::launch {

// Atomic pair-list forward into the accumulator a.out.
template <typename T, typename Idx>
void forward_pairs(const cuda::ConvForwardArgs<T, Idx>& a, const at::Tensor& rel_ptr, cudaStream_t stream);

// Output-stationary forward over a neighbour table (tf32: float on TF32 tensor cores). Returns
// false, launching nothing, only for a.weight_t (W^T's storage) when no kernel for the shape reads
// it in place (16-bit whole-tile kernels and wgmma do): the caller then passes a contiguous copy.
template <typename T, typename Idx>
bool forward_table(const cuda::ConvTableArgs<T, Idx>& a, bool tf32, cudaStream_t stream);

// The Hopper wgmma table forward (conv_launch_wgmma.cu) when this device, build and shape take it
// (a.weight_t included); false (nothing launched) otherwise. T: __half or __nv_bfloat16.
template <typename T>
bool forward_table_wgmma(const cuda::ConvTableArgs<T, int32_t>& a, cudaStream_t stream);

// dW [R, G, C_in/G, C_out/G] in dtype `out` (deterministic: no atomics, bitwise reproducible).
template <typename T, typename Idx>
at::Tensor weight_grad(const cuda::WeightGradArgs<T, Idx>& a, const at::Tensor& rel_ptr, bool deterministic,
                       const at::TensorOptions& opts, at::ScalarType out, cudaStream_t stream);

}  // namespace relconv::launch
