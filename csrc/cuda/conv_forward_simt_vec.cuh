#pragma once
// Exact fp32 fetch-on-demand forward with 8 x 8 register tiles read as float4 from shared memory and
// float4 atomics in the epilogue (sm_90), for wide layers (C_out per group >= 64).
//
// Why a kernel of its own: conv_forward_simt's interleaved TM x TN thread tiles read A and B one
// float at a time, 12 shared loads per 32 fmas at C 128 (4 x 8 tiles): the load/store unit, not the
// fma pipe, sets its pace (~60% of the H100's fp32 fma rate at C 256), and its epilogue issues one
// atomic per output element. Here a thread owns rows {4 tm + i, 4 tm + i + BM/2} and columns
// {4 tn + j, 4 tn + j + BN/2} (i, j < 4): per k it reads two float4 of A and two of B for 64 fmas,
// and adds each row's two column chunks with two float4 atomics.
//
// Shared memory, double-buffered: A channel-major [BK][BM + 4] (the +4 puts the two k chunks that one
// warp stores in different bank halves), B row-major [BK][BN]. Each thread carries one float4 of the
// next A and B slabs in registers while the current one is multiplied: one __syncthreads per K step.
// Needs C_in and C_out per group multiples of 4 and 16-byte aligned x, W and output rows (vec_x,
// vec_w and the launcher's output check).
#include <cstdint>

#include "conv_forward.cuh"

namespace relconv::cuda {

template <int BM, int BN>
struct SimtVecShape {
  static constexpr int kBK = 8, kThreads = (BM / 8) * (BN / 8);
  // 16 warps per SM: the compiler then keeps to 128 registers (137 unbounded, which fits only 12
  // warps of the 128 x 64 tile). The kernel waits on its gathered rows (ncu: long-scoreboard
  // stalls at 19% occupancy), so more resident warps hide more of that latency; 128 still holds
  // both register tiles without spills (ptxas -v, sm_90a).
  static constexpr int kMinBlocks = 512 / kThreads;
  static constexpr int kLdA = BM + 4, kLdB = BN;
  static_assert(BM * kBK % (4 * kThreads) == 0, "whole A float4 per thread");
  static_assert(BN * kBK % (4 * kThreads) == 0, "whole B float4 per thread");
  static constexpr int kAVecs = BM * kBK / (4 * kThreads), kBVecs = BN * kBK / (4 * kThreads);
};

template <typename Idx, int BM, int BN>
__global__ void __launch_bounds__(SimtVecShape<BM, BN>::kThreads, SimtVecShape<BM, BN>::kMinBlocks)
    conv_forward_simt_vec(const ConvForwardArgs<float, Idx> a) {
  using S = SimtVecShape<BM, BN>;
  constexpr int BK = S::kBK, kLdA = S::kLdA, kLdB = S::kLdB;
  __shared__ __align__(16) float As[2][BK * kLdA];
  __shared__ __align__(16) float Bs[2][BK * kLdB];
  __shared__ int64_t s_in[BM], s_out[BM];
  __shared__ float s_scale[BM];

  const auto [t, g, n0] = begin_forward_tile<BM, BN>(a, s_in, s_out, s_scale);
  if (!t.valid) return;

  const int cin = a.cin_g, cout = a.cout_g;
  const float* w = a.weight + (t.relation * a.groups + g) * int64_t{cin} * cout;
  // A slab: vector v of this thread is row m = idx / 2 at k chunk (idx % 2) * 4, idx = tid + v * threads:
  // two threads read one row's 32 bytes (a whole sector of the gathered row).
  const int tid = threadIdx.x;
  const float* a_row[S::kAVecs];
  int a_m[S::kAVecs], a_k[S::kAVecs];
#pragma unroll
  for (int v = 0; v < S::kAVecs; ++v) {
    const int idx = tid + v * S::kThreads;
    a_m[v] = idx / 2, a_k[v] = (idx % 2) * 4;
    const int64_t off = s_in[a_m[v]];
    a_row[v] = off >= 0 ? a.x + off : nullptr;
  }
  // B slab: vector v is row k = idx / (BN / 4), columns (idx % (BN / 4)) * 4.
  int b_k[S::kBVecs], b_n[S::kBVecs];
#pragma unroll
  for (int v = 0; v < S::kBVecs; ++v) {
    const int idx = tid + v * S::kThreads;
    b_k[v] = idx / (BN / 4), b_n[v] = (idx % (BN / 4)) * 4;
  }
  float4 ra[S::kAVecs], rb[S::kBVecs];
  const auto fetch = [&](int k0) {
#pragma unroll
    for (int v = 0; v < S::kAVecs; ++v) {
      const int k = k0 + a_k[v];
      ra[v] = a_row[v] != nullptr && k < cin ? __ldg(reinterpret_cast<const float4*>(a_row[v] + k))
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int v = 0; v < S::kBVecs; ++v) {
      const int k = k0 + b_k[v], n = n0 + b_n[v];
      rb[v] = k < cin && n < cout ? __ldg(reinterpret_cast<const float4*>(w + int64_t{k} * cout + n))
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  const auto stash = [&](int buf) {
#pragma unroll
    for (int v = 0; v < S::kAVecs; ++v) {
      float* col = As[buf] + a_k[v] * kLdA + a_m[v];
      col[0] = ra[v].x, col[kLdA] = ra[v].y, col[2 * kLdA] = ra[v].z, col[3 * kLdA] = ra[v].w;
    }
#pragma unroll
    for (int v = 0; v < S::kBVecs; ++v) *reinterpret_cast<float4*>(Bs[buf] + b_k[v] * kLdB + b_n[v]) = rb[v];
  };

  const int tm = tid / (BN / 8), tn = tid % (BN / 8);
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

  fetch(0);
  stash(0);
  __syncthreads();
  int buf = 0;
  for (int k0 = 0; k0 < cin; k0 += BK) {
    const bool more = k0 + BK < cin;
    if (more) fetch(k0 + BK);  // in flight while this slab is multiplied
    const float* as = As[buf];
    const float* bs = Bs[buf];
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float4 a0 = *reinterpret_cast<const float4*>(as + k * kLdA + 4 * tm);
      const float4 a1 = *reinterpret_cast<const float4*>(as + k * kLdA + 4 * tm + BM / 2);
      const float4 b0 = *reinterpret_cast<const float4*>(bs + k * kLdB + 4 * tn);
      const float4 b1 = *reinterpret_cast<const float4*>(bs + k * kLdB + 4 * tn + BN / 2);
      const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    if (more) {
      stash(buf ^ 1);
      buf ^= 1;
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int m = 4 * tm + (i % 4) + (i / 4) * (BM / 2);
    const int64_t o = s_out[m];
    if (o < 0) continue;
    const float s = s_scale[m];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = n0 + 4 * tn + h * (BN / 2);
      if (n >= cout) continue;  // cout % 4 == 0: a chunk is entirely in or out
      float* dst = a.out + o + n;
      const float4 v = make_float4(acc[i][4 * h] * s, acc[i][4 * h + 1] * s, acc[i][4 * h + 2] * s,
                                   acc[i][4 * h + 3] * s);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float4*>(dst), v);
#else
      atomicAdd(dst, v.x), atomicAdd(dst + 1, v.y), atomicAdd(dst + 2, v.z), atomicAdd(dst + 3, v.w);
#endif
    }
  }
}

}  // namespace relconv::cuda
