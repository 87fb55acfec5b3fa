#pragma once
// Weight gradient of the relational convolution, a gather-gather product per relation:
//   dW[r, g] += sum over pairs p of relation r of x[in_index[p], g-block]^T (scale[p] * grad_out[out_index[p], g-block])
//
// GEMM view per relation: M = cin_g, N = cout_g, K = the relation's pairs. Grid: x = pair tiles of
// `pairs_per_tile` pairs of one relation (several BK-pair K-slabs, so each block reduces many pairs in
// registers before its single round of atomics), y = (M tile, N tile), z = group. Each K-slab gathers
// BK rows of x and of grad_out (scaled) into shared memory as [BK][BM] and [BK][BN]: row-contiguous
// global reads, and exactly the k-major layouts both MMA flavours consume. Blocks of the same
// relation meet in the fp32/fp64 dW buffer through atomicAdd.
#include <cstdint>

#include "numeric.cuh"
#include "tile_load.cuh"
#include "tile_mma.cuh"
#include "tile_schedule.cuh"

namespace relconv::cuda {

template <typename T, typename Idx>
struct WeightGradArgs {
  const T* x;              // [num_in, groups * cin_g]
  const T* grad;           // [num_out, groups * cout_g]
  const Idx* in_index;     // [P]
  const Idx* out_index;    // [P]
  const int64_t* rel_ptr;  // [R + 1]
  const int64_t* tile_ptr; // [R + 1], from relation_tile_offsets with pairs_per_tile
  const acc_t<T>* scale;   // [P] or nullptr
  acc_t<T>* dw;            // [R, groups, cin_g, cout_g], zero-initialised
  int64_t num_in, num_out, num_pairs, num_relations, pairs_per_tile;
  int groups, cin_g, cout_g, n_tiles;
  bool vec_x, vec_g;       // 16-byte vector loads allowed for x rows / grad_out rows
};

// Row-offset functors of one K-slab starting at pair p0. An index out of range zero-fills its row
// (so the pair contributes nothing and nothing outside the buffers is read).
template <typename T, typename Idx>
struct SlabRows {
  const Idx* index;
  int64_t p0, p_end, num_rows, row_stride, group_offset;
  __device__ __forceinline__ int64_t operator()(int i) const {
    const int64_t p = p0 + i;
    if (p >= p_end) return -1;
    const int64_t row = index[p];
    return row >= 0 && row < num_rows ? row * row_stride + group_offset : -1;
  }
};

template <typename Acc>
struct SlabScale {
  const Acc* scale;
  int64_t p0, p_end;
  __device__ __forceinline__ Acc operator()(int i) const {
    return scale && p0 + i < p_end ? scale[p0 + i] : Acc(1);
  }
};

// Tensor-core variant (half / bfloat16): warps form a (BM/WM) x (BN/WN) grid; A is the col-major
// WMMA operand (channel m of pair k at As[k * ldA + m]). After the K loop shared memory is reused as
// the fp32 C tile for coalesced atomics.
template <typename T, typename Idx, int BM, int BN, int BK, int WM, int WN>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, 2)
    conv_weight_grad_wmma(const WeightGradArgs<T, Idx> a) {
  constexpr int kThreads = (BM / WM) * (BN / WN) * 32;
  constexpr int kLdA = BM + 8, kLdB = BN + 8, kLdC = BN + 4;
  constexpr int kBytesAB = (BK * kLdA + BK * kLdB) * static_cast<int>(sizeof(T));
  constexpr int kBytesC = BM * kLdC * static_cast<int>(sizeof(float));
  __shared__ __align__(128) unsigned char smem[kBytesAB > kBytesC ? kBytesAB : kBytesC];

  const PairTile t =
      locate_tile(a.rel_ptr, a.tile_ptr, a.num_relations, a.num_pairs, a.pairs_per_tile, blockIdx.x);
  if (!t.valid) return;
  const int g = blockIdx.z, m0 = (blockIdx.y / a.n_tiles) * BM, n0 = (blockIdx.y % a.n_tiles) * BN;
  const int cin = a.cin_g, cout = a.cout_g;
  const int64_t ldx = int64_t{a.groups} * cin, ldg = int64_t{a.groups} * cout;

  T* As = reinterpret_cast<T*>(smem);
  T* Bs = As + BK * kLdA;
  const int warp = threadIdx.x / 32, wm = warp / (BN / WN), wn = warp % (BN / WN);
  WmmaWarpTile<T, WM, WN, nvcuda::wmma::col_major> tile;
  tile.zero();
  for (int64_t p0 = t.begin; p0 < t.end; p0 += BK) {
    const SlabRows<T, Idx> x_rows{a.in_index, p0, t.end, a.num_in, ldx, int64_t{g} * cin};
    const SlabRows<T, Idx> g_rows{a.out_index, p0, t.end, a.num_out, ldg, int64_t{g} * cout};
    load_rows<T, BK, BM, kThreads, false, false>(As, kLdA, a.x, x_rows, NoScale{}, m0, cin, a.vec_x);
    load_rows<T, BK, BN, kThreads, false, true>(Bs, kLdB, a.grad, g_rows, SlabScale<float>{a.scale, p0, t.end},
                                                n0, cout, a.vec_g);
    __syncthreads();
    tile.template mma<BK>(As + wm * WM, kLdA, Bs + wn * WN, kLdB);
    __syncthreads();
  }

  float* Cs = reinterpret_cast<float*>(smem);
  tile.store(Cs + wm * WM * kLdC + wn * WN, kLdC);
  __syncthreads();
  acc_t<T>* dw = a.dw + (t.relation * a.groups + g) * int64_t{cin} * cout;
  for (int idx = threadIdx.x; idx < BM * BN; idx += kThreads) {
    const int m = idx / BN, n = idx % BN;
    if (m0 + m < cin && n0 + n < cout) atomicAdd(dw + int64_t{m0 + m} * cout + n0 + n, Cs[m * kLdC + n]);
  }
}

// SIMT variant (float / double), same dataflow; thread (tm, tn) owns an interleaved TM x TN sub-tile.
// The min-blocks hint of 2 (a 128-register budget) matters: without it ptxas settles near 80 registers
// and spills in the float instantiations (same for the narrow bfloat16 WMMA variant above).
template <typename T, typename Idx, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN), 2)
    conv_weight_grad_simt(const WeightGradArgs<T, Idx> a) {
  using Acc = acc_t<T>;
  constexpr int kThreads = (BM / TM) * (BN / TN);
  constexpr int kLdA = BM + 4, kLdB = BN + 4;
  __shared__ __align__(16) T As[BK * kLdA];
  __shared__ __align__(16) T Bs[BK * kLdB];

  const PairTile t =
      locate_tile(a.rel_ptr, a.tile_ptr, a.num_relations, a.num_pairs, a.pairs_per_tile, blockIdx.x);
  if (!t.valid) return;
  const int g = blockIdx.z, m0 = (blockIdx.y / a.n_tiles) * BM, n0 = (blockIdx.y % a.n_tiles) * BN;
  const int cin = a.cin_g, cout = a.cout_g;
  const int64_t ldx = int64_t{a.groups} * cin, ldg = int64_t{a.groups} * cout;

  const int tm = threadIdx.x / (BN / TN), tn = threadIdx.x % (BN / TN);
  SimtThreadTile<T, BM, BN, TM, TN> tile;
  tile.zero();
  for (int64_t p0 = t.begin; p0 < t.end; p0 += BK) {
    const SlabRows<T, Idx> x_rows{a.in_index, p0, t.end, a.num_in, ldx, int64_t{g} * cin};
    const SlabRows<T, Idx> g_rows{a.out_index, p0, t.end, a.num_out, ldg, int64_t{g} * cout};
    load_rows<T, BK, BM, kThreads, false, false>(As, kLdA, a.x, x_rows, NoScale{}, m0, cin, a.vec_x);
    load_rows<T, BK, BN, kThreads, false, true>(Bs, kLdB, a.grad, g_rows, SlabScale<Acc>{a.scale, p0, t.end},
                                                n0, cout, a.vec_g);
    __syncthreads();
    tile.template mma<BK>(As, kLdA, Bs, kLdB, tm, tn);
    __syncthreads();
  }

  Acc* dw = a.dw + (t.relation * a.groups + g) * int64_t{cin} * cout;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + tm + i * (BM / TM);
    if (m >= cin) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int n = n0 + tn + j * (BN / TN);
      if (n < cout) atomicAdd(dw + int64_t{m} * cout + n, tile.acc[i][j]);
    }
  }
}

}  // namespace relconv::cuda
