#pragma once
// The multiply of one shared-memory K-slab: tensor-core warp tiles (WMMA, or mma.sync with ldmatrix:
// half/bfloat16, and float as TF32) and SIMT thread tiles (float/double). Both compute
// C[m, n] += sum_k A(m, k) * B(k, n) with B stored k-major (element (k, n) at b[k * ldb + n]); A's
// layout is a template parameter.
#include <mma.h>

#include <type_traits>

#include "numeric.cuh"

namespace relconv::cuda {

// One warp owns a WM x WN block of C as (WM/16) x (WN/16) 16x16 fp32 accumulator fragments.
// A is row-major: A(m, k) at a[m * lda + k].
// WMMA needs every fragment pointer 32-byte aligned and lda/ldb multiples of 8 elements: the callers'
// shared-memory strides are chosen so (16 rows * stride * 2 bytes is always a multiple of 32).
template <typename T, int WM, int WN>
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
#pragma unroll
    for (int k = 0; k < BK; k += 16) {
      nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major> fa[kFragsM];
      nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::row_major> fb[kFragsN];
#pragma unroll
      for (int i = 0; i < kFragsM; ++i)
        nvcuda::wmma::load_matrix_sync(fa[i], a + i * 16 * lda + k, lda);
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

// d += a @ b on one m16n8k16 tensor-core tile (fragments in the PTX ISA register layout).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "mma.sync m16n8k16 takes half or bfloat16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// d += a @ b on one m16n8k8 TF32 tensor-core tile (fragments already rounded to TF32).
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// The m16n8k8 (half / bfloat16) and m16n8k4 (TF32) halves of the tiles above: the first half takes
// a0, a1, b0 of the full fragment, the second a2, a3, b1 (the PTX ISA layouts nest that way).
template <typename T>
__device__ __forceinline__ void mma_half_k(float (&d)[4], unsigned a0, unsigned a1, unsigned b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
  } else {
    static_assert(std::is_same_v<T, float>, "mma.sync takes half, bfloat16 or TF32");
    asm volatile(
        "mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
  }
#endif
}

// fp32 bits rounded to the nearest TF32 (10-bit mantissa, ties away from zero), as cuBLAS rounds its
// TF32 operands: the tensor core would otherwise just drop the low mantissa bits.
__device__ __forceinline__ unsigned to_tf32(unsigned bits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(bits)));
  return r;
#else
  return bits;
#endif
}

// One warp owns a WM x WN block of C as (WM/16) x (WN/8) m16n8 fp32 accumulators of mma.sync (sm_80+):
// m16n8k16 for half / bfloat16, m16n8k8 TF32 for float (the TF32 mode of fp32, rounded on the way into
// the fragments). Compared with WMMA it keeps the fragments in a known register layout, so the
// epilogue stores straight from registers (no fp32 C tile in shared memory), and ldmatrix loads a
// whole 16 x (16 bytes) operand block per instruction.
// B is k-major in shared memory (B(k, n) at b[k * ldb + n]); A row-major (A(m, k) at a[m * lda + k],
// the gathered rows of the forward) or, with kAKMajor, k-major too (A(m, k) at a[k * lda + m], the
// gathered rows of the weight gradient, loaded with the transposing ldmatrix for 16-bit types).
// lda must keep every 16-byte row chunk aligned and should pad rows by 16 bytes, so that the 8 row
// addresses of one ldmatrix fall in distinct banks. ldb (and a k-major lda): the same for 16-bit
// types; for float, whose k-major fragments are single 32-bit loads (ldmatrix cannot transpose
// 32-bit elements), rows padded by 8 elements keep the 32 lanes of a load (k = lane % 4,
// m or n = lane / 4) in distinct banks.
// With kBNMajor (16-bit types), B is n-major instead: B(k, n) at b[n * ldb + k], loaded with the
// plain ldmatrix (the input gradient's W^T read as W is stored; ldb padded by 16 bytes as above).
// Hooks see the B fragments of each k block before they are used (NoFragmentHook: none); float
// fragments hold fp32 bits there, with element (k + tig, n) in register 0 and (k + tig + 4, n) in 1.
struct NoFragmentHook {
  template <typename Frags>
  __device__ __forceinline__ void operator()(int, Frags&) const {}
};

template <typename T, int WM, int WN>
struct MmaWarpTile {
  static constexpr int kTilesM = WM / 16, kTilesN = WN / 8;
  static constexpr bool kTf32 = std::is_same_v<T, float>;
  static constexpr int kMmaK = kTf32 ? 8 : 16;  // one ldmatrix row: 16 bytes of k
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be whole 16x16 operand blocks");
  float acc[kTilesM][kTilesN][4];
  static constexpr int kAccumulators = kTilesM * kTilesN * 4;
  __device__ __forceinline__ float& accumulator(int i) { return (&acc[0][0][0])[i]; }

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kTilesM; ++i)
#pragma unroll
      for (int j = 0; j < kTilesN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  }

  // a, b point at this warp's (m, k = 0) and (k = 0, n) origins in shared memory. kSlices16B: every
  // 16 bytes of K is its own mma, in K order (two half-K mmas on the same fragments), so a K step
  // holding several relations adds each relation's products to the accumulators on its own: the
  // result does not depend on which relations share a step (packed stems, conv_forward_table_mma).
  template <int BK, bool kAKMajor = false, bool kBNMajor = false, typename BHook = NoFragmentHook,
            bool kSlices16B = false>
  __device__ __forceinline__ void mma(const T* a, int lda, const T* b, int ldb, BHook b_hook = {}) {
    static_assert(BK % kMmaK == 0, "K step must be whole mma blocks");
    static_assert(!(kBNMajor && kTf32), "n-major B is read by ldmatrix: 16-bit types only");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    // ldmatrix x4 row addresses: lanes 0-15 rows 0-15 of the first 16 bytes of k, lanes 16-31 of the
    // next 16 bytes. For 16-bit types that is the m16k16 A block in fragment order; for float the
    // same addresses give the m16k8 TF32 A fragment (each 32-bit element a pair of b16 halves).
    const int row = lane % 16, half8 = (lane / 16) * (kMmaK / 2);
    // k-major A: the four 8x8 matrices of a 16x16 block are (m 0-7 | m 8-15) x (k 0-7 | k 8-15) in
    // fragment order; lane l addresses k row l % 8 of matrix l / 8.
    const int a_k = lane % 8 + (lane / 16) * 8, a_m = (lane / 8 % 2) * 8;
#pragma unroll
    for (int k = 0; k < BK; k += kMmaK) {
      unsigned fa[kTilesM][4], fb[kTilesN][2];
#pragma unroll
      for (int i = 0; i < kTilesM; ++i) {
        if constexpr (kTf32 && kAKMajor) {
          // m16n8k8 A fragment (m = gid | gid + 8, k = tig | tig + 4) as single 32-bit loads:
          // ldmatrix cannot transpose 32-bit elements.
          const T* p = a + (k + tig) * lda + i * 16 + gid;
          fa[i][0] = __float_as_uint(p[0]), fa[i][1] = __float_as_uint(p[8]);
          fa[i][2] = __float_as_uint(p[4 * lda]), fa[i][3] = __float_as_uint(p[4 * lda + 8]);
        } else if constexpr (kAKMajor) {
          ldmatrix_x4_trans(fa[i], a + (k + a_k) * lda + i * 16 + a_m);
        } else {
          ldmatrix_x4(fa[i], a + (i * 16 + row) * lda + k + half8);
        }
        if constexpr (kTf32) {
#pragma unroll
          for (int e = 0; e < 4; ++e) fa[i][e] = to_tf32(fa[i][e]);
        }
      }
      if constexpr (kTf32) {
        // m16n8k8 B fragment: (k = tig, n = gid) and (k = tig + 4, n = gid); rounded to TF32 after
        // the hook, so a scaled operand is rounded once.
#pragma unroll
        for (int j = 0; j < kTilesN; ++j) {
          fb[j][0] = __float_as_uint(b[(k + tig) * ldb + j * 8 + gid]);
          fb[j][1] = __float_as_uint(b[(k + tig + 4) * ldb + j * 8 + gid]);
        }
      } else if constexpr (kBNMajor) {
#pragma unroll
        for (int j = 0; j < kTilesN; j += 2) {
          unsigned r[4];
          // The same four 8 x 8 matrices, stored n-major: lane l addresses n row l % 8 (+ 8 for
          // lanes 16-31) at k + 8 for lanes 8-15 and 24-31.
          ldmatrix_x4(r, b + (j * 8 + (lane / 16) * 8 + lane % 8) * ldb + k + (lane / 8 % 2) * 8);
          fb[j][0] = r[0], fb[j][1] = r[1], fb[j + 1][0] = r[2], fb[j + 1][1] = r[3];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kTilesN; j += 2) {
          unsigned r[4];
          // Transposed: lanes 0-15 give k rows 0-15 at columns n..n+7, lanes 16-31 at n+8..n+15.
          ldmatrix_x4_trans(r, b + (k + row) * ldb + j * 8 + half8);
          fb[j][0] = r[0], fb[j][1] = r[1], fb[j + 1][0] = r[2], fb[j + 1][1] = r[3];
        }
      }
      b_hook(k, fb);
      if constexpr (kTf32) {
#pragma unroll
        for (int j = 0; j < kTilesN; ++j) fb[j][0] = to_tf32(fb[j][0]), fb[j][1] = to_tf32(fb[j][1]);
      }
#pragma unroll
      for (int i = 0; i < kTilesM; ++i)
#pragma unroll
        for (int j = 0; j < kTilesN; ++j) {
          if constexpr (kSlices16B) {
            mma_half_k<T>(acc[i][j], fa[i][0], fa[i][1], fb[j][0]);
            mma_half_k<T>(acc[i][j], fa[i][2], fa[i][3], fb[j][1]);
          } else if constexpr (kTf32) {
            mma_1688_tf32(acc[i][j], fa[i], fb[j]);
          } else {
            mma_16816<T>(acc[i][j], fa[i], fb[j]);
          }
        }
    }
#endif
  }

  // Calls store(m, n, v0, v1) for the two adjacent accumulators (m, n), (m, n + 1) this thread owns,
  // m and n relative to the warp tile's origin.
  template <typename Store>
  __device__ __forceinline__ void for_each_pair(Store store) const {
    const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
#pragma unroll
    for (int i = 0; i < kTilesM; ++i)
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
        store(i * 16 + gid, j * 8 + 2 * tig, acc[i][j][0], acc[i][j][1]);
        store(i * 16 + gid + 8, j * 8 + 2 * tig, acc[i][j][2], acc[i][j][3]);
      }
  }

 private:
  static __device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const T* p) {
    const auto s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  }
  static __device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const T* p) {
    const auto s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  }
};

// Exact fp32 on CUDA cores with MmaWarpTile's interface and shared-memory layouts (A row-major, B
// k-major), so the pipelined tensor-core table kernel runs exact float too. The warp's lanes form a
// 4 x 8 grid; lane (tm, tn) owns rows tm + 4 i and the column pairs 2 tn + 16 j, +1. Per four k a
// lane reads one float4 of each of its WM / 4 rows (4 distinct rows per warp, broadcast, in distinct
// banks for lda = 4 mod 32, rows 16-byte aligned) and, per k, WN / 16 float2 of B (16 consecutive
// floats per warp) for WM * WN / 32 fmas; each sum still runs in k order.
template <int WM, int WN>
struct SimtWarpTile {
  static constexpr int kRows = WM / 4, kPairs = WN / 16;
  static_assert(WM % 4 == 0 && WN % 16 == 0, "warp tile must split over a 4 x 8 lane grid");
  float acc[kRows][2 * kPairs];
  static constexpr int kAccumulators = kRows * 2 * kPairs;
  __device__ __forceinline__ float& accumulator(int i) { return (&acc[0][0])[i]; }

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int j = 0; j < 2 * kPairs; ++j) acc[i][j] = 0.f;
  }

  template <int BK>
  __device__ __forceinline__ void mma(const float* a, int lda, const float* b, int ldb) {
    static_assert(BK % 4 == 0, "A is read four k at a time");
    const int lane = threadIdx.x % 32, tm = lane / 8, tn = lane % 8;
    const float* ap = a + tm * lda;
    const float* bp = b + 2 * tn;
#pragma unroll 1
    for (int k0 = 0; k0 < BK; k0 += 4) {
      float4 aq[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) aq[i] = *reinterpret_cast<const float4*>(ap + 4 * i * lda + k0);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        float2 bv[kPairs];
#pragma unroll
        for (int j = 0; j < kPairs; ++j) bv[j] = *reinterpret_cast<const float2*>(bp + (k0 + kk) * ldb + 16 * j);
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          const float av = kk == 0 ? aq[i].x : kk == 1 ? aq[i].y : kk == 2 ? aq[i].z : aq[i].w;
#pragma unroll
          for (int j = 0; j < kPairs; ++j) {
            acc[i][2 * j] = fmaf(av, bv[j].x, acc[i][2 * j]);
            acc[i][2 * j + 1] = fmaf(av, bv[j].y, acc[i][2 * j + 1]);
          }
        }
      }
    }
  }

  template <typename Store>
  __device__ __forceinline__ void for_each_pair(Store store) const {
    const int lane = threadIdx.x % 32, tm = lane / 8, tn = lane % 8;
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int j = 0; j < kPairs; ++j) store(tm + 4 * i, 2 * tn + 16 * j, acc[i][2 * j], acc[i][2 * j + 1]);
  }
};

// Exact fp32 on CUDA cores with both operands k-major (A(m, k) at a[k * lda + m], B(k, n) at
// b[k * ldb + n]): the weight gradient's gathered rows, so its pipelined kernel runs exact float too.
// The warp's lanes form a 4 x 8 grid; lane (tm, tn) owns the row quads 4 tm + 16 i and the column
// quads 4 tn + 32 j (a 16-wide tile: the column pairs 2 tn). Per k a lane reads WM / 16 float4 of A
// and WN / 32 float4 (or one float2) of B (a warp: 4 distinct A quads, broadcast, and one row of B)
// for WM * WN / 32 fmas, where a thread tile reading scalars spends one shared load per two fmas.
// lda and ldb must keep rows 16-byte aligned. `scale` (null: none) holds one factor per k, applied
// to B: the pair scale of R-GCN's 1/deg.
template <int WM, int WN>
struct SimtOuterWarpTile {
  static_assert(WM % 16 == 0 && (WN % 32 == 0 || WN == 16), "warp tile must split over a 4 x 8 lane grid");
  // Columns a lane owns side by side (one vector load of B), and how many such groups.
  static constexpr int kColW = WN % 32 == 0 ? 4 : 2;
  static constexpr int kRowQuads = WM / 16, kColGroups = WN / (8 * kColW), kCols = kColW * kColGroups;
  float acc[4 * kRowQuads][kCols];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < 4 * kRowQuads; ++i)
#pragma unroll
      for (int j = 0; j < kCols; ++j) acc[i][j] = 0.f;
  }

  template <int BK>
  __device__ __forceinline__ void mma(const float* a, int lda, const float* b, int ldb, const float* scale) {
    const int lane = threadIdx.x % 32, tm = lane / 8, tn = lane % 8;
    const float* ap = a + 4 * tm;
    const float* bp = b + kColW * tn;
#pragma unroll 4
    for (int k = 0; k < BK; ++k) {
      float4 av[kRowQuads];
      float bv[kColGroups][kColW];
#pragma unroll
      for (int i = 0; i < kRowQuads; ++i) av[i] = *reinterpret_cast<const float4*>(ap + k * lda + 16 * i);
#pragma unroll
      for (int j = 0; j < kColGroups; ++j) {
        const float* src = bp + k * ldb + 8 * kColW * j;
        if constexpr (kColW == 4) {
          const float4 v = *reinterpret_cast<const float4*>(src);
          bv[j][0] = v.x, bv[j][1] = v.y, bv[j][2] = v.z, bv[j][3] = v.w;
        } else {
          const float2 v = *reinterpret_cast<const float2*>(src);
          bv[j][0] = v.x, bv[j][1] = v.y;
        }
      }
      if (scale) {
        const float s = scale[k];
#pragma unroll
        for (int j = 0; j < kColGroups; ++j)
#pragma unroll
          for (int q = 0; q < kColW; ++q) bv[j][q] *= s;
      }
#pragma unroll
      for (int i = 0; i < kRowQuads; ++i) {
        const float ar[4] = {av[i].x, av[i].y, av[i].z, av[i].w};
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int j = 0; j < kColGroups; ++j) {
            float* c = acc[4 * i + r] + kColW * j;
#pragma unroll
            for (int q = 0; q < kColW; ++q) c[q] = fmaf(ar[r], bv[j][q], c[q]);
          }
      }
    }
  }

  // store(m, n, C(m, n), C(m, n + 1)) for every even column pair of the lane (n even).
  template <typename Store>
  __device__ __forceinline__ void for_each_pair(Store store) const {
    const int lane = threadIdx.x % 32, tm = lane / 8, tn = lane % 8;
#pragma unroll
    for (int i = 0; i < 4 * kRowQuads; ++i)
#pragma unroll
      for (int j = 0; j < kCols; j += 2)
        store(4 * tm + 16 * (i / 4) + i % 4, kColW * tn + 8 * kColW * (j / kColW) + j % kColW, acc[i][j],
              acc[i][j + 1]);
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
