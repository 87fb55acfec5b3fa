#pragma once
// Gathers a ROWS x COLS tile from rows scattered in global memory into shared memory: the A-operand
// load of every relconv kernel (gathered feature rows) and of the dense weight tile alike.
#include <cstdint>
#include <type_traits>

#include "numeric.cuh"

namespace relconv::cuda {

// row_offset(i): element offset of tile row i's first channel in `src`, or a negative value for a row
// that is zero-filled (past the relation's end, an out-of-range index, past the last K row).
// Columns col0 + c >= col_limit are zero-filled too, so any channel count works.
// row_scale(i): factor applied to row i on the way in (only when kScaled; used by the weight
// gradient, which folds the pair's scale into the grad_out rows).
// kTransposed stores element (i, c) at dst[c * ld + i] (channel-major, the layout the SIMT outer
// product reads), otherwise at dst[i * ld + c].
//
// Thread mapping: consecutive threads take consecutive 16-byte chunks of the same row, so a warp
// reads whole 32-byte sectors of each gathered row. The vector path needs `vec`: src 16-byte aligned,
// every row offset, col0 and col_limit multiples of kVecElems<T>; then a chunk is entirely in or out.
template <typename T, int ROWS, int COLS, int THREADS, bool kTransposed, bool kScaled, typename RowOffset,
          typename RowScale>
__device__ __forceinline__ void load_rows(T* __restrict__ dst, int ld, const T* __restrict__ src,
                                          RowOffset row_offset, RowScale row_scale, int col0, int col_limit,
                                          bool vec) {
  constexpr int V = kVecElems<T>;
  static_assert(COLS % V == 0, "tile width must be a whole number of 16-byte vectors");
  if (vec) {
    constexpr int kChunks = COLS / V;
#pragma unroll
    for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += THREADS) {
      const int i = idx / kChunks, c = (idx % kChunks) * V;
      const int64_t off = row_offset(i);
      // memcpy (not pointer casts) between the vector and its elements keeps both in registers.
      uint4 u = make_uint4(0, 0, 0, 0);
      if (off >= 0 && col0 + c < col_limit) {
        u = __ldg(reinterpret_cast<const uint4*>(src + off + col0 + c));
        if constexpr (kScaled) {
          const acc_t<T> s = row_scale(i);
          T e[V];
          memcpy(e, &u, sizeof(u));
#pragma unroll
          for (int j = 0; j < V; ++j) e[j] = from_acc<T>(to_acc(e[j]) * s);
          memcpy(&u, e, sizeof(u));
        }
      }
      if constexpr (kTransposed) {
        T e[V];
        memcpy(e, &u, sizeof(u));
#pragma unroll
        for (int j = 0; j < V; ++j) dst[(c + j) * ld + i] = e[j];
      } else {
        *reinterpret_cast<uint4*>(dst + i * ld + c) = u;
      }
    }
  } else {
#pragma unroll 4
    for (int idx = threadIdx.x; idx < ROWS * COLS; idx += THREADS) {
      const int i = idx / COLS, c = idx % COLS;
      const int64_t off = row_offset(i);
      acc_t<T> v = 0;
      if (off >= 0 && col0 + c < col_limit) {
        v = to_acc(src[off + col0 + c]);
        if constexpr (kScaled) v *= row_scale(i);
      }
      dst[kTransposed ? c * ld + i : i * ld + c] = from_acc<T>(v);
    }
  }
}

struct NoScale {
  __device__ __forceinline__ float operator()(int) const { return 1.f; }
};

// One 16-byte cp.async (sm_80+) global -> shared; `in` false zero-fills the destination instead
// (source size 0: `src` is then never read but must still be a valid pointer).
// cp_async_16_shared takes the destination as a shared-memory address, for callers that keep
// precomputed addresses (the warp-specialized producer).
// kL1 reads through L1 (.ca; .cg reads from L2 only), for tiles that other blocks on the SM read
// again soon: the weight slabs of the table kernels, which every output tile of a relation loads.
// H100, cached subm 3^3 fp16, queued us per call, .cg -> .ca (python -m benchmarks.run --suite voxel):
// C32 64-beam 27.7 -> 22.3, real scan 19.4 -> 17.3, 171k rows 72 -> 67; C64 171k rows 92 -> 90.
template <bool kL1 = false>
__device__ __forceinline__ void cp_async_16_shared(uint32_t dst, const void* src, bool in) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kL1) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0));
  }
#endif
}
// cp.async of kBytes = 4 (a table entry) or 8 (a packed relation's row of a small-C_in layer), through
// L1; `in` false zero-fills.
template <int kBytes>
__device__ __forceinline__ void cp_async_small(void* dst, const void* src, bool in) {
  static_assert(kBytes == 4 || kBytes == 8, "16 bytes: cp_async_16");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(src), "n"(kBytes), "r"(in ? kBytes : 0));
#else
  using Word = std::conditional_t<kBytes == 4, int32_t, int2>;
  *static_cast<Word*>(dst) = in ? __ldg(static_cast<const Word*>(src)) : Word{};
#endif
}

// Zeros `bytes` (a multiple of 16) of shared memory at `p` (16-byte aligned), every thread of a
// kThreads-thread block storing its share; the caller orders the stores with a barrier.
template <int kThreads>
__device__ __forceinline__ void zero_shared(void* p, int bytes) {
  for (int e = threadIdx.x; e < bytes / 16; e += kThreads) static_cast<uint4*>(p)[e] = make_uint4(0, 0, 0, 0);
}

template <bool kL1 = false, typename T>
__device__ __forceinline__ void cp_async_16(T* dst, const T* src, bool in) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  cp_async_16_shared<kL1>(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src, in);
#else
  uint4 u = make_uint4(0, 0, 0, 0);
  if (in) u = __ldg(reinterpret_cast<const uint4*>(src));
  *reinterpret_cast<uint4*>(dst) = u;
#endif
}

// Asynchronous form of load_rows' vector path (row-major, unscaled): cp.async (sm_80+) copies the
// 16-byte chunks into shared memory without staging them in registers, so the gather of the next
// tile overlaps the MMA of the current one. Out-of-range chunks are zero-filled by the copy itself
// (source size 0; the source address is then never read but must still be a valid pointer).
// Same preconditions as load_rows with `vec`; callers take load_rows when they do not hold.
// Completion: cp_async_commit() after the tile's copies, cp_async_wait<N>() then __syncthreads().
// Before sm_80 this is a plain synchronous load_rows.
template <typename T, int ROWS, int COLS, int THREADS, typename RowOffset>
__device__ __forceinline__ void load_rows_async(T* __restrict__ dst, int ld, const T* __restrict__ src,
                                                RowOffset row_offset, int col0, int col_limit) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int V = kVecElems<T>;
  static_assert(COLS % V == 0, "tile width must be a whole number of 16-byte vectors");
  constexpr int kChunks = COLS / V;
#pragma unroll
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += THREADS) {
    const int i = idx / kChunks, c = (idx % kChunks) * V;
    const int64_t off = row_offset(i);
    const bool in = off >= 0 && col0 + c < col_limit;
    cp_async_16(dst + i * ld + c, in ? src + off + col0 + c : src, in);
  }
#else
  load_rows<T, ROWS, COLS, THREADS, false, false>(dst, ld, src, row_offset, NoScale{}, col0, col_limit, true);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// cp.async of a ROWS x COLS tile in which every row is wholly present or wholly zero (the channel
// counts fill whole tiles and meet load_rows' vector preconditions). Each thread owns the same
// 16-byte chunk column of fixed rows in every call, so the shared-memory addresses are compile-time
// offsets and a row costs one source-pointer computation and one cp.async: about a fifth of the
// instructions of load_rows_async, whose general chunk loop left the tensor-core table kernel issuing
// four times more load bookkeeping than ldmatrix + mma.
template <typename T, int ROWS, int COLS, int THREADS, bool kL1 = false>
struct FixedChunkLoader {
  static constexpr int V = kVecElems<T>, kChunks = COLS / V, kRowStride = THREADS / kChunks;
  static constexpr int kRowsPerThread = (ROWS + kRowStride - 1) / kRowStride;
  static_assert(COLS % V == 0 && THREADS % kChunks == 0, "a thread must keep one chunk column");
  int row0, col;  // this thread's first row and its element column

  __device__ __forceinline__ FixedChunkLoader()
      : row0(static_cast<int>(threadIdx.x) / kChunks), col((static_cast<int>(threadIdx.x) % kChunks) * V) {}

  struct Row {
    const T* src;  // tile row's first element; for a zero row any readable address
    bool in;       // false: zero-fill the row
  };

  // row_src(i) -> Row of tile row i.
  template <typename RowSrc>
  __device__ __forceinline__ void load(T* dst, int ld, RowSrc row_src) const {
#pragma unroll
    for (int it = 0; it < kRowsPerThread; ++it) {
      const int i = row0 + it * kRowStride;
      if (ROWS % kRowStride != 0 && i >= ROWS) break;
      const Row r = row_src(i);
      cp_async_16<kL1>(dst + i * ld + col, r.src + col, r.in);
    }
  }
};

}  // namespace relconv::cuda
