// The transposed copy of a weight (contiguous_weight in relational_conv.cu): the input gradient
// runs the forward kernels with W[r]^T, and a kernel that cannot read the transposed view as stored
// gets it copied by this one launch (aten's contiguous() of it went through clone, empty_like and a
// TensorIterator copy, about 15 us of host time per backward on the H100 host against a handful of
// GPU microseconds).
#pragma once

#include <cstdint>

namespace relconv::cuda {

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

}  // namespace relconv::cuda
