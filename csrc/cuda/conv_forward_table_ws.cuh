// Warp-specialized, persistent form of the Hopper table kernel (conv_forward_table_wgmma.cuh): the
// same schedule and the same multiply, with the loads and the multiplies in different warps.
//
// Why: in the single-role kernel every thread both gathers and multiplies, so a step's loads are
// issued only after a block-wide barrier that also waits for the previous multiply, and each row
// tile begins with dependent table reads and ends with its stores while the tensor cores idle
// (ncu, 64-beam C256: tensor pipe 34% busy, 0.43 eligible warps per scheduler). Here producer warps
// only load: a tile's order entries, its table entries (all in flight at once, by 4-byte cp.async),
// then its steps' gathers, as far ahead as the stages allow and on into the next tile while the two
// consumer warpgroups still multiply or store the last one. Stages are handed over with mbarriers:
// `full` completes when the producers' cp.async copies of a step have landed, `empty` when both
// consumer warpgroups have retired the wgmma that read it.
//
// Why the producers are built so: producers that compute CuTe's swizzled addresses per chunk run 2x
// slower than the single-role kernel, their warps issue-bound; per-thread chunk addresses computed
// once (a row's chunks in the 128-byte swizzle move together every 8 rows), the table by cp.async
// instead of dependent loads, and two producer warpgroups where the registers allow (C_out tiles of
// 128) make it faster at C128 / C256.
//
// Persistent CTAs (one per SM; the stages take most of its shared memory) take the (row tile, column
// tile) work items, the heaviest row tiles first (table_tile_row0 explains the order), each drawing
// its next item from a global counter when it starts one: greedy longest-first. A fixed stride of the
// grid instead handed the CTA that started the heaviest tile the heaviest of every later round too:
// on the 64-beam scan's C128 table its critical path was 48 (tile, relation) steps against 32 drawn
// greedily (a mean of 30.7 per SM). Which CTA takes a tile does not change what it computes: each
// output row is still reduced by one thread in the fixed step order and stored once, and the result
// equals the single-role kernel's bit for bit. No relation split (the launcher keeps the single-role
// kernel for tables too small to fill the GPU, where the split pays).
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "conv_forward_table_wgmma.cuh"

namespace relconv::cuda {

template <typename T, int BM, int BN, int kStages, bool kWeightT>
struct WsTableConfig {
  using Mma = WgmmaTableConfig<T, BM, BN, kStages, kWeightT>;  // operand layouts and the wgmma atom
  // Two producer warpgroups where the registers allow: ptxas compiles the whole kernel within the
  // launch's per-thread share (65536 / threads), and a 64 x 256 wgmma needs more than 512 threads get.
  static constexpr int kProducerThreads = BN > 128 ? 128 : 256, kConsumerThreads = 256;
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  // setmaxnreg: the producers keep 40 registers, the consumers take the rest of the 64K (multiple of 8).
  static constexpr int kProducerRegs = 40, kConsumerRegs = (65536 - kProducerThreads * 40) / kConsumerThreads / 8 * 8;
  static_assert(BM == 128, "one or two producer threads per tile row; two consumer warpgroups of 64 rows");
  static constexpr int kLdRows = BM + 1;  // s_rows is [kRelChunk][BM + 1]: see producer_relation_chunk
  static constexpr int kBytesRows = kRelChunk * kLdRows * 4;  // the producer's table entries of one chunk
  static constexpr int kBytesOut = 2 * BM * 8;           // output rows of two tiles in flight
  static constexpr int kBytesBars = (2 * kStages + 2) * 8 + kStages * 4;  // mbarriers and step flags
  static constexpr int kBytes = Mma::kBytesA + Mma::kBytesB + kBytesRows + kBytesOut + kBytesBars + 1024;
  static_assert(kBytes <= 227 * 1024, "one CTA per SM must fit");
};

// What a stage tells the consumers besides its data (s_flag).
constexpr int kStepLast = 1;  // the tile's last step: store the tile after it
constexpr int kStepNoop = 2;  // no data (a tile none of whose rows has a neighbour)
constexpr int kStepExit = 4;  // no data and no more tiles: the consumers stop

// The producer warpgroups' own barrier (named barrier 1 over the first kThreads threads; 0 is
// __syncthreads).
template <int kThreads>
struct ProducerSync {
  __device__ __forceinline__ void operator()() const { asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory"); }
};

// Own asm rather than CUTLASS's ClusterBarrier::arrive: that has no memory clobber, and these
// arrivals release plain shared-memory writes (s_out, s_flag) to the waiting warps.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar)))
               : "memory");
}

// Arrives on `bar` when this thread's cp.async copies issued so far have completed (the pending count
// is raised now and lowered then, so the phase cannot complete before they land).
__device__ __forceinline__ void mbar_arrive_on_copies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(bar)))
               : "memory");
}

// The producer's form of load_relation_chunk: s_rows[j * (BM + 1) + i] = the input row feeding tile
// row i through relation c0 + j (or -1), the chunk's busy relations in `chunk`; returns their count.
// The BM x kRelChunk table entries come by 4-byte cp.async, all in flight at once, so that a row
// tile's table costs one memory round trip instead of one per few entries; each thread then checks
// the entries it copied. Lane j of every warp copies relation c0 + j (a warp reads 32 consecutive
// entries of one row). Relation-major with a padded row, s_rows takes a warp's 32 relations of one
// row and, in the steps, 32 rows of one relation without bank conflicts. The wait for the entries
// also waits for the thread's stage copies still in flight, which the consumers need anyway.
// kByPosition (a table in its order's row sequence, rows_sorted): tile row i reads table row
// tile_m0 + i instead of its output row's.
template <int BM, int kThreads, bool kByPosition, typename T>
__device__ __forceinline__ int producer_relation_chunk(const ConvTableArgs<T, int32_t>& a, const int64_t* out_rows,
                                                       const int64_t* tile_m0, int64_t c0, int32_t* s_rows,
                                                       RelationChunk& chunk) {
  static_assert(kRelChunk == 32, "one lane per relation of the chunk");
  constexpr int kPasses = BM * kRelChunk / kThreads, kWarps = kThreads / 32, kLd = BM + 1;
  const int width = static_cast<int>(min(int64_t{kRelChunk}, a.num_relations - c0));
  const int lane = threadIdx.x % 32, row0 = threadIdx.x / 32;
  ProducerSync<kThreads>{}();  // the previous chunk's steps are issued: s_rows and `chunk` may be rewritten
  if (threadIdx.x == 0) chunk.busy = 0;
#pragma unroll
  for (int it = 0; it < kPasses; ++it) {
    const int i = row0 + kWarps * it;
    const int64_t o = out_rows[i];
    const bool in = o >= 0 && lane < width;
    const int64_t row = kByPosition ? *tile_m0 + i : o;
    const int32_t* src = in ? a.table + row * a.num_relations + c0 + lane : a.table;
    cp_async_small<4>(s_rows + lane * kLd + i, src, in);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  bool used = false;
#pragma unroll
  for (int it = 0; it < kPasses; ++it) {
    const int i = row0 + kWarps * it;
    int32_t& v = s_rows[lane * kLd + i];
    const bool in = out_rows[i] >= 0 && lane < width && v >= 0 && v < a.num_in;
    if (!in) v = -1;
    used |= in;
  }
  ProducerSync<kThreads>{}();  // chunk.busy is zeroed
  const unsigned busy = __ballot_sync(0xffffffffu, used);
  if (lane == 0 && busy) atomicOr(&chunk.busy, busy);
  ProducerSync<kThreads>{}();
  if (threadIdx.x < 32) {
    const bool mine = chunk.busy >> threadIdx.x & 1u;
    if (mine) chunk.list[__popc(chunk.busy & ((1u << threadIdx.x) - 1u))] = threadIdx.x;
    if (threadIdx.x == 0) chunk.count = __popc(chunk.busy);
  }
  ProducerSync<kThreads>{}();
  return chunk.count;
}

// kByPosition: a.rows_sorted with an order (producer_relation_chunk). A template argument rather
// than a test per table entry: the test alone took the 128 x 256 kernel's producers past their 40
// registers (spills), and MinkUNet 1.0's 128 x 256 layers from 589 to 687 us even without them
// (H200, batch4-64beam fp16). The kByPosition kernel itself is 10-17% slower than the other on
// the same sorted table (cached C128 / C256 fp16 forwards, batch4-64beam and aggregate-1m), so
// relconv.ops.prepare gives it no copies in order (planning.persistent_table_kernel).
template <typename T, int BM, int BN, int kStages, bool kWeightT, bool kByPosition>
__global__ void __launch_bounds__((WsTableConfig<T, BM, BN, kStages, kWeightT>::kThreads), 1) conv_forward_table_ws(const ConvTableArgs<T, int32_t> a, int64_t num_work, int* work_counter) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Cfg = WsTableConfig<T, BM, BN, kStages, kWeightT>;
  using Mma = typename Cfg::Mma;
  using E = typename Mma::E;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int BK = Mma::BK;
  extern __shared__ unsigned char smem_raw[];
  // Aligned by an offset into the shared array (not by pointer bits), so that accesses through these
  // pointers stay shared-memory instructions instead of generic ones.
  unsigned char* smem = smem_raw + ((1024 - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  E* smem_a = reinterpret_cast<E*>(smem);
  E* smem_b = reinterpret_cast<E*>(smem + Mma::kBytesA);
  unsigned char* tail = smem + Mma::kBytesA + Mma::kBytesB;
  int32_t* s_rows = reinterpret_cast<int32_t*>(tail);                      // [kRelChunk][BM + 1]
  int64_t* s_out = reinterpret_cast<int64_t*>(tail + Cfg::kBytesRows);     // [2][BM]
  uint64_t* full = reinterpret_cast<uint64_t*>(tail + Cfg::kBytesRows + Cfg::kBytesOut);
  uint64_t* empty = full + kStages;
  uint64_t* tile_free = empty + kStages;                                   // [2]: s_out slot reusable
  int* s_flag = reinterpret_cast<int*>(tile_free + 2);                     // [kStages]
  __shared__ RelationChunk s_chunk;
  __shared__ int64_t s_work[2];  // work item of the tile in each s_out slot (for the consumers)
  __shared__ int64_t s_next;     // the producers' next work item, drawn when a tile starts
  // The producers' current tile's first row, for kByPosition's table reads: read from shared
  // memory there, since a register holding it through the tile's steps makes the producers spill.
  __shared__ int64_t s_m0;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(full + s, Cfg::kProducerThreads);
      Barrier::init(empty + s, Cfg::kConsumerThreads);
    }
    Barrier::init(tile_free, Cfg::kConsumerThreads);
    Barrier::init(tile_free + 1, Cfg::kConsumerThreads);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int n_cols = a.n_tiles * a.groups;
  // Group and first output column of work item w: the producers load its tile, the consumers store it.
  struct WorkCols {
    int g, n0;
  };
  const auto work_cols = [&](int64_t w) {
    const int col = static_cast<int>(w % n_cols);
    return WorkCols{col / a.n_tiles, col % a.n_tiles * BN};
  };
  const int64_t row_tiles = (a.num_out + BM - 1) / BM;
  const int cin = a.cin_g, cout = a.cout_g, k_steps = cin / BK;
  const int64_t ldx = int64_t{a.groups} * cin;
  Tensor sA = make_tensor(make_smem_ptr(smem_a), typename Mma::LayoutA{});  // (BM, BK, stage)
  Tensor sB = make_tensor(make_smem_ptr(smem_b), typename Mma::LayoutB{});  // (BN, BK, stage)

  if (threadIdx.x < Cfg::kProducerThreads) {
    // Producers: lane pairs gather the tile rows (see A below); the weight slab and the table reads
    // spread over all producer threads.
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    constexpr int kThreadsP = Cfg::kProducerThreads;
    int stage = 0;
    uint32_t phase = 0;
    int64_t used = 0;  // tiles started, for the s_out slot
    // Shared-memory addresses of this thread's 16-byte chunks in stage 0 (the stages are one
    // constant apart), at the swizzled places CuTe's layout gives. In the 128-byte swizzle a row's
    // chunks are permuted by the row's index mod 8, so chunks 8 rows apart sit at one fixed distance.
    // A: a lane pair takes x rows a_row0 + kRowStrideA * i, lane a_sub of the pair the row's chunks
    // a_sub + 2q, so that each copy instruction reads whole 32-byte sectors: with one thread per row
    // (or per half row) taking consecutive chunks, every sector was read from L2 twice (ncu: 30% of
    // the kernel's sectors in excess, L2 68% busy). Pairs rather than eight lanes per row, which also
    // read whole sectors, for one table entry read per thread and row instead of one per chunk
    // (queued us: 64-beam C128 68 -> 66, C256 176 -> 152; real scan C256 133 -> 109).
    // B: rows b_row0 + kRowsB * it (rows of BN chunks; kWeightT: of BK), at one column: one address
    // per residue class of rows (kClassesB, 2 where a pass covers 4 rows), then constant steps.
    const auto saddr = [](auto& t, int r, int c) {
      return static_cast<uint32_t>(__cvta_generic_to_shared(raw_pointer_cast(&t(r, c, 0))));
    };
    constexpr int kLanesA = 2, kRowStrideA = kThreadsP / kLanesA, kRowsA = BM / kRowStrideA, kChunksA = BK / 8 / kLanesA;
    static_assert(kRowStrideA % 8 == 0 && kRowsA >= 1, "a thread's A rows must share the swizzle");
    const int a_row0 = threadIdx.x / kLanesA, a_sub = threadIdx.x % kLanesA;
    uint32_t a_dst0[kChunksA];
#pragma unroll
    for (int q = 0; q < kChunksA; ++q) a_dst0[q] = saddr(sA, a_row0, (a_sub + q * kLanesA) * 8);
    const uint32_t a_row_step = kRowsA > 1 ? saddr(sA, a_row0 + kRowStrideA, a_sub * 8) - a_dst0[0] : 0;
    // The stage is the layouts' outermost mode: stages lie a whole BM x BK (BN x BK) tile apart.
    constexpr uint32_t a_stage = BM * BK * sizeof(T), b_stage = BN * BK * sizeof(T);
    constexpr int kRowChunksB = (kWeightT ? BK : BN) / 8, kRowsB = kThreadsP / kRowChunksB;
    constexpr int kChunksB = BN * BK / 8 / kThreadsP, kClassesB = kRowsB >= 8 ? 1 : 8 / kRowsB;
    static_assert(kRowsB % 8 == 0 || 8 % kRowsB == 0, "B rows per pass must tile the swizzle period");
    const int b_row0 = threadIdx.x / kRowChunksB, b_col = threadIdx.x % kRowChunksB * 8;
    const auto b_at = [&](int row) { return kWeightT ? saddr(sB, row, b_col) : saddr(sB, b_col, row); };
    uint32_t b_dst0[kClassesB];
#pragma unroll
    for (int p = 0; p < kClassesB; ++p) b_dst0[p] = b_at(b_row0 + p * kRowsB);
    const uint32_t b_step = b_at(b_row0 + kClassesB * kRowsB) - b_dst0[0];
    // The first item is the CTA's index; the later ones are drawn from work_counter[0] (draws so far).
    for (int64_t w = blockIdx.x; w < num_work; ++used) {
      const int slot = static_cast<int>(used & 1);
      const WorkCols cols = work_cols(w);
      const int g = cols.g, n0 = cols.n0;
      const int64_t m0 = (row_tiles - 1 - w / n_cols) * BM;
      // The slot's previous tile (two back) has been stored: parity of that use, which the first two
      // uses pass at once (the phase before the first counts as complete).
      Barrier::wait(tile_free + slot, static_cast<uint32_t>(((used >> 1) & 1) ^ 1));
      int64_t* out_rows = s_out + slot * BM;
      if (threadIdx.x < BM) out_rows[threadIdx.x] = table_output_row(a.order, a.num_out, m0 + threadIdx.x);
      if (threadIdx.x == 0) {
        s_work[slot] = w;
        if constexpr (kByPosition) s_m0 = m0;
        s_next = gridDim.x + atomicAdd(work_counter, 1);  // drawn now, so that it is there by the tile's end
      }
      ProducerSync<Cfg::kProducerThreads>{}();
      // Read here: thread 0 writes s_next again only after the tile's later producer barriers.
      const int64_t next = s_next;
      const T* xg = a.x + int64_t{g} * cin;
      const auto ldx32 = static_cast<uint32_t>(ldx);
      bool published_last = false;
      const auto publish = [&](int flag) {
        if (threadIdx.x == 0) s_flag[stage] = flag;
        mbar_arrive_on_copies(full + stage);
        mbar_arrive(full + stage);  // releases this thread's shared-memory writes (s_out, s_flag)
        if (++stage == kStages) stage = 0, phase ^= 1;
        published_last = flag & kStepLast;
      };
      for (int64_t c0 = 0; c0 < a.num_relations; c0 += kRelChunk) {
        const int busy = producer_relation_chunk<BM, kThreadsP, kByPosition>(a, out_rows, &s_m0, c0, s_rows, s_chunk);
        const bool last_chunk = c0 + kRelChunk >= a.num_relations;
        for (int jj = 0; jj < busy; ++jj) {
          const int j = s_chunk.list[jj];
          const T* w_rel = a.weight + ((c0 + j) * a.groups + g) * int64_t{cin} * cout;
          for (int kk = 0; kk < k_steps; ++kk) {
            const int k0 = kk * BK;
            Barrier::wait(empty + stage, phase ^ 1);  // the consumers are done with this stage
            // A: this thread's chunk of kRowsA gathered x rows (zeros where there is no neighbour).
#pragma unroll
            for (int i = 0; i < kRowsA; ++i) {
              const int32_t row = s_rows[j * Cfg::kLdRows + a_row0 + i * kRowStrideA];
              const T* src = xg + k0 + static_cast<uint64_t>(row >= 0 ? row : 0) * ldx32 + a_sub * 8;
#pragma unroll
              for (int q = 0; q < kChunksA; ++q) {
                cp_async_16_shared(a_dst0[q] + stage * a_stage + i * a_row_step, src + q * kLanesA * 8, row >= 0);
              }
            }
            // B: the BK x BN slab of W[c0 + j], from rows of C_out (B rows = k) or, stored transposed,
            // from rows of C_in (B rows = n).
            const int64_t w_ld = kWeightT ? cin : cout;
            const T* wk = kWeightT ? w_rel + int64_t{n0 + b_row0} * cin + k0 + b_col
                                   : w_rel + int64_t{k0 + b_row0} * cout + n0 + b_col;
#pragma unroll
            for (int it = 0; it < kChunksB; ++it) {
              const uint32_t dst = b_dst0[it % kClassesB] + stage * b_stage + it / kClassesB * b_step;
              cp_async_16_shared(dst, wk + int64_t{it * kRowsB} * w_ld, true);
            }
            publish(last_chunk && jj + 1 == busy && kk + 1 == k_steps ? kStepLast : 0);
          }
        }
      }
      // A tile without a single neighbour (or whose last chunk had none) still needs its last step.
      if (!published_last) {
        Barrier::wait(empty + stage, phase ^ 1);
        publish(kStepLast | kStepNoop);
      }
      w = next;
    }
    Barrier::wait(empty + stage, phase ^ 1);
    if (threadIdx.x == 0) s_flag[stage] = kStepExit;
    mbar_arrive(full + stage);
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives the thread that issued it
    // The CTA draws no more. The last one to get here leaves both counters zero for the next launch
    // on this stream (work_counter[1] counts the CTAs done drawing; the fence orders this CTA's last
    // draw before its count).
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(work_counter + 1, 1) == static_cast<int>(gridDim.x) - 1) {
        work_counter[0] = 0;
        work_counter[1] = 0;
      }
    }
    return;
  }

  // Consumers: two warpgroups of 64 rows each over the tile's BM x BN accumulator.
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
  const int ct = threadIdx.x - Cfg::kProducerThreads;
  typename Mma::TiledMma mma;
  auto thr = mma.get_thread_slice(ct);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // smem descriptors
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor acc = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t used = 0;; ++used) {
    const int slot = static_cast<int>(used & 1);
    clear(acc);
    int held = -1;  // the stage whose wgmma may still be in flight
    for (;;) {
      Barrier::wait(full + stage, phase);
      const int flag = s_flag[stage];
      if (flag & kStepExit) return;  // first step of a tile: no wgmma in flight
      if (!(flag & kStepNoop)) {
        // cp.async wrote the stage through the generic proxy; wgmma reads it through the async one.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        warpgroup_fence_operand(acc);
        warpgroup_arrive();
        gemm(mma, tCrA(_, _, _, stage), tCrB(_, _, _, stage), acc);
        warpgroup_commit_batch();
        warpgroup_wait<1>();  // the previous step's wgmma has read its stage
        warpgroup_fence_operand(acc);
        if (held >= 0) mbar_arrive(empty + held);
        held = stage;
      } else {
        mbar_arrive(empty + stage);
      }
      if (++stage == kStages) stage = 0, phase ^= 1;
      if (flag & kStepLast) break;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    if (held >= 0) mbar_arrive(empty + held);

    const int64_t w = s_work[slot];  // written before the tile's first step was published
    const WorkCols cols = work_cols(w);
    store_wgmma_tile<BM, BN>(a, thr, acc, s_out + slot * BM, cols.g, cols.n0);
    mbar_arrive(tile_free + slot);
  }
#endif
}

}  // namespace relconv::cuda
