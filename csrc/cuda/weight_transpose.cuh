// The input gradient runs the forward kernels with W[r]^T (autograd.cpp passes the transposed view
// of the weight). The kernels read a contiguous weight, so that view is copied here by one launch
// into an empty tensor: aten's contiguous() of it went through clone, empty_like and a TensorIterator
// copy, about 15 us of host time per backward on the H100 host against a handful of GPU microseconds.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace relconv {
namespace cuda {

// out[m, c, r] = in[m, r, c] for `mats` row-major [rows, cols] matrices; 32 x 32 tiles through
// shared memory keep both the reads and the writes coalesced. Grid: x = column tiles, y = row tiles,
// z = matrices (grid-strided past 65535).
template <typename E>
__global__ void transpose_matrices(const E* __restrict__ in, E* __restrict__ out, int64_t mats, int rows, int cols) {
  __shared__ E tile[32][33];
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  const int64_t size = int64_t{rows} * cols;
  for (int64_t m = blockIdx.z; m < mats; m += gridDim.z) {
    const E* src = in + m * size;
    E* dst = out + m * size;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
      const int r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[i][threadIdx.x] = src[int64_t{r} * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
      const int c = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && c < cols) dst[int64_t{c} * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();
  }
}

}  // namespace cuda

// Whether `weight` (not contiguous) is the transpose of a contiguous tensor's last two dimensions:
// storage [..., size(d - 1), size(d - 2)] row-major, the input gradient's W^T.
inline bool stored_transposed(const at::Tensor& weight) {
  const int64_t d = weight.dim();
  if (d < 2 || weight.is_contiguous()) return false;
  const int64_t cols = weight.size(d - 2), rows = weight.size(d - 1);
  bool transposed = weight.stride(d - 2) == 1 && weight.stride(d - 1) == cols;
  for (int64_t k = d - 3, expected = rows * cols; k >= 0 && transposed; expected *= weight.size(k), --k) {
    transposed = weight.size(k) == 1 || weight.stride(k) == expected;
  }
  return transposed;
}

// `weight` as a contiguous tensor of its own shape. A transposed one (stored_transposed) is copied by
// one transpose launch; any other non-contiguous layout falls back to aten.
inline at::Tensor contiguous_weight(const at::Tensor& weight, cudaStream_t stream) {
  const int64_t d = weight.dim();
  if (!stored_transposed(weight) || weight.numel() == 0) return weight.contiguous();
  // The storage holds [..., rows, cols] row-major.
  const int64_t cols = weight.size(d - 2), rows = weight.size(d - 1);
  if ((rows + 31) / 32 > 65535 || cols > std::numeric_limits<int32_t>::max()) return weight.contiguous();
  at::Tensor out = at::empty(weight.sizes(), weight.options());
  const int64_t mats = weight.numel() / (rows * cols);
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32),
                  static_cast<unsigned>(std::min<int64_t>(mats, 65535)));
  const dim3 block(32, 8);
  const auto launch = [&](auto element) {
    using E = decltype(element);
    cuda::transpose_matrices<E><<<grid, block, 0, stream>>>(reinterpret_cast<const E*>(weight.const_data_ptr()),
                                                            reinterpret_cast<E*>(out.mutable_data_ptr()), mats,
                                                            static_cast<int>(rows), static_cast<int>(cols));
  };
  switch (weight.element_size()) {
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    case 8: launch(uint64_t{}); break;
    default: return weight.contiguous();
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace relconv
