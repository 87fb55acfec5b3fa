#pragma once
// Forward relational convolution, fetch-on-demand dataflow:
//   out[o, g-block] += scale[p] * x[in_index[p], g-block] @ W[r, g]   for every pair p of relation r.
//
// Grid: x = pair tiles (BM pairs of one relation, see tile_schedule.cuh), y = group * n_tiles + the
// BN-wide output-channel tile. A block gathers its BM input rows K-slab by K-slab into shared memory
// together with the matching BK x BN slab of W[r, g], multiplies, then adds scale * result into the
// accumulation buffer with atomics: several pairs (of this or other relations, in this or other
// blocks) may target the same output row, so every output element is a reduction across blocks.
#include <cstdint>

#include "numeric.cuh"
#include "tile_load.cuh"
#include "tile_mma.cuh"
#include "tile_schedule.cuh"

namespace relconv::cuda {

template <typename T, typename Idx>
struct ConvForwardArgs {
  const T* x;              // [num_in, groups * cin_g]
  const T* weight;         // [R, groups, cin_g, cout_g], contiguous
  const Idx* in_index;     // [P]
  const Idx* out_index;    // [P]
  const int64_t* rel_ptr;  // [R + 1]
  const int64_t* tile_ptr; // [R + 1], from relation_tile_offsets with pairs_per_tile = BM
  const acc_t<T>* scale;   // [P] or nullptr
  acc_t<T>* out;           // [num_out, groups * cout_g], zero-initialised
  int64_t num_in, num_out, num_pairs, num_relations;
  int groups, cin_g, cout_g, n_tiles;
  bool vec_x, vec_w;       // 16-byte vector loads allowed for x rows / W rows (see load_rows)
};

// Loads the tile's pair metadata into shared memory: s_in[i] = element offset of the input row's
// group block, s_out[i] = element offset of the output row's group block (both -1 when the pair is
// past the tile end or either index is out of range: such a pair contributes nothing).
template <int BM, typename T, typename Idx>
__device__ __forceinline__ void load_forward_pairs(const ConvForwardArgs<T, Idx>& a, const PairTile& t, int g,
                                                   int64_t* s_in, int64_t* s_out, acc_t<T>* s_scale) {
  const int64_t ldx = int64_t{a.groups} * a.cin_g, ldo = int64_t{a.groups} * a.cout_g;
  for (int i = threadIdx.x; i < BM; i += blockDim.x) {
    const int64_t p = t.begin + i;
    int64_t in = -1, out = -1;
    acc_t<T> s = 0;
    if (p < t.end) {
      const int64_t ii = a.in_index[p], oo = a.out_index[p];
      if (ii >= 0 && ii < a.num_in && oo >= 0 && oo < a.num_out) {
        in = ii * ldx + int64_t{g} * a.cin_g;
        out = oo * ldo + int64_t{g} * a.cout_g;
        s = a.scale ? a.scale[p] : acc_t<T>(1);
      }
    }
    s_in[i] = in;
    s_out[i] = out;
    s_scale[i] = s;
  }
}

// The opening of every fetch-on-demand forward kernel: the block's pair tile (blockIdx.x), its group
// and BN-wide column tile (blockIdx.y), and the tile's pair metadata in shared memory (ends in a
// barrier). t.valid is the same for the whole block; a block without pairs returns before the barrier.
struct ForwardTile {
  PairTile t;
  int g, n0;
};
template <int BM, int BN, typename T, typename Idx>
__device__ __forceinline__ ForwardTile begin_forward_tile(const ConvForwardArgs<T, Idx>& a, int64_t* s_in,
                                                          int64_t* s_out, acc_t<T>* s_scale) {
  ForwardTile f{locate_tile(a.rel_ptr, a.tile_ptr, a.num_relations, a.num_pairs, BM, blockIdx.x),
                static_cast<int>(blockIdx.y / a.n_tiles), static_cast<int>(blockIdx.y % a.n_tiles) * BN};
  if (!f.t.valid) return f;
  load_forward_pairs<BM>(a, f.t, f.g, s_in, s_out, s_scale);
  __syncthreads();
  return f;
}

// Tensor-core variant (half / bfloat16). Warps form a (BM/WM) x (BN/WN) grid over the block tile.
// Shared memory: A [BM][BK+8] and B [BK][BN+8] during the K loop, then reused as the fp32 C tile
// [BM][BN+4] for a coalesced epilogue (consecutive threads add consecutive channels of one row).
template <typename T, typename Idx, int BM, int BN, int BK, int WM, int WN>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)
    conv_forward_wmma(const ConvForwardArgs<T, Idx> a) {
  constexpr int kThreads = (BM / WM) * (BN / WN) * 32;
  constexpr int kLdA = BK + 8, kLdB = BN + 8, kLdC = BN + 4;
  constexpr int kBytesAB = (BM * kLdA + BK * kLdB) * static_cast<int>(sizeof(T));
  constexpr int kBytesC = BM * kLdC * static_cast<int>(sizeof(float));
  __shared__ __align__(128) unsigned char smem[kBytesAB > kBytesC ? kBytesAB : kBytesC];
  __shared__ int64_t s_in[BM], s_out[BM];
  __shared__ float s_scale[BM];

  const auto [t, g, n0] = begin_forward_tile<BM, BN>(a, s_in, s_out, s_scale);
  if (!t.valid) return;

  T* As = reinterpret_cast<T*>(smem);
  T* Bs = As + BM * kLdA;
  const int warp = threadIdx.x / 32, wm = warp / (BN / WN), wn = warp % (BN / WN);
  WmmaWarpTile<T, WM, WN> tile;
  tile.zero();
  const T* w = a.weight + (t.relation * a.groups + g) * int64_t{a.cin_g} * a.cout_g;
  const int cin = a.cin_g, cout = a.cout_g;
  for (int k0 = 0; k0 < cin; k0 += BK) {
    load_rows<T, BM, BK, kThreads, false, false>(
        As, kLdA, a.x, [&](int i) { return s_in[i]; }, NoScale{}, k0, cin, a.vec_x);
    load_rows<T, BK, BN, kThreads, false, false>(
        Bs, kLdB, w, [&](int k) { return k0 + k < cin ? int64_t{k0 + k} * cout : int64_t{-1}; }, NoScale{},
        n0, cout, a.vec_w);
    __syncthreads();
    tile.template mma<BK>(As + wm * WM * kLdA, kLdA, Bs + wn * WN, kLdB);
    __syncthreads();
  }

  float* Cs = reinterpret_cast<float*>(smem);
  tile.store(Cs + wm * WM * kLdC + wn * WN, kLdC);
  __syncthreads();
  for (int idx = threadIdx.x; idx < BM * BN; idx += kThreads) {
    const int m = idx / BN, n = idx % BN;
    const int64_t o = s_out[m];
    if (o >= 0 && n0 + n < cout) atomicAdd(a.out + o + n0 + n, Cs[m * kLdC + n] * s_scale[m]);
  }
}

// SIMT variant (float / double): thread (tm, tn) of a (BM/TM) x (BN/TN) grid owns an interleaved
// TM x TN sub-tile (see SimtThreadTile). A is stored channel-major [BK][BM+2] (stride BM+2 makes the
// transposing scalar stores bank-conflict free), B row-major [BK][BN+4] (rows stay 16-byte aligned
// for vector stores). The epilogue adds straight from registers.
template <typename T, typename Idx, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
    conv_forward_simt(const ConvForwardArgs<T, Idx> a) {
  constexpr int kThreads = (BM / TM) * (BN / TN);
  constexpr int kLdA = BM + 2, kLdB = BN + 4;
  __shared__ __align__(16) T As[BK * kLdA];
  __shared__ __align__(16) T Bs[BK * kLdB];
  __shared__ int64_t s_in[BM], s_out[BM];
  __shared__ acc_t<T> s_scale[BM];

  const auto [t, g, n0] = begin_forward_tile<BM, BN>(a, s_in, s_out, s_scale);
  if (!t.valid) return;

  const int tm = threadIdx.x / (BN / TN), tn = threadIdx.x % (BN / TN);
  SimtThreadTile<T, BM, BN, TM, TN> tile;
  tile.zero();
  const T* w = a.weight + (t.relation * a.groups + g) * int64_t{a.cin_g} * a.cout_g;
  const int cin = a.cin_g, cout = a.cout_g;
  for (int k0 = 0; k0 < cin; k0 += BK) {
    load_rows<T, BM, BK, kThreads, true, false>(
        As, kLdA, a.x, [&](int i) { return s_in[i]; }, NoScale{}, k0, cin, a.vec_x);
    load_rows<T, BK, BN, kThreads, false, false>(
        Bs, kLdB, w, [&](int k) { return k0 + k < cin ? int64_t{k0 + k} * cout : int64_t{-1}; }, NoScale{},
        n0, cout, a.vec_w);
    __syncthreads();
    tile.template mma<BK>(As, kLdA, Bs, kLdB, tm, tn);
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = tm + i * (BM / TM);
    const int64_t o = s_out[m];
    if (o < 0) continue;
    const acc_t<T> s = s_scale[m];
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int n = n0 + tn + j * (BN / TN);
      if (n < cout) atomicAdd(a.out + o + n, tile.acc[i][j] * s);
    }
  }
}

}  // namespace relconv::cuda
