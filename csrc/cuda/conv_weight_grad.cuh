#pragma once
// Weight gradient of the relational convolution, a gather-gather product per relation:
//   dW[r, g] = sum over pairs p of relation r of x[in_index[p], g-block]^T (scale[p] * grad_out[out_index[p], g-block])
//
// GEMM view per relation: M = cin_g, N = cout_g, K = the relation's pairs (split-K). Grid: x = pair
// tiles of `pairs_per_tile` pairs of one relation (tile_schedule.cuh), y = (M tile, N tile), z = group.
// Each K step gathers BK rows of x and of grad_out into shared memory as [BK][BM] and [BK][BN]:
// row-contiguous global reads, and the k-major layouts the MMA consumes. A block reduces its whole
// tile in registers, then either adds its partial dW into the fp32/fp64 buffer with atomics
// (`partial` null), or stores it to `partial[tile]`, and weight_grad_reduce sums the tiles of each
// relation in tile order: the deterministic mode, bitwise reproducible. The pipelined kernel also
// runs all of that as one cooperative launch (conv_weight_grad_mma_fused): schedule, tile sums and,
// after a grid barrier, the reduction; deterministic as well.
#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

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
  const int64_t* tile_ptr; // [R + 2], from relation_tile_offsets (tile_ptr[R + 1]: pairs per tile)
  const acc_t<T>* scale;   // [P] or nullptr
  acc_t<T>* dw;            // [R, groups, cin_g, cout_g], zero-initialised (atomic mode)
  acc_t<T>* partial;       // [tiles, groups, cin_g, cout_g] per-tile sums (deterministic mode), or nullptr
  // The fused kernel only: each block finds its tile of the `target_tiles` schedule itself, block 0
  // writes that schedule to `schedule` ([R + 2], tile_ptr's layout) for the reduction, and the
  // reduction goes to `dw_out` (x's dtype) or, when that is null, to `dw` (the accumulator's dtype).
  int64_t* schedule;
  int64_t target_tiles;
  T* dw_out;
  int64_t num_in, num_out, num_pairs, num_relations;
  int groups, cin_g, cout_g, n_tiles;
  bool vec_x, vec_g;       // 16-byte vector loads allowed for x rows / grad_out rows
  bool x_chunks;           // x rows start on C_in_g-element boundaries (rows of 4 or 8 bytes: stems)
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

// Pipelined variant (sm_80+): a kStages-deep cp.async pipeline over the tile's K steps feeding
// mma.sync (MmaWarpTile, A k-major: half / bfloat16, and float in TF32 mode) or, with kExact, exact
// fp32 fmas on CUDA cores (SimtOuterWarpTile). Each thread copies the same 16-byte chunk column of
// fixed rows of both operands in every step (FixedChunkLoader; BM == BN so the x and grad_out tiles
// share the mapping), and fetches the pair indices of its rows one step ahead into registers, so
// the index loads overlap a step of MMA instead of stalling the copies.
// The pair scale (R-GCN's 1/deg) multiplies the grad_out fragments in registers, from a per-stage
// shared-memory copy of the step's scales (exact fp32: the B operand as it is read). Needs vec_g
// (16-byte grad_out rows) and vec_x, or x rows of 4 or 8 bytes (the stems' 1-4 channels) that start
// on their own size: each is one cp.async into a stage whose other columns stay zero. Columns past
// C_in / C_out are zero-filled per thread.
template <typename T, int BM, int BN, int BK, int kStages>
struct WeightGradSmem {
  static constexpr int kLdA = BM + 8, kLdB = BN + 8;
  static constexpr int kStage = BK * kLdA + BK * kLdB;  // elements
  static constexpr int kStageBytes = kStage * static_cast<int>(sizeof(T));
  static constexpr int kBytes = kStages * (kStageBytes + BK * static_cast<int>(sizeof(float)));
  static_assert(kStageBytes % 16 == 0, "stages must stay 16-byte aligned");
};

// One block's pair tile `t` (block-wide), summed into dw with atomics or stored to partial[blockIdx.x].
// kShortX: x rows of 4 or 8 bytes (stems, !a.vec_x), a separate instantiation so that the 16-byte
// path's loads carry no per-row branch on the row width.
template <typename T, typename Idx, int BM, int BN, int BK, int WM, int WN, int WK, int kStages, bool kExact,
          bool kShortX>
__device__ __forceinline__ void weight_grad_mma_tile(const WeightGradArgs<T, Idx>& a, const PairTile& t,
                                                     unsigned char* smem) {
  static_assert(BM == BN, "x and grad_out tiles share one chunk mapping");
  static_assert(!kExact || std::is_same_v<T, float>, "the exact warp tile is fp32");
  using Smem = WeightGradSmem<T, BM, BN, BK, kStages>;
  constexpr int kWarpsMN = (BM / WM) * (BN / WN), kThreads = kWarpsMN * WK * 32, kSliceK = BK / WK;
  static_assert(BK % WK == 0, "whole K slices");
  constexpr int kLdA = Smem::kLdA, kLdB = Smem::kLdB;
  using Loader = FixedChunkLoader<T, BK, BM, kThreads>;
  constexpr int kRows = Loader::kRowsPerThread;
  T* stages = reinterpret_cast<T*>(smem);
  float* s_scale = reinterpret_cast<float*>(smem + kStages * Smem::kStageBytes);  // [kStages][BK]

  const int g = blockIdx.z, m0 = (blockIdx.y / a.n_tiles) * BM, n0 = (blockIdx.y % a.n_tiles) * BN;
  const int cin = a.cin_g, cout = a.cout_g;
  const int64_t ldx = int64_t{a.groups} * cin, ldg = int64_t{a.groups} * cout;
  const int warp = threadIdx.x / 32, wk = warp / kWarpsMN, wm = warp % kWarpsMN / (BN / WN), wn = warp % (BN / WN);

  const Loader loader;
  const bool x_cols = m0 + loader.col < cin, g_cols = n0 + loader.col < cout;
  const T* x_base = a.x + int64_t{g} * cin + m0 + loader.col;
  const T* g_base = a.grad + int64_t{g} * cout + n0 + loader.col;

  // This thread's rows of the next step to issue: element offsets of the x and grad_out rows (-1:
  // zero row, for a pair past the tile end or with an index out of range) and the pair's scale.
  int64_t x_off[kRows], g_off[kRows];
  float scale[kRows];
  const auto fetch = [&](int64_t p0) {
#pragma unroll
    for (int it = 0; it < kRows; ++it) {
      const int i = loader.row0 + it * Loader::kRowStride;
      const int64_t p = p0 + i;
      x_off[it] = g_off[it] = -1;
      scale[it] = 1.f;
      if (i < BK && p < t.end) {
        const int64_t xi = a.in_index[p], oi = a.out_index[p];
        if (xi >= 0 && xi < a.num_in && oi >= 0 && oi < a.num_out) {
          x_off[it] = xi * ldx;
          g_off[it] = oi * ldg;
          if (a.scale) scale[it] = a.scale[p];
        }
      }
    }
  };
  const int steps = static_cast<int>((t.end - t.begin + BK - 1) / BK);
  const int x_bytes = cin * static_cast<int>(sizeof(T));  // 4 or 8 where kShortX
  if constexpr (kShortX) {
    // Short x rows fill the first bytes of the stage's column chunk 0; the rest of every A slab is
    // zero once, here, and never written again.
    zero_shared<kThreads>(smem, kStages * Smem::kStageBytes);
    __syncthreads();
  }
  int load_step = 0;
  const auto issue_next = [&] {
    const int stage = load_step % kStages;
    T* As = stages + stage * Smem::kStage;
    T* Bs = As + BK * kLdA;
#pragma unroll
    for (int it = 0; it < kRows; ++it) {
      const int i = loader.row0 + it * Loader::kRowStride;
      if (BK % Loader::kRowStride != 0 && i >= BK) break;
      const bool row = x_off[it] >= 0;  // x and grad_out rows are present together
      const T* x_src = row ? x_base + x_off[it] : a.x;
      if constexpr (!kShortX) {
        cp_async_16(As + i * kLdA + loader.col, x_src, row && x_cols);
      } else if (loader.col == 0) {
        if (x_bytes == 8) {
          cp_async_small<8>(As + i * kLdA, x_src, row);
        } else {
          cp_async_small<4>(As + i * kLdA, x_src, row);
        }
      }
      cp_async_16(Bs + i * kLdB + loader.col, row ? g_base + g_off[it] : a.grad, row && g_cols);
      if (a.scale && loader.col == 0) s_scale[stage * BK + i] = scale[it];
    }
    ++load_step;
    fetch(t.begin + int64_t{load_step} * BK);
  };

  std::conditional_t<kExact, SimtOuterWarpTile<WM, WN>, MmaWarpTile<T, WM, WN>> tile;
  tile.zero();
  fetch(t.begin);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) issue_next();
    cp_async_commit();  // empty groups keep the wait counts uniform
  }
  const int lane = threadIdx.x % 32, tig = lane % 4;
  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();
    // Step `step`'s stage is complete for every thread, and every warp is done with the previous
    // step's stage, which the issue below refills.
    __syncthreads();
    if (step + kStages - 1 < steps) issue_next();
    cp_async_commit();
    // This warp's K slice of the step: rows wk * kSliceK on of both k-major operands.
    const int stage = step % kStages;
    const T* As = stages + stage * Smem::kStage + wk * kSliceK * kLdA;
    const T* Bs = stages + stage * Smem::kStage + BK * kLdA + wk * kSliceK * kLdB;
    const float* sc = s_scale + stage * BK + wk * kSliceK;
    if constexpr (kExact) {
      tile.template mma<kSliceK>(As + wm * WM, kLdA, Bs + wn * WN, kLdB, a.scale ? sc : nullptr);
    } else if (a.scale) {
      tile.template mma<kSliceK, true>(As + wm * WM, kLdA, Bs + wn * WN, kLdB, [&](int k, auto& fb) {
        if constexpr (std::is_same_v<T, float>) {
          // TF32 fragment rows of this thread: k + tig in register 0, k + tig + 4 in register 1.
          const float s0 = sc[k + tig], s4 = sc[k + tig + 4];
#pragma unroll
          for (int j = 0; j < MmaWarpTile<T, WM, WN>::kTilesN; ++j) {
            fb[j][0] = __float_as_uint(__uint_as_float(fb[j][0]) * s0);
            fb[j][1] = __float_as_uint(__uint_as_float(fb[j][1]) * s4);
          }
        } else {
          // Fragment rows of this thread: k + 2 tig (+1) in register 0, k + 8 + 2 tig (+1) in register 1.
          const float s0 = sc[k + 2 * tig], s1 = sc[k + 2 * tig + 1], s8 = sc[k + 8 + 2 * tig],
                      s9 = sc[k + 9 + 2 * tig];
#pragma unroll
          for (int j = 0; j < MmaWarpTile<T, WM, WN>::kTilesN; ++j) {
            fb[j][0] = scale_pair<T>(fb[j][0], s0, s1);
            fb[j][1] = scale_pair<T>(fb[j][1], s8, s9);
          }
        }
      });
    } else {
      tile.template mma<kSliceK, true>(As + wm * WM, kLdA, Bs + wn * WN, kLdB);
    }
  }
  cp_async_wait<0>();

  const int64_t rel_block = (t.relation * a.groups + g) * int64_t{cin} * cout;
  float* partial = a.partial ? a.partial + (int64_t{blockIdx.x} * a.groups + g) * int64_t{cin} * cout : nullptr;
  // dW[r, c] and dW[r, c + 1] (c even) of this block's tile.
  const auto emit = [&](int r, int c, float v0, float v1) {
    if (r >= cin || c >= cout) return;
    const int64_t e = int64_t{r} * cout + c;
    if (partial && c + 1 < cout) {  // e is even here (16-byte rows: even C_out): one 8-byte store
      *reinterpret_cast<float2*>(partial + e) = make_float2(v0, v1);
    } else if (partial) {
      partial[e] = v0;
    } else {
      atomicAdd(a.dw + rel_block + e, v0);
      if (c + 1 < cout) atomicAdd(a.dw + rel_block + e + 1, v1);
    }
  };
  if constexpr (WK == 1) {
    const int row0 = m0 + wm * WM, col0 = n0 + wn * WN;
    tile.for_each_pair([&](int m, int n, float v0, float v1) { emit(row0 + m, col0 + n, v0, v1); });
  } else {
    // The K slices' sums meet in shared memory (the stages, free once every warp is past its last
    // step) and are added in slice order, so the tile's sum does not depend on warp timing.
    static_assert(WK * BM * BN * sizeof(float) <= kStages * Smem::kStageBytes, "the slice sums fit the stages");
    float* sums = reinterpret_cast<float*>(smem);
    __syncthreads();
    tile.for_each_pair([&](int m, int n, float v0, float v1) {
      float* p = sums + (wk * BM + wm * WM + m) * BN + wn * WN + n;
      p[0] = v0, p[1] = v1;
    });
    __syncthreads();
    for (int e = 2 * static_cast<int>(threadIdx.x); e < BM * BN; e += 2 * kThreads) {
      float v0 = 0.f, v1 = 0.f;
#pragma unroll
      for (int q = 0; q < WK; ++q) v0 += sums[q * BM * BN + e], v1 += sums[q * BM * BN + e + 1];
      emit(m0 + e / BN, n0 + e % BN, v0, v1);
    }
  }
}

// Stems' short x rows take the 32 x 32 tiles only (choice::weight_grad_kernel), so the wider tiles
// carry one instantiation.
template <typename T, typename Idx, int BM, int BN, int BK, int WM, int WN, int WK, int kStages, bool kExact>
__device__ __forceinline__ void weight_grad_tile_of_width(const WeightGradArgs<T, Idx>& a, const PairTile& t,
                                                          unsigned char* smem) {
  if constexpr (BM == 32) {
    if (!a.vec_x) {
      weight_grad_mma_tile<T, Idx, BM, BN, BK, WM, WN, WK, kStages, kExact, true>(a, t, smem);
      return;
    }
  }
  weight_grad_mma_tile<T, Idx, BM, BN, BK, WM, WN, WK, kStages, kExact, false>(a, t, smem);
}

template <typename T, typename Idx, int BM, int BN, int BK, int WM, int WN, int WK, int kStages, bool kExact>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * WK * 32)
    conv_weight_grad_mma(const WeightGradArgs<T, Idx> a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const PairTile t =
      locate_tile(a.rel_ptr, a.tile_ptr, a.num_relations, a.num_pairs, a.tile_ptr[a.num_relations + 1], blockIdx.x);
  if (t.valid) weight_grad_tile_of_width<T, Idx, BM, BN, BK, WM, WN, WK, kStages, kExact>(a, t, smem);
}

// The weight gradient in one cooperative launch (every block resident at once), where the split
// form costs three launches and three allocations per backward (schedule and zeroing, tiles with
// atomics, rounding): a measurable share of a training step's host time.
//   1. Each block finds its own pair tile from rel_ptr (own_pair_tile: relation_tile_offsets'
//      schedule, computed by one warp), and block 0 writes that schedule to a.schedule.
//   2. Every block sums its tile into partial[tile].
//   3. After a grid barrier (which also orders the memory), all blocks reduce the tiles of each
//      relation in a fixed order and round once into the output.
// No atomics and no zeroed buffer: bitwise reproducible whatever the deterministic switch says.
// What phase 1 and 2 wrote is read in phase 3 with ld.cg (L2), never through the non-coherent path.
// The 128 x 128 tile gets two blocks per SM (128 registers): it otherwise takes ~155 registers (the
// reduction's beside the tile's), one block of 8 warps per SM, too few gathers in flight to hide
// their latency (H100, subm 3^3 fp16, kernel us, 64-beam scan / four scans / room-3cm: C128 206 ->
// 110 / 696 -> 345 / 1995 -> 967; TF32 C128 355 -> 197 / 1304 -> 697 / 3915 -> 2032). (The split
// exact fp32 kernel would spill under that budget.) The exact 64 x 64 tile gets five (96 registers,
// no spill): its blocks wait on gathers too (launch_weight_grad states the gain).
template <typename T, typename Idx, int BM, int BN, int BK, int WM, int WN, int WK, int kStages, bool kExact>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * WK * 32, BM >= 128 ? 2 : (kExact && BM == 64) ? 5 : 1)
    conv_weight_grad_mma_fused(const WeightGradArgs<T, Idx> a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ PairTile s_tile;
  if (threadIdx.x < 32) {
    const bool first = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    const PairTile t = own_pair_tile(a.rel_ptr, a.num_relations, a.num_pairs, a.target_tiles, BK, blockIdx.x,
                                     first ? a.schedule : nullptr);
    if (threadIdx.x == 0) s_tile = t;
  }
  __syncthreads();
  const PairTile t = s_tile;
  if (t.valid) weight_grad_tile_of_width<T, Idx, BM, BN, BK, WM, WN, WK, kStages, kExact>(a, t, smem);
  cooperative_groups::this_grid().sync();

  // Phase 3. kParts consecutive lanes share an output quad (4 floats; per_relation is a multiple of 4:
  // 16-byte rows have an even C_out, a multiple of 4 for float), lane k summing tiles k, k + kParts,
  // ..., then a fixed butterfly: more loads in flight per quad than one lane walking all its tiles.
  constexpr int kParts = 4;
  const int lane = threadIdx.x % 32, part = lane % kParts;
  const int64_t per_relation = int64_t{a.groups} * a.cin_g * a.cout_g, quads = a.num_relations * per_relation / 4;
  const int64_t warps = int64_t{gridDim.x} * gridDim.y * gridDim.z * (blockDim.x / 32);
  const int64_t warp = ((int64_t{blockIdx.z} * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * (blockDim.x / 32) +
                       threadIdx.x / 32;
  constexpr int kQuadsPerWarp = 32 / kParts;
  for (int64_t base = warp * kQuadsPerWarp; base < quads; base += warps * kQuadsPerWarp) {  // warp-uniform
    const int64_t q = base + lane / kParts;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    int64_t r = 0, e = 0;
    if (q < quads) {
      r = q * 4 / per_relation, e = q * 4 - r * per_relation;
      const int64_t end = __ldcg(a.schedule + r + 1);
#pragma unroll 4
      for (int64_t tile = __ldcg(a.schedule + r) + part; tile < end; tile += kParts) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(a.partial + tile * per_relation + e));
        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
      }
    }
#pragma unroll
    for (int d = 1; d < kParts; d *= 2) {
      sum.x += __shfl_xor_sync(0xffffffffu, sum.x, d), sum.y += __shfl_xor_sync(0xffffffffu, sum.y, d);
      sum.z += __shfl_xor_sync(0xffffffffu, sum.z, d), sum.w += __shfl_xor_sync(0xffffffffu, sum.w, d);
    }
    if (q >= quads || part != 0) continue;
    if (a.dw_out) {
      T* o = a.dw_out + q * 4;
      o[0] = from_acc<T>(sum.x), o[1] = from_acc<T>(sum.y), o[2] = from_acc<T>(sum.z), o[3] = from_acc<T>(sum.w);
    } else {
      reinterpret_cast<float4*>(a.dw)[q] = sum;
    }
  }
}

// SIMT variant, same dataflow; thread (tm, tn) owns an interleaved TM x TN sub-tile. It serves fp64,
// and every dtype where the pipelined kernel cannot run: rows that are not 16-byte vectors (odd
// channel counts), GPUs before sm_80.
// The min-blocks hint of 2 (a 128-register budget) matters: without it ptxas settles near 80 registers
// and spills in the float instantiations.
template <typename T, typename Idx, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN), 2)
    conv_weight_grad_simt(const WeightGradArgs<T, Idx> a) {
  using Acc = acc_t<T>;
  constexpr int kThreads = (BM / TM) * (BN / TN);
  // Rows padded by one 16-byte vector: they stay 16-byte aligned for load_rows' vector stores.
  constexpr int kLdA = BM + kVecElems<T>, kLdB = BN + kVecElems<T>;
  __shared__ __align__(16) T As[BK * kLdA];
  __shared__ __align__(16) T Bs[BK * kLdB];

  const PairTile t =
      locate_tile(a.rel_ptr, a.tile_ptr, a.num_relations, a.num_pairs, a.tile_ptr[a.num_relations + 1], blockIdx.x);
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

  const int64_t block = int64_t{cin} * cout;
  Acc* dw = a.partial ? a.partial + (int64_t{blockIdx.x} * a.groups + g) * block
                      : a.dw + (t.relation * a.groups + g) * block;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + tm + i * (BM / TM);
    if (m >= cin) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int n = n0 + tn + j * (BN / TN);
      if (n >= cout) continue;
      if (a.partial) {
        dw[int64_t{m} * cout + n] = tile.acc[i][j];
      } else {
        atomicAdd(dw + int64_t{m} * cout + n, tile.acc[i][j]);
      }
    }
  }
}

// Deterministic mode's second pass: dw[r, e] = sum over the tiles of relation r, in tile order, of
// partial[tile, e] (e runs over groups x cin_g x cout_g), rounded once to T. A relation without pairs
// gets zeros.
template <typename T>
__global__ void weight_grad_reduce(const acc_t<T>* __restrict__ partial, const int64_t* __restrict__ tile_ptr,
                                   int64_t num_relations, int64_t per_relation, T* __restrict__ dw) {
  const int64_t total = num_relations * per_relation;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_relation, e = idx - r * per_relation;
    acc_t<T> sum = 0;
    for (int64_t tile = tile_ptr[r]; tile < tile_ptr[r + 1]; ++tile) sum += partial[tile * per_relation + e];
    dw[idx] = from_acc<T>(sum);
  }
}

// The atomic mode's accumulator rounded to T (`n` elements): one launch, where aten's to() costs
// several ops of host time on every backward.
template <typename T>
__global__ void round_from_acc(const acc_t<T>* __restrict__ acc, int64_t n, T* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_acc<T>(acc[i]);
  }
}

}  // namespace relconv::cuda
