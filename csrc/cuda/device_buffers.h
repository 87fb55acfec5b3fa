// Device buffers whose every byte starts at one value (0 or 0xFF), set by one cudaMemsetAsync.
// at::zeros / at::full launch a TensorIterator fill whose host cost is several times a memset's, and
// the map builders and the conv launchers allocate such buffers on every call of a network.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

namespace relconv {

// byte 0: zeros (integers and IEEE floats alike); 0xFF (kAllOnes): -1 in every two's-complement entry.
inline at::Tensor memset_tensor(at::IntArrayRef sizes, const at::TensorOptions& options, int byte,
                                cudaStream_t stream) {
  at::Tensor t = at::empty(sizes, options);
  if (t.numel() > 0) C10_CUDA_CHECK(cudaMemsetAsync(t.mutable_data_ptr(), byte, t.nbytes(), stream));
  return t;
}
constexpr int kAllOnes = 0xFF;  // the empty hash slot / no-neighbour mark

}  // namespace relconv
