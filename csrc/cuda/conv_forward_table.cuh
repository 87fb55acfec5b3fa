#pragma once
// Forward relational convolution, output-stationary implicit GEMM over a neighbour table:
//   out[o, g-block] = sum over r of x[table[o, r], g-block] @ W[r, g]      (table[o, r] = -1: no term)
//
// Used for maps with at most one input per (output, relation) slot (voxel maps), where the table
// describes exactly the map's pairs. Grid: x = tiles of BM consecutive output rows, y = group * n_tiles
// + the BN-wide output-channel tile. A block walks K = (relation r, BK-wide C_in chunk): it gathers
// the BM rows x[table[o, r]] (zero rows where there is no neighbour) as the A tile and the BK x BN
// slab of W[r, g] as the B tile, and accumulates in registers. Every output element is therefore
// reduced by exactly one thread in a fixed order and written once with a plain store in the output
// dtype: no atomics, no zero-filled accumulation buffer, no cast pass, bitwise deterministic.
//
// Relations in which no row of the tile has a neighbour are skipped: in strided / transposed maps
// most (output, relation) slots are empty, and on a submanifold map of a surface a sorted tile
// (table_order) typically touches a third of the relations.
#include <cooperative_groups.h>

#include <cstdint>

#include "numeric.cuh"
#include "tile_load.cuh"
#include "tile_mma.cuh"

namespace relconv::cuda {

template <typename T, typename Idx>
struct ConvTableArgs {
  const T* x;          // [num_in, groups * cin_g]
  const T* weight;     // [R, groups, cin_g, cout_g] contiguous, or stored [R, groups, cout_g, cin_g] (weight_t)
  const Idx* table;    // [num_out, R], contiguous; input row or -1
  const Idx* order;    // [num_out] processing order of the outputs (table_order), or nullptr
  const T* bias;       // [groups * cout_g] added in the epilogue, or nullptr
  T* out;              // [num_out, groups * cout_g], fully overwritten
  int64_t num_in, num_out, num_relations;
  int groups, cin_g, cout_g, n_tiles;
  bool vec_x, vec_w;   // 16-byte (and cp.async) loads allowed for x rows / W rows (see load_rows)
  // `weight` holds W^T's storage (the input gradient's W[r]^T view, read in place; see
  // stored_transposed): only the kernels made for it read it, and a launcher that has none for the
  // shape returns false.
  bool weight_t;
  bool vec_out2;       // two-element (4-byte) stores allowed for output rows
  bool relu;           // max(0, .) after the bias, in the epilogue
  bool x_chunks;       // x rows start on C_in_g-element boundaries (relation packing's cp.async)
  // The table's rows are in `order`'s sequence (row m serves output order[m], as relational_conv's
  // sorted_tables says): tile row i reads table row m0 + i with or without an order.
  bool rows_sorted = false;
  int split = 1;       // CTAs per row tile, one cluster (relation_split_sum); sm_90+ only past 1
  int pack = 1;        // relations per K step of the general mma.sync kernel (C_in_g * pack = BK)
};

// The fused epilogue of output column c (group offset excluded: `bias` points at the group's
// block): bias, then ReLU, applied to the accumulator before its one rounding to T, so a folded
// Conv-BN-ReLU layer costs no extra pass over the output.
template <typename T>
__device__ __forceinline__ acc_t<T> epilogue(acc_t<T> v, const T* bias, int c, bool relu) {
  if (bias) v += to_acc(bias[c]);
  return relu ? max(v, acc_t<T>(0)) : v;
}

// Output row processed as tile row m (table_order, see the tensor-core kernel), or -1 past num_out or
// for an order entry out of range.
template <typename Idx>
__device__ __forceinline__ int64_t table_output_row(const Idx* order, int64_t num_out, int64_t m) {
  if (m >= num_out) return -1;
  const int64_t o = order ? static_cast<int64_t>(__ldg(order + m)) : m;
  return o >= 0 && o < num_out ? o : -1;
}

// First tile row of this block's row tile. Blocks take the row tiles from the last one back:
// table_order puts the rows that use the most relations last, and the hardware dispatches blocks
// in about index order, so the longest tiles start first and the short ones fill the tail (longest
// processing time first). On the subm 3^3 table of the 64-beam scan, 128-row tiles span 1 to 26
// relations; scheduling them greedily on 132 SMs gives a makespan of 51 relation steps in the
// order's sequence, 36 from its end (35 is the even split). Measured on an H100, cached subm 3^3 fp16
// (kernel us, first tile first -> last tile first): 64-beam scan C32 29 -> 24, C64 50 -> 41, C128
// 122 -> 103, C256 281 -> 214; small-gicp real scan C128 55 -> 43, C256 160 -> 130.
// With a relation split the `split` CTAs of one row tile are consecutive in x (one cluster).
__device__ __forceinline__ int64_t table_tile_row0(int BM, int split) {
  return int64_t{(gridDim.x - 1 - blockIdx.x) / split} * BM;
}

// Relation split: when a table has too few row tiles to fill the GPU, and above all when its
// heaviest tiles (rows using most relations, all in the same few tiles) set the kernel's length,
// `split` CTAs of a cluster share one row tile, rank q taking the busy relations r = q mod split.
// Each sums its share over the whole K range; rank 0 then adds the others' sums, read from their
// shared memory (distributed shared memory of the cluster), in rank order. A row's result thus
// depends on the split but not on which rows share its tile: bitwise deterministic and independent
// of table_order, like the unsplit kernel. No atomics, no workspace in global memory.
// Measured on an H100 (kernel us, cached subm 3^3 fp16, split 1 / 2 / 4; relation_split picks):
//   64-beam scan 75k rows:         C64 43 / 67 / 133,  C128 104 / 179 / 388   (1)
//   its coordinates / 4, 17k rows: C64 23 / 23 / 38,   C256 126 / 90 / 155    (2)
//   real scan / 4, 8k rows:        C64 19 / 17 / 22,   C128 44 / 30 / 50      (2)
//   64-beam scan / 16, 2.6k rows:  C64 19 / 15 / 14,   C128 43 / 29 / 24, C256 124 / 74 / 51 (4 at C128+)
//
// Block-wide, after the main loop: `scratch` is the CTA's shared memory, free by now (the pipeline
// stages), room for kAcc * kThreads floats; `acc(i)` this thread's i-th accumulator, laid out the
// same in every CTA of the cluster. Returns whether this CTA holds the tile's sum (rank 0).
template <int kAcc, int kThreads, typename Acc>
__device__ __forceinline__ bool relation_split_sum(int split, float* scratch, Acc&& acc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (split == 1) return true;
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  __syncthreads();  // every warp is done reading the stages that `scratch` overlaps
  if (rank != 0) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) scratch[i * kThreads + threadIdx.x] = acc(i);
  }
  cluster.sync();  // the partial sums are written and visible to the cluster
  if (rank == 0) {
    for (int q = 1; q < split; ++q) {
      const float* other = cluster.map_shared_rank(scratch, q);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc(i) += other[i * kThreads + threadIdx.x];
    }
  }
  cluster.sync();  // the other CTAs keep their shared memory until rank 0 has read it
  return rank == 0;
#else
  return true;  // launchers split only on sm_90+
#endif
}

// This CTA's rank within its row tile's cluster (0 without a split).
__device__ __forceinline__ int relation_split_rank(int split) { return static_cast<int>(blockIdx.x % split); }

// Output row of each of the block's BM tile rows, read once into shared memory (block-wide; ends in
// a barrier): the order and table reads are the only dependent global loads of a block, and issuing
// them all before using any keeps them to one round trip.
template <int BM, typename Idx>
__device__ __forceinline__ void load_output_rows(const Idx* order, int64_t num_out, int64_t m0, int64_t* s_out) {
  for (int i = threadIdx.x; i < BM; i += blockDim.x) s_out[i] = table_output_row(order, num_out, m0 + i);
  __syncthreads();
}

// Column r of the block's BM x R slice of the table, as x element offsets in shared memory.
template <int BM, typename Idx>
struct TableColumn {
  const Idx* table;
  const int64_t* s_out;  // load_output_rows
  int64_t num_in, num_relations, ldx, group_offset;
  int64_t m0;        // the tile's first row
  bool by_position;  // table_by_position

  // Block-wide (every thread must call it: it ends in a barrier). Sets s_in[i] to the offset of the
  // group block of the x row feeding tile row i's output through relation r, or -1 (no neighbour, an
  // entry out of range, a row past num_out). Returns whether any row of the tile has a neighbour.
  __device__ __forceinline__ bool load(int64_t r, int64_t* s_in) const {
    int any = 0;
    for (int i = threadIdx.x; i < BM; i += blockDim.x) {
      const int64_t o = s_out[i];
      int64_t off = -1;
      if (o >= 0) {
        const int64_t row = __ldg(table + (by_position ? m0 + i : o) * num_relations + r);
        if (row >= 0 && row < num_in) off = row * ldx + group_offset;
      }
      s_in[i] = off;
      any |= off >= 0;
    }
    return __syncthreads_or(any) != 0;
  }

  // First relation >= r with a neighbour in the tile, or num_relations. Block-wide like load().
  __device__ __forceinline__ int64_t next(int64_t r, int64_t* s_in) const {
    while (r < num_relations && !load(r, s_in)) ++r;
    return r;
  }
};

// Tensor-core variant (sm_80+), a multistage implicit GEMM: half / bfloat16, and float in TF32 mode
// (operands rounded to TF32, fp32 accumulation; the launcher takes it only when TF32 is allowed).
//
// Rows: tile row i is output order[m0 + i] (table_order: relconv sorts outputs by their occupied
// relations, so the rows of a tile share relations and fewer (tile, relation) blocks are computed for
// rows that have no neighbour there; without an order, output m0 + i).
// Relations are taken in chunks of kRelChunk: the block reads its rows' table entries for the chunk
// into shared memory once, with the set of relations any row uses, then runs a flat sequence of
// steps (busy relation, BK-wide C_in chunk). kStages shared-memory stages of A [BM][BK+pad] (gathered
// x rows, zero rows where there is no neighbour; pad = 16 bytes) and B [BK][BN+8] (W[r] slab) form a cp.async
// pipeline: step t + kStages - 1 is in flight while step t is multiplied, one barrier per step.
// kFull (C_in_g a multiple of BK, C_out_g of BN, 16-byte rows: every tile row wholly in or out) loads
// with FixedChunkLoader; otherwise load_rows_async handles partial tiles, and rows that do not meet
// the 16-byte preconditions are loaded synchronously into the stage. With a.pack > 1 (C_in_g of 4, 8,
// 16 or 32 bytes: the stems' 1-8 input channels, C16 in 16-bit types) a step holds a.pack relations
// in slots of BK / a.pack elements, each tile row's C_in_g elements of one relation in one or two
// cp.asyncs, and the matching C_in_g rows of each W[r] below one another: K steps a.pack times as
// full as one zero-padded relation. Tensor cores take 16-byte slots, one mma each (kSlices16B), or
// 32-byte slots, one whole mma K block each: relations sharing a step are added one by one, so the
// sum does not depend on which tile rows, and so which busy relations, share the step (the output
// is the same with and without table_order); SIMT FMAs add in K order anyway and take slots of C_in_g.
// Warps form a (BM/WM) x (BN/WN) grid of mma.sync tiles (MmaWarpTile); the epilogue stores pairs of
// output elements straight from the accumulators.
constexpr int kRelChunk = 32;

// The relations of one chunk a block works on (shared memory; load_relation_chunk).
struct RelationChunk {
  unsigned busy;         // bit j: some tile row has a neighbour through relation c0 + j
  int list[kRelChunk];   // those relations (offsets from c0), ascending
  int count;
};

// s_rows rows hold kRelChunk entries padded to kRowsLd: the gathers read one relation of four
// consecutive tile rows per warp instruction (eight lanes a row), which a row stride of 32 entries
// put in one bank (ncu, 3.5M-row C64 layer: 3.6-way conflicts on 16% of the shared loads).
constexpr int kRowsLd = kRelChunk + 1;

// Whether the table's rows follow the processing order (no order, or rows_sorted), so that tile row
// i of the tile from m0 reads table row m0 + i rather than its output row's.
template <typename T, typename Idx>
__device__ __forceinline__ bool table_by_position(const ConvTableArgs<T, Idx>& a) {
  return a.order == nullptr || a.rows_sorted;
}

// Table row of tile row i of the tile from m0 whose output row is o (>= 0).
template <typename T, typename Idx>
__device__ __forceinline__ int64_t table_row(const ConvTableArgs<T, Idx>& a, int64_t m0, int i, int64_t o) {
  return table_by_position(a) ? m0 + i : o;
}

// A table whose tile rows are its rows m0.. (no order, or rows_sorted) with an odd number of
// relations up to kRelChunk is read as one block: a tile's entries are rows * R consecutive
// int32s, 16-byte aligned (BM and m0 are multiples of 4), copied by 16-byte cp.async with no
// per-entry index arithmetic and no wait on the output rows. s_rows then keeps the table's own row
// stride R, which is odd and so puts any 32 consecutive rows of one relation in distinct banks.
// Against the read through the order (Nsight Compute, batch4-64beam C16: 9 of 25M instructions),
// H200, cached subm 3^3 fp16 forward of a reused map, kernel us, batch4-64beam / room-3cm /
// aggregate-1m: C16 53.8 -> 50.3 / 99.3 -> 96.2 / 286.3 -> 279.5, C64 93.0 -> 88.2 / 201.0 -> 193.5 /
// 505.6 -> 483.2.
template <typename T, typename Idx>
__device__ __forceinline__ bool table_as_block(const ConvTableArgs<T, Idx>& a) {
  return sizeof(Idx) == sizeof(int32_t) && table_by_position(a) && a.num_relations <= kRelChunk &&
         (a.num_relations & 1) != 0 && (reinterpret_cast<uintptr_t>(a.table) & 15) == 0;
}

// Row stride of s_rows (load_relation_chunk).
template <typename T, typename Idx>
__device__ __forceinline__ int table_rows_ld(const ConvTableArgs<T, Idx>& a) {
  return table_as_block(a) ? static_cast<int>(a.num_relations) : kRowsLd;
}

// table_as_block's read (load_relation_chunk): copies the tile's entries as 16-byte chunks, each
// thread then checking the chunks it copied (entry 4c + q is relation (4c + q) mod R); returns this
// thread's busy bits.
template <int BM, int kThreads, typename T>
__device__ __forceinline__ unsigned load_table_block(const ConvTableArgs<T, int32_t>& a, int64_t m0, int32_t* s_rows) {
  unsigned busy = 0;
  const int R = static_cast<int>(a.num_relations);
  const int n = static_cast<int>(min(int64_t{BM}, a.num_out - m0)) * R, n16 = n / 4;
  const int32_t* src = a.table + m0 * R;
  const auto bound = static_cast<uint32_t>(min(a.num_in, int64_t{1} << 31));
  for (int c = threadIdx.x; c < n16; c += kThreads) cp_async_16(s_rows + 4 * c, src + 4 * c, true);
  cp_async_commit();
  cp_async_wait<0>();
  const int j_step = (4 * kThreads) % R;
  int j0 = (4 * static_cast<int>(threadIdx.x)) % R;
  for (int c = threadIdx.x; c < n16; c += kThreads) {
    int4 v = *reinterpret_cast<const int4*>(s_rows + 4 * c);
    int* e = &v.x;
    int j = j0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (static_cast<uint32_t>(e[q]) < bound) {
        busy |= 1u << j;
      } else {
        e[q] = -1;
      }
      j = j + 1 == R ? 0 : j + 1;
    }
    *reinterpret_cast<int4*>(s_rows + 4 * c) = v;
    j0 += j_step;
    if (j0 >= R) j0 -= R;
  }
  // The last rows' partial chunk, and the rows past num_out of the last tile.
  for (int i = 4 * n16 + threadIdx.x; i < BM * R; i += kThreads) {
    const int32_t v = i < n ? __ldg(src + i) : -1;
    const bool in = static_cast<uint32_t>(v) < bound;
    s_rows[i] = in ? v : -1;
    if (in) busy |= 1u << (i % R);
  }
  return busy;
}

// Block-wide, ends in a barrier: s_rows[i * table_rows_ld(a) + j] = the input row feeding tile row
// i's output through relation c0 + j (or -1), and this CTA's share of the chunk's busy relations in
// `chunk` (those congruent to its rank modulo the split; all of them without one); returns their count.
// Otherwise entry idx = i * kRelChunk + j: a warp reads consecutive relations of one row. int32 tables
// come by 4-byte cp.async, every entry in flight at once, and each thread then checks the entries it
// copied: a tile's table costs one memory round trip, where loads into registers cost one per few
// entries a thread. The leading barrier keeps the previous chunk's last step reading s_rows before
// they are overwritten.
template <int BM, int kThreads, typename T, typename Idx>
__device__ __forceinline__ int load_relation_chunk(const ConvTableArgs<T, Idx>& a, const int64_t* s_out, int64_t m0,
                                                   int64_t c0, int32_t* s_rows, RelationChunk& chunk) {
  // Entries per thread; with 6 or 12 warps (the 96-wide tiles) the last round is partial.
  constexpr int kEntries = BM * kRelChunk, kPerThread = (kEntries + kThreads - 1) / kThreads;
  const int width = static_cast<int>(min(int64_t{kRelChunk}, a.num_relations - c0));
  if (threadIdx.x == 0) chunk.busy = 0;
  __syncthreads();
  unsigned busy = 0;
  if (table_as_block(a)) {
    if constexpr (sizeof(Idx) == sizeof(int32_t)) busy = load_table_block<BM, kThreads>(a, m0, s_rows);
  } else if constexpr (sizeof(Idx) == sizeof(int32_t)) {
    // Thread t copies relation j = t % kRelChunk of tile rows t / kRelChunk + it * kRowStep: one table
    // column pointer per thread, and an empty slot (no output row, or past the chunk's width) stored
    // as -1 rather than copied, so the check is one unsigned compare per entry (an entry is valid iff
    // it lies in [0, min(num_in, 2^31))) and the thread's busy bit is bit j alone. Per-entry index
    // arithmetic here was most of a C16 layer's instructions (ncu, batch4-64beam: 27 of 39 M); H200,
    // cached subm 3^3 fp16 forward, kernel us, batch4-64beam / room-3cm / aggregate-1m: C16 77 -> 58
    // / 119 -> 102 / 328 -> 294, C8 -> 16 71 -> 52 / 96 -> 78 / 262 -> 211, C64 105 -> 93 / 212 ->
    // 201 / 539 -> 506.
    static_assert(kThreads % kRelChunk == 0, "a thread keeps one relation of the chunk");
    constexpr int kRowStep = kThreads / kRelChunk;
    const int j = static_cast<int>(threadIdx.x) % kRelChunk, i0 = static_cast<int>(threadIdx.x) / kRelChunk;
    const int32_t* column = a.table + c0 + j;
    const auto relations = static_cast<uint32_t>(a.num_relations);
    const bool in_chunk = j < width;
    // Partly unrolled: wholly unrolled, the loops took the 128 x 64 mma.sync kernel from 73 to 122
    // registers (a block less per SM); not unrolled, the checks' dependent shared loads run one by one.
#pragma unroll 4
    for (int it = 0; it < kPerThread; ++it) {
      const int i = i0 + it * kRowStep;
      if (kEntries % kThreads != 0 && i >= BM) break;
      const int64_t o = in_chunk ? s_out[i] : -1;
      int32_t* dst = s_rows + i * kRowsLd + j;
      if (o >= 0) {
        cp_async_small<4>(dst, column + static_cast<uint64_t>(table_row(a, m0, i, o)) * relations, true);
      } else {
        *dst = -1;
      }
    }
    cp_async_commit();
    cp_async_wait<0>();
    const auto bound = static_cast<uint32_t>(min(a.num_in, int64_t{1} << 31));
    bool any = false;
#pragma unroll 8
    for (int it = 0; it < kPerThread; ++it) {
      const int i = i0 + it * kRowStep;
      if (kEntries % kThreads != 0 && i >= BM) break;
      int32_t& v = s_rows[i * kRowsLd + j];
      const bool in = static_cast<uint32_t>(v) < bound;
      if (!in) v = -1;
      any |= in;
    }
    busy = static_cast<unsigned>(any) << j;
  } else {
#pragma unroll 4
    for (int it = 0; it < kPerThread; ++it) {
      const int idx = threadIdx.x + it * kThreads, i = idx / kRelChunk, j = idx % kRelChunk;
      if (kEntries % kThreads != 0 && idx >= kEntries) break;
      const int64_t o = j < width ? s_out[i] : -1;
      const int64_t v =
          o >= 0 ? static_cast<int64_t>(__ldg(a.table + table_row(a, m0, i, o) * a.num_relations + c0 + j)) : -1;
      const int32_t row = v >= 0 && v < a.num_in ? static_cast<int32_t>(v) : -1;  // num_in fits int32
      s_rows[i * kRowsLd + j] = row;
      if (row >= 0) busy |= 1u << j;
    }
  }
  if (busy) atomicOr(&chunk.busy, busy);
  __syncthreads();
  if (threadIdx.x < 32) {
    // Relation c0 + lane goes to rank lane % split (split divides kRelChunk): a fixed owner per
    // relation, whatever rows share the tile.
    const bool mine =
        (chunk.busy >> threadIdx.x & 1u) && static_cast<int>(threadIdx.x) % a.split == relation_split_rank(a.split);
    const unsigned share = __ballot_sync(0xffffffffu, mine);
    if (mine) chunk.list[__popc(share & ((1u << threadIdx.x) - 1u))] = threadIdx.x;
    if (threadIdx.x == 0) chunk.count = __popc(share);
  }
  __syncthreads();
  return chunk.count;
}

// B is [BK][BN + 8] k-major, or [BN][BK + 16 bytes] n-major with kWeightT (W^T read as stored).
template <typename T, int BM, int BN, int BK, int kStages, bool kWeightT = false>
struct TableMmaSmem {
  static constexpr int kLdA = BK + kVecElems<T>;  // see MmaWarpTile on padding
  static constexpr int kLdB = kWeightT ? BK + kVecElems<T> : BN + 8;
  static constexpr int kStage = BM * kLdA + (kWeightT ? BN : BK) * kLdB;  // elements
  static constexpr int kStageBytes = kStage * static_cast<int>(sizeof(T));
  static constexpr int kRowsBytes = BM * kRowsLd * static_cast<int>(sizeof(int32_t));
  static constexpr int kBytes = kStages * kStageBytes + kRowsBytes;
  static_assert((BM * kLdA * sizeof(T)) % 16 == 0 && kStageBytes % 16 == 0, "stages must stay 16-byte aligned");
};

// Blocks of `bytes` of shared memory each (dynamic and static) that fit one sm_90 SM: 228 KiB, of
// which the driver reserves 1 KiB per resident block.
constexpr int blocks_per_sm(int bytes) { return (228 * 1024) / (bytes + 1024); }

// Blocks per SM that ptxas must fit in registers: as many as shared memory allows (the stages and
// rows, the static s_out and s_chunk) for 64-row tiles and for whole 128-row tiles up to 96
// columns, none for the others. The 64 x 16 C16 kernel: 96 -> 80 registers, 5 -> 6 blocks per SM;
// H200, cached C16 fp16 forward of a batch of four 64-beam scans 58.0 -> 53.6 us. The 64 x 32 and
// 64 x 64 kernels lose their spills. The whole 128 x 64 and 128 x 96 kernels keep three and two
// blocks (80 registers, no spills), where the block read of the table (load_table_block) took the
// ones that read W^T in place to 99-100 registers and a block less per SM.
template <typename T, int BM, int BN, int BK, int kStages, bool kFull, bool kWeightT>
constexpr int table_mma_min_blocks() {
  constexpr int kBytes = TableMmaSmem<T, BM, BN, BK, kStages, kWeightT>::kBytes +
                         BM * static_cast<int>(sizeof(int64_t)) + static_cast<int>(sizeof(RelationChunk));
  return BM == 64 || (kFull && BN <= 96) ? blocks_per_sm(kBytes) : 0;
}

// kWeightT (whole tiles of 16-bit types only): a.weight is W^T's storage, and the B stages hold
// [BN][BK] slabs of its rows, so the input gradient needs no transposed copy of the weight (a launch
// and an allocation per backward); the products and their order are the same as over the copy.
// H100, the input gradient of the 64-beam scan's C64 fp16 layer: host 23-25 -> 11-13 us per op call,
// GPU time unchanged (python -m benchmarks.run --suite voxel, fwd+bwd rows).
template <typename T, typename Idx, int BM, int BN, int BK, int WM, int WN, int kStages, bool kFull, bool kExact,
          bool kWeightT = false>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, table_mma_min_blocks<T, BM, BN, BK, kStages, kFull, kWeightT>())
    conv_forward_table_mma(const ConvTableArgs<T, Idx> a) {
  static_assert(!kWeightT || (kFull && !kExact && sizeof(T) == 2), "W^T in place: whole 16-bit tiles only");
  using Smem = TableMmaSmem<T, BM, BN, BK, kStages, kWeightT>;
  constexpr int kThreads = (BM / WM) * (BN / WN) * 32;
  constexpr int kLdA = Smem::kLdA, kLdB = Smem::kLdB;
  extern __shared__ __align__(16) unsigned char smem[];
  T* stages = reinterpret_cast<T*>(smem);
  int32_t* s_rows = reinterpret_cast<int32_t*>(smem + kStages * Smem::kStageBytes);  // [BM][rows_ld]
  const int rows_ld = table_rows_ld(a);
  __shared__ RelationChunk s_chunk;
  __shared__ int64_t s_out[BM];  // output row of each tile row (table_output_row)

  const int g = blockIdx.y / a.n_tiles, n0 = (blockIdx.y % a.n_tiles) * BN;
  const int cin = a.cin_g, cout = a.cout_g;
  const int64_t m0 = table_tile_row0(BM, a.split), ldx = int64_t{a.groups} * cin, goff = int64_t{g} * cin;
  const int k_steps = (cin + BK - 1) / BK;
  const int warp = threadIdx.x / 32, wm = warp / (BN / WN), wn = warp % (BN / WN);

  load_output_rows<BM>(a.order, a.num_out, m0, s_out);

  const FixedChunkLoader<T, BM, BK, kThreads> a_loader;
  const FixedChunkLoader<T, kWeightT ? BN : BK, kWeightT ? BK : BN, kThreads, /*kL1=*/true> b_loader;
  std::conditional_t<kExact, SimtWarpTile<WM, WN>, MmaWarpTile<T, WM, WN>> tile;
  tile.zero();
  // Stages are used round robin across relation chunks; the next step to load is (relation
  // s_chunk.list[load_j], K chunk load_k).
  int load_stage = 0, mma_stage = 0;
  // pack and slot are powers of two (table_mma's packing rule: BK and the slot widths are), so the
  // packed path's tile coordinates are shifts and masks, not integer divisions.
  const int pack = kFull ? 1 : a.pack, slot = BK / pack, slot_shift = __ffs(slot) - 1;
  // A slot's padding past its C_in_g elements is never loaded: zero it in every stage once (the
  // barrier in load_relation_chunk orders these stores before the first cp.async).
  if (pack > 1 && slot > cin) zero_shared<kThreads>(smem, kStages * Smem::kStageBytes);
  for (int64_t c0 = 0; c0 < a.num_relations; c0 += kRelChunk) {
    const int count = load_relation_chunk<BM, kThreads>(a, s_out, m0, c0, s_rows, s_chunk);
    const int steps = pack > 1 ? (count + pack - 1) / pack : count * k_steps;

    // Starts the loads of the next step (in step order) into the next stage.
    int load_j = 0, load_k = 0;
    const auto issue_next = [&] {
      T* As = stages + load_stage * Smem::kStage;
      T* Bs = As + BM * kLdA;
      load_stage = load_stage + 1 == kStages ? 0 : load_stage + 1;
      if constexpr (!kFull) {
        if (pack > 1) {
          const int first = load_j;
          load_j += pack;
          const int chunk = cin * static_cast<int>(sizeof(T));  // 4, 8, 16 or 32 bytes (the launcher's choice)
          // Element e is slot q = e / BM of tile row i = e % BM: a warp copies one relation's rows for
          // 32 consecutive tile rows, so its s_rows reads fall in distinct banks and the relation is
          // warp-uniform. x offsets as 32 x 32 -> 64-bit products (rows and ldx < 2^31: table_mma).
          const auto ldx32 = static_cast<uint32_t>(ldx);
          for (int e = threadIdx.x; e < BM * pack; e += kThreads) {
            const int q = e / BM, i = e % BM;
            const int32_t row = first + q < count ? s_rows[i * rows_ld + s_chunk.list[first + q]] : -1;
            T* dst = As + i * kLdA + q * slot;
            const T* src = row >= 0 ? a.x + goff + static_cast<uint64_t>(static_cast<uint32_t>(row)) * ldx32 : a.x;
            if (chunk == 32) {
              constexpr int kHalf = 16 / static_cast<int>(sizeof(T));
              cp_async_16(dst, src, row >= 0);
              cp_async_16(dst + kHalf, src + kHalf, row >= 0);
            } else if (chunk == 16) {
              cp_async_16(dst, src, row >= 0);
            } else if (chunk == 8) {
              cp_async_small<8>(dst, src, row >= 0);
            } else {
              cp_async_small<4>(dst, src, row >= 0);
            }
          }
          // Slab row k: row k % slot of W[c0 + list[first + k / slot]] (none in a slot's padding or past
          // the chunk's count).
          const auto b_rows = [&](int k) {
            const int q = first + (k >> slot_shift), c = k & (slot - 1);
            return q < count && c < cin
                       ? ((c0 + s_chunk.list[q]) * a.groups + g) * int64_t{cin} * cout + int64_t{c} * cout
                       : int64_t{-1};
          };
          if (a.vec_w) {
            load_rows_async<T, BK, BN, kThreads>(Bs, kLdB, a.weight, b_rows, n0, cout);
          } else {
            load_rows<T, BK, BN, kThreads, false, false>(Bs, kLdB, a.weight, b_rows, NoScale{}, n0, cout, false);
          }
          return;
        }
      }
      const int j = s_chunk.list[load_j], k0 = load_k * BK;
      if (++load_k == k_steps) load_k = 0, ++load_j;
      const T* w = a.weight + ((c0 + j) * a.groups + g) * int64_t{cin} * cout;
      if constexpr (kFull) {
        // Row offsets as one 32 x 32 -> 64-bit multiply: rows < 2^31, ldx < 2^31 (launcher). A zero
        // row (no neighbour) keeps a readable address: row 0 of x.
        const T* xk = a.x + goff + k0;
        const auto ldx32 = static_cast<uint32_t>(ldx);
        a_loader.load(As, kLdA, [&](int i) {
          const int32_t row = s_rows[i * rows_ld + j];
          const uint32_t r = row >= 0 ? static_cast<uint32_t>(row) : 0u;
          return typename decltype(a_loader)::Row{xk + static_cast<uint64_t>(r) * ldx32, row >= 0};
        });
        if constexpr (kWeightT) {  // row n of the slab: W^T's stored row n0 + n from k0
          const T* wn = w + int64_t{n0} * cin + k0;
          b_loader.load(Bs, kLdB, [&](int n) { return typename decltype(b_loader)::Row{wn + int64_t{n} * cin, true}; });
        } else {
          const T* wk = w + int64_t{k0} * cout + n0;
          b_loader.load(Bs, kLdB, [&](int k) { return typename decltype(b_loader)::Row{wk + int64_t{k} * cout, true}; });
        }
        return;
      }
      const auto a_rows = [&](int i) {
        const int32_t row = s_rows[i * rows_ld + j];
        return row >= 0 ? row * ldx + goff : int64_t{-1};
      };
      const auto b_rows = [&](int k) { return k0 + k < cin ? int64_t{k0 + k} * cout : int64_t{-1}; };
      if (a.vec_x) {
        load_rows_async<T, BM, BK, kThreads>(As, kLdA, a.x, a_rows, k0, cin);
      } else {
        load_rows<T, BM, BK, kThreads, false, false>(As, kLdA, a.x, a_rows, NoScale{}, k0, cin, false);
      }
      if (a.vec_w) {
        load_rows_async<T, BK, BN, kThreads>(Bs, kLdB, w, b_rows, n0, cout);
      } else {
        load_rows<T, BK, BN, kThreads, false, false>(Bs, kLdB, w, b_rows, NoScale{}, n0, cout, false);
      }
    };

#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
      if (t < steps) issue_next();
      cp_async_commit();  // empty groups keep the wait counts uniform
    }
    for (int t = 0; t < steps; ++t) {
      cp_async_wait<kStages - 2>();
      // Step t's stage is complete for every thread, and every warp is done with step t - 1's stage,
      // which the issue below refills.
      __syncthreads();
      if (t + kStages - 1 < steps) issue_next();
      cp_async_commit();
      const T* As = stages + mma_stage * Smem::kStage;
      mma_stage = mma_stage + 1 == kStages ? 0 : mma_stage + 1;
      if constexpr (kWeightT) {
        tile.template mma<BK, false, true>(As + wm * WM * kLdA, kLdA, As + BM * kLdA + wn * WN * kLdB, kLdB);
      } else if constexpr (!kFull && !kExact) {
        if (pack > 1 && slot * static_cast<int>(sizeof(T)) < 32) {
          tile.template mma<BK, false, false, NoFragmentHook, true>(As + wm * WM * kLdA, kLdA, As + BM * kLdA + wn * WN,
                                                                    kLdB);
        } else {  // unpacked, or 32-byte slots: each whole mma K block is one relation's
          tile.template mma<BK>(As + wm * WM * kLdA, kLdA, As + BM * kLdA + wn * WN, kLdB);
        }
      } else {
        tile.template mma<BK>(As + wm * WM * kLdA, kLdA, As + BM * kLdA + wn * WN, kLdB);
      }
    }
    cp_async_wait<0>();
  }
  static_assert(decltype(tile)::kAccumulators * kThreads * sizeof(float) <= kStages * Smem::kStageBytes,
                "relation_split_sum's scratch overlaps the stages");
  if (!relation_split_sum<decltype(tile)::kAccumulators, kThreads>(a.split, reinterpret_cast<float*>(smem),
                                                         [&](int i) -> float& { return tile.accumulator(i); })) {
    return;
  }

  const int64_t ldo = int64_t{a.groups} * cout;
  T* out = a.out + int64_t{g} * cout;
  const int col0 = n0 + wn * WN;
  const T* bias = a.bias ? a.bias + int64_t{g} * cout : nullptr;
  tile.for_each_pair([&](int m, int n, float v0, float v1) {
    const int64_t o = s_out[wm * WM + m];
    const int c = col0 + n;
    if constexpr (kFull) {  // whole tiles: every column exists and pairs are aligned (vec_out2)
      if (o >= 0) store_pair(out + o * ldo + c, epilogue(v0, bias, c, a.relu), epilogue(v1, bias, c + 1, a.relu));
      return;
    }
    if (o < 0 || c >= cout) return;
    v0 = epilogue(v0, bias, c, a.relu);
    if (c + 1 < cout) v1 = epilogue(v1, bias, c + 1, a.relu);
    T* p = out + o * ldo + c;
    if (a.vec_out2 && c + 1 < cout) {
      store_pair(p, v0, v1);
    } else {
      p[0] = from_acc<T>(v0);
      if (c + 1 < cout) p[1] = from_acc<T>(v1);
    }
  });
}

// SIMT variant (float / double): thread (tm, tn) owns an interleaved TM x TN sub-tile, A stored
// channel-major [BK][BM+2] as in conv_forward_simt (the transposing store rules out cp.async, so one
// stage; the many resident blocks of these small tiles hide the gather latency instead). The epilogue
// stores straight from registers: a warp writes consecutive channels of an output row.
template <typename T, typename Idx, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
    conv_forward_table_simt(const ConvTableArgs<T, Idx> a) {
  constexpr int kThreads = (BM / TM) * (BN / TN);
  constexpr int kLdA = BM + 2, kLdB = BN + 4;
  __shared__ __align__(16) T As[BK * kLdA];
  __shared__ __align__(16) T Bs[BK * kLdB];
  __shared__ int64_t s_in[BM];
  __shared__ int64_t s_out[BM];

  const int g = blockIdx.y / a.n_tiles, n0 = (blockIdx.y % a.n_tiles) * BN;
  const int cin = a.cin_g, cout = a.cout_g;
  const int64_t m0 = table_tile_row0(BM, 1), ldo = int64_t{a.groups} * cout;
  load_output_rows<BM>(a.order, a.num_out, m0, s_out);
  const TableColumn<BM, Idx> column{a.table,  s_out, a.num_in, a.num_relations, int64_t{a.groups} * cin,
                                    int64_t{g} * cin, m0, table_by_position(a)};
  const int tm = threadIdx.x / (BN / TN), tn = threadIdx.x % (BN / TN);
  SimtThreadTile<T, BM, BN, TM, TN> tile;
  tile.zero();
  // load() rewrites s_in only after the barrier that ended the previous relation's last A load.
  for (int64_t r = column.next(0, s_in); r < a.num_relations; r = column.next(r + 1, s_in)) {
    const T* w = a.weight + (r * a.groups + g) * int64_t{cin} * cout;
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
  }

  T* out = a.out + int64_t{g} * cout;
  const T* bias = a.bias ? a.bias + int64_t{g} * cout : nullptr;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t o = s_out[tm + i * (BM / TM)];
    if (o < 0) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int n = n0 + tn + j * (BN / TN);
      if (n < cout) out[o * ldo + n] = epilogue(tile.acc[i][j], bias, n, a.relu);
    }
  }
}

}  // namespace relconv::cuda
