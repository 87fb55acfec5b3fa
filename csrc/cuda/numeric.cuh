#pragma once
// Element types the kernels take and how they convert to and from their accumulation type.
// float16/bfloat16 accumulate in float32, float32 in itself, float64 in itself.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace relconv::cuda {

template <typename T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <typename T>
using acc_t = typename AccOf<T>::type;

// Elements per 16-byte vector load: the unit of every vectorised global access.
template <typename T>
inline constexpr int kVecElems = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }

template <typename T>
__device__ __forceinline__ T from_acc(acc_t<T> v);
template <>
__device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <>
__device__ __forceinline__ double from_acc<double>(double v) { return v; }

// Stores two adjacent elements with one 4-byte (half / bfloat16) or 8-byte (float) store; p must be
// aligned to that size.
__device__ __forceinline__ void store_pair(__half* p, float v0, float v1) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(v0, v1);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* p, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
}
__device__ __forceinline__ void store_pair(float* p, float v0, float v1) {
  *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
}

// Two packed half / bfloat16 elements (low half first, as in an mma.sync fragment register) times
// (s0, s1), computed in fp32 and rounded once, like scaling each element on its way into shared memory.
template <typename T>
__device__ __forceinline__ unsigned scale_pair(unsigned packed, float s0, float s1) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h;
    memcpy(&h, &packed, sizeof(h));
    const float2 f = __half22float2(h);
    h = __floats2half2_rn(f.x * s0, f.y * s1);
    memcpy(&packed, &h, sizeof(h));
  } else {
    __nv_bfloat162 h;
    memcpy(&h, &packed, sizeof(h));
    const float2 f = __bfloat1622float2(h);
    h = __floats2bfloat162_rn(f.x * s0, f.y * s1);
    memcpy(&packed, &h, sizeof(h));
  }
  return packed;
}

}  // namespace relconv::cuda
