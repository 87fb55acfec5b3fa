// The pair path's accumulator filled with the bias (relational_conv.cu, bias_rows): every row a copy
// of the bias in the accumulation dtype. aten's copy of the expanded bias reads it through a
// broadcast TensorIterator at about 1.7 TB/s (252 us for 1.67M rows of 64 fp32 channels on an
// H200); this kernel stores 16 bytes a thread, each thread one chunk of bias columns kept in
// registers (100 us, against 184 when every chunk worked out its columns with a 64-bit modulo; a
// memset of the same buffer takes 95).
#pragma once

#include <cstdint>

#include "numeric.cuh"

namespace relconv::cuda {

// out[e] = bias[e % cols] for e < total, in chunks of 16 bytes (out 16-byte aligned); grid-strided.
// Where whole chunks tile a row and the grid's stride is a multiple of a row's chunks (the launcher
// sees to it), a thread's chunk holds the same columns on every row it stores: it is read once and
// kept in registers, and the loop is a store and an add.
template <typename T>
__global__ void fill_bias_rows(const T* __restrict__ bias, int64_t cols, int64_t total, acc_t<T>* __restrict__ out) {
  using A = acc_t<T>;
  constexpr int kPer = 16 / sizeof(A);
  struct alignas(16) Chunk {
    A v[kPer];
  };
  const int64_t chunks = (total + kPer - 1) / kPer;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  if (cols % kPer == 0 && stride % (cols / kPer) == 0) {
    if (first >= chunks) return;
    const int64_t c0 = (first % (cols / kPer)) * kPer;
    Chunk chunk;
#pragma unroll
    for (int k = 0; k < kPer; ++k) chunk.v[k] = to_acc(bias[c0 + k]);
    Chunk* dst = reinterpret_cast<Chunk*>(out);
    for (int64_t j = first; j < chunks; j += stride) dst[j] = chunk;
    return;
  }
  for (int64_t j = first; j < chunks; j += stride) {
    const int64_t e = j * kPer;
    int64_t c = e % cols;
    Chunk chunk;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      chunk.v[k] = to_acc(bias[c]);
      c = c + 1 == cols ? 0 : c + 1;
    }
    if (e + kPer <= total) {
      reinterpret_cast<Chunk*>(out)[j] = chunk;
    } else {
      for (int k = 0; e + k < total; ++k) out[e + k] = chunk.v[k];
    }
  }
}

}  // namespace relconv::cuda
