#pragma once
// The multiply of one shared-memory K-slab: tensor-core warp tiles (WMMA, half/bfloat16) and SIMT
// thread tiles (float/double). Both compute C[m, n] += sum_k A(m, k) * B(k, n) with B stored
// k-major (element (k, n) at b[k * ldb + n]); A's layout is a template parameter.
#include <mma.h>

#include <type_traits>

#include "numeric.cuh"

namespace relconv::cuda {

// One warp owns a WM x WN block of C as (WM/16) x (WN/16) 16x16 fp32 accumulator fragments.
// ALayout row_major: A(m, k) at a[m * lda + k]; col_major: A(m, k) at a[k * lda + m].
// WMMA needs every fragment pointer 32-byte aligned and lda/ldb multiples of 8 elements: the callers'
// shared-memory strides are chosen so (16 rows * stride * 2 bytes is always a multiple of 32).
template <typename T, int WM, int WN, typename ALayout>
struct WmmaWarpTile {
  static constexpr int kFragsM = WM / 16, kFragsN = WN / 16;
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be whole 16x16 fragments");
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[kFragsM][kFragsN];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.f);
  }

  // a, b point at this warp's (m, k = 0) and (k = 0, n) origins in shared memory.
  template <int BK>
  __device__ __forceinline__ void mma(const T* a, int lda, const T* b, int ldb) {
    constexpr bool kRowMajorA = std::is_same_v<ALayout, nvcuda::wmma::row_major>;
#pragma unroll
    for (int k = 0; k < BK; k += 16) {
      nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, ALayout> fa[kFragsM];
      nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::row_major> fb[kFragsN];
#pragma unroll
      for (int i = 0; i < kFragsM; ++i)
        nvcuda::wmma::load_matrix_sync(fa[i], kRowMajorA ? a + i * 16 * lda + k : a + k * lda + i * 16, lda);
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) nvcuda::wmma::load_matrix_sync(fb[j], b + k * ldb + j * 16, ldb);
#pragma unroll
      for (int i = 0; i < kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) nvcuda::wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
  }

  // c points at this warp's (m, n) origin of a row-major fp32 shared-memory tile.
  __device__ __forceinline__ void store(float* c, int ldc) const {
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j)
        nvcuda::wmma::store_matrix_sync(c + i * 16 * ldc + j * 16, acc[i][j], ldc, nvcuda::wmma::mem_row_major);
  }
};

// One thread owns TM x TN elements of a BM x BN block of C: rows tm + i * (BM / TM), columns
// tn + j * (BN / TN). Interleaving (instead of contiguous micro-tiles) makes a warp's B reads and its
// epilogue atomics hit consecutive addresses. A is channel-major: A(m, k) at a[k * lda + m].
template <typename T, int BM, int BN, int TM, int TN>
struct SimtThreadTile {
  using Acc = acc_t<T>;
  static constexpr int kStrideM = BM / TM, kStrideN = BN / TN;
  Acc acc[TM][TN];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = Acc(0);
  }

  template <int BK>
  __device__ __forceinline__ void mma(const T* a, int lda, const T* b, int ldb, int tm, int tn) {
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      Acc av[TM], bv[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = to_acc(a[k * lda + tm + i * kStrideM]);
#pragma unroll
      for (int j = 0; j < TN; ++j) bv[j] = to_acc(b[k * ldb + tn + j * kStrideN]);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }
  }
};

}  // namespace relconv::cuda
