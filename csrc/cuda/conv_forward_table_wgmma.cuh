// Hopper (sm_90a) variant of the output-stationary tensor-core kernel (conv_forward_table_mma): the
// same schedule, with the multiply on warpgroup MMA (wgmma) reading both operands from shared memory
// through CuTe's GMMA atoms and 128-byte swizzled layouts.
//
// Why: on wide layers the mma.sync kernel's register file (ldmatrix fragments plus accumulators)
// kept its tiles at 128 x 128, so at C_out 256 every gathered x row was loaded twice, once per
// column tile. wgmma reads both operands from shared memory: two warpgroups hold a 128 x 256 fp32
// accumulator, and one wgmma stays in flight while the next slab is waited for (measurements at the
// launcher, conv_launch_wgmma.cu).
//
// Schedule (as conv_forward_table_mma): tile row i is output order[m0 + i]; relations in chunks of
// kRelChunk, each with its rows' table entries in shared memory and the list of busy relations; a
// flat sequence of (busy relation, 64-wide C_in slab) steps through a kStages-deep cp.async
// pipeline. Step t's stage is complete (cp.async wait, async-proxy fence, barrier) before the two
// warpgroups multiply it. Preconditions (launcher): half / bfloat16, int32 table, C_in_g % 64 == 0,
// C_out_g % BN == 0, 16-byte aligned x and W rows and 4-byte aligned output pairs, x row stride
// below 2^31.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <type_traits>

#include "conv_forward_table.cuh"

namespace relconv::cuda {

template <typename T>
struct CuteElement;
template <>
struct CuteElement<__half> {
  using type = cute::half_t;
};
template <>
struct CuteElement<__nv_bfloat16> {
  using type = cute::bfloat16_t;
};

// kWeightT: the weight is stored transposed, [R, groups, cout_g, cin_g] (W[r]^T: the input
// gradient's view of the forward weight, see contiguous_weight), so the B slab is read K-major
// straight from it instead of from a transposed copy.
template <typename T, int BM, int BN, int kStages, bool kWeightT>
struct WgmmaTableConfig {
  using E = typename CuteElement<T>::type;
  static constexpr int BK = 64;  // one 128-byte swizzle row of C_in per stage
  static constexpr int kThreads = 256;  // two warpgroups, stacked along M
  static_assert(BM % 128 == 0 && BN % 64 == 0 && BN <= 256, "two 64-row warpgroups per 128 rows");
  // fp32 += E x E over 64 x BN x 16 steps; A K-major (gathered x rows), B MN-major (W[r] rows are
  // C_out-contiguous) or, for a transposed weight, K-major.
  static constexpr auto kMajorB = kWeightT ? cute::GMMA::Major::K : cute::GMMA::Major::MN;
  using Atom = decltype(cute::GMMA::ss_op_selector<E, E, float, cute::Shape<cute::_64, cute::Int<BN>, cute::Int<BK>>,
                                                   cute::GMMA::Major::K, kMajorB>());
  using TiledMma = decltype(cute::make_tiled_mma(Atom{},
                                                 cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
  using LayoutA = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<E>{},
                                               cute::make_shape(cute::Int<BM>{}, cute::Int<BK>{}, cute::Int<kStages>{})));
  using AtomB = std::conditional_t<kWeightT, cute::GMMA::Layout_K_SW128_Atom<E>, cute::GMMA::Layout_MN_SW128_Atom<E>>;
  using LayoutB = decltype(cute::tile_to_shape(AtomB{},
                                               cute::make_shape(cute::Int<BN>{}, cute::Int<BK>{}, cute::Int<kStages>{})));
  static constexpr int kBytesA = cute::cosize_v<LayoutA> * 2, kBytesB = cute::cosize_v<LayoutB> * 2;
  static constexpr int kBytesRows = BM * kRowsLd * 4, kBytesOut = BM * 8;
  // + 1024: the swizzle atoms repeat every 1024 bytes and must start on such a boundary.
  static constexpr int kBytes = kBytesA + kBytesB + kBytesRows + kBytesOut + 1024;
  static_assert(kBytesA % 1024 == 0 && kBytesB % 1024 == 0, "stages keep 1024-byte alignment");
  // Two CTAs per SM where their shared memory fits.
  static constexpr int kMinBlocks = blocks_per_sm(kBytes) >= 2 ? 2 : 1;
};

// Epilogue of both Hopper table kernels: tile row m goes to output row out_rows[m] (none if < 0),
// columns n0.. of group g, with bias and ReLU. The wgmma accumulator layout holds the column pairs
// (n, n + 1) of one row in consecutive values, so each pair is one store.
template <int BM, int BN, typename T, typename ThrMma, typename Acc>
__device__ __forceinline__ void store_wgmma_tile(const ConvTableArgs<T, int32_t>& a, const ThrMma& thr, const Acc& acc,
                                                 const int64_t* out_rows, int g, int n0) {
  using namespace cute;
  const int64_t ldo = int64_t{a.groups} * a.cout_g;
  T* out = a.out + int64_t{g} * a.cout_g + n0;
  const T* bias = a.bias ? a.bias + int64_t{g} * a.cout_g + n0 : nullptr;
  Tensor coord = thr.partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
#pragma unroll
  for (int v = 0; v < size(acc); v += 2) {
    const int m = get<0>(coord(v)), n = get<1>(coord(v));
    const int64_t o = out_rows[m];
    if (o >= 0) store_pair(out + o * ldo + n, epilogue(acc(v), bias, n, a.relu), epilogue(acc(v + 1), bias, n + 1, a.relu));
  }
}

template <typename T, int BM, int BN, int kStages, bool kWeightT>
__global__ void __launch_bounds__(256, (WgmmaTableConfig<T, BM, BN, kStages, kWeightT>::kMinBlocks)) conv_forward_table_wgmma(const ConvTableArgs<T, int32_t> a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Cfg = WgmmaTableConfig<T, BM, BN, kStages, kWeightT>;
  using E = typename Cfg::E;
  constexpr int BK = Cfg::BK, kThreads = Cfg::kThreads;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  E* smem_a = reinterpret_cast<E*>(smem);
  E* smem_b = reinterpret_cast<E*>(smem + Cfg::kBytesA);
  int32_t* s_rows = reinterpret_cast<int32_t*>(smem + Cfg::kBytesA + Cfg::kBytesB);  // [BM][rows_ld]
  const int rows_ld = table_rows_ld(a);
  int64_t* s_out = reinterpret_cast<int64_t*>(smem + Cfg::kBytesA + Cfg::kBytesB + Cfg::kBytesRows);
  __shared__ RelationChunk s_chunk;

  Tensor sA = make_tensor(make_smem_ptr(smem_a), typename Cfg::LayoutA{});  // (BM, BK, stage)
  Tensor sB = make_tensor(make_smem_ptr(smem_b), typename Cfg::LayoutB{});  // (BN, BK, stage)
  typename Cfg::TiledMma mma;
  auto thr = mma.get_thread_slice(threadIdx.x);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // smem descriptors
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor acc = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
  clear(acc);

  const int g = blockIdx.y / a.n_tiles, n0 = (blockIdx.y % a.n_tiles) * BN;
  const int cin = a.cin_g, cout = a.cout_g;
  const int64_t m0 = table_tile_row0(BM, a.split), ldx = int64_t{a.groups} * cin, goff = int64_t{g} * cin;
  const int k_steps = cin / BK;
  load_output_rows<BM>(a.order, a.num_out, m0, s_out);

  int load_stage = 0, mma_stage = 0;
  for (int64_t c0 = 0; c0 < a.num_relations; c0 += kRelChunk) {
    const int steps = load_relation_chunk<BM, kThreads>(a, s_out, m0, c0, s_rows, s_chunk) * k_steps;

    int load_j = 0, load_k = 0;
    const auto issue_next = [&] {
      const int j = s_chunk.list[load_j], k0 = load_k * BK;
      if (++load_k == k_steps) load_k = 0, ++load_j;
      const int stage = load_stage;
      load_stage = load_stage + 1 == kStages ? 0 : load_stage + 1;
      // A: BM rows x 8 16-byte chunks of the gathered x rows (zero rows where there is no neighbour).
      const T* xk = a.x + goff + k0;
      const auto ldx32 = static_cast<uint32_t>(ldx);
#pragma unroll
      for (int it = 0; it < BM * 8 / kThreads; ++it) {
        const int idx = threadIdx.x + it * kThreads, i = idx / 8, c = (idx % 8) * 8;
        const int32_t row = s_rows[i * rows_ld + j];
        const uint32_t r = row >= 0 ? static_cast<uint32_t>(row) : 0u;
        T* dst = reinterpret_cast<T*>(raw_pointer_cast(&sA(i, c, stage)));
        cp_async_16(dst, xk + static_cast<uint64_t>(r) * ldx32 + c, row >= 0);
      }
      const T* w = a.weight + ((c0 + j) * a.groups + g) * int64_t{cin} * cout;
      if constexpr (kWeightT) {
        // B: the BK x BN slab of W[c0 + j] from its transpose (rows of C_in), 8 chunks per column n.
        const T* wk = w + int64_t{n0} * cin + k0;
#pragma unroll
        for (int it = 0; it < BN * 8 / kThreads; ++it) {
          const int idx = threadIdx.x + it * kThreads, n = idx / 8, c = (idx % 8) * 8;
          T* dst = reinterpret_cast<T*>(raw_pointer_cast(&sB(n, c, stage)));
          cp_async_16(dst, wk + int64_t{n} * cin + c, true);
        }
      } else {
        // B: the BK x BN slab of W[c0 + j] (rows of C_out), as BN/8 chunks per row.
        const T* wk = w + int64_t{k0} * cout + n0;
#pragma unroll
        for (int it = 0; it < BK * (BN / 8) / kThreads; ++it) {
          const int idx = threadIdx.x + it * kThreads, k = idx / (BN / 8), c = (idx % (BN / 8)) * 8;
          T* dst = reinterpret_cast<T*>(raw_pointer_cast(&sB(c, k, stage)));
          cp_async_16(dst, wk + int64_t{k} * cout + c, true);
        }
      }
    };

    // A step's wgmma stays in flight while the next step is waited for and issued, so the loads run
    // kStages - 2 steps ahead: the stage refilled at step t was last read at step t - 2, whose wgmma
    // every warpgroup has waited for before the barrier.
    constexpr int kAhead = kStages - 2;
    static_assert(kAhead >= 1, "one stage in flight beside the two being multiplied");
#pragma unroll
    for (int t = 0; t < kAhead; ++t) {
      if (t < steps) issue_next();
      cp_async_commit();
    }
    for (int t = 0; t < steps; ++t) {
      cp_async_wait<kAhead - 1>();
      // cp.async writes through the generic proxy and wgmma reads through the async proxy.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();  // step t's stage is complete; the stage refilled next is no longer read
      if (t + kAhead < steps) issue_next();
      cp_async_commit();
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      gemm(mma, tCrA(_, _, _, mma_stage), tCrB(_, _, _, mma_stage), acc);
      warpgroup_commit_batch();
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc);
      mma_stage = mma_stage + 1 == kStages ? 0 : mma_stage + 1;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    cp_async_wait<0>();
  }
  constexpr int kAcc = decltype(size(acc))::value;
  static_assert(kAcc * kThreads * sizeof(float) <= Cfg::kBytesA + Cfg::kBytesB, "split scratch overlaps A and B");
  if (!relation_split_sum<kAcc, kThreads>(a.split, reinterpret_cast<float*>(smem), [&](int i) -> float& { return acc(i); })) {
    return;
  }

  store_wgmma_tile<BM, BN>(a, thr, acc, s_out, g, n0);
#endif
}

}  // namespace relconv::cuda
