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
// Relations in which no row of the tile has a neighbour are skipped (one block vote per relation):
// in strided / transposed maps most (output, relation) slots are empty, and even on submanifold maps
// whole tiles often miss the relations that point off the surface.
#include <cstdint>

#include "numeric.cuh"
#include "tile_load.cuh"
#include "tile_mma.cuh"

namespace relconv::cuda {

template <typename T, typename Idx>
struct ConvTableArgs {
  const T* x;          // [num_in, groups * cin_g]
  const T* weight;     // [R, groups, cin_g, cout_g], contiguous
  const Idx* table;    // [num_out, R], contiguous; input row or -1
  T* out;              // [num_out, groups * cout_g], fully overwritten
  int64_t num_in, num_out, num_relations;
  int groups, cin_g, cout_g, n_tiles;
  bool vec_x, vec_w;   // 16-byte (and cp.async) loads allowed for x rows / W rows (see load_rows)
  bool vec_out;        // 16-byte stores allowed for output rows
};

// Column r of the block's BM x R slice of the table, as x element offsets in shared memory.
template <int BM, typename Idx>
struct TableColumn {
  const Idx* table;
  int64_t num_out, num_in, num_relations, m0, ldx, group_offset;

  // Block-wide (every thread must call it: it ends in a barrier). Sets s_in[i] to the offset of the
  // group block of the x row feeding output m0 + i through relation r, or -1 (no neighbour, an entry
  // out of range, a row past num_out). Returns whether any row of the tile has a neighbour.
  __device__ __forceinline__ bool load(int64_t r, int64_t* s_in) const {
    int any = 0;
    for (int i = threadIdx.x; i < BM; i += blockDim.x) {
      const int64_t o = m0 + i;
      int64_t off = -1;
      if (o < num_out) {
        const int64_t row = __ldg(table + o * num_relations + r);
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

template <int BM, typename T, typename Idx>
__device__ __forceinline__ TableColumn<BM, Idx> table_column(const ConvTableArgs<T, Idx>& a, int g) {
  const int64_t ldx = int64_t{a.groups} * a.cin_g;
  return {a.table, a.num_out, a.num_in, a.num_relations, int64_t{blockIdx.x} * BM, ldx, int64_t{g} * a.cin_g};
}

// Tensor-core variant (half / bfloat16). Warps form a (BM/WM) x (BN/WN) grid over the block tile.
// Two shared-memory stages of A [BM][BK+8] and B [BK][BN+8]: while the warps multiply one stage, the
// cp.async copies of the next (relation, C_in chunk) step fill the other, which hides the latency of
// the gather (rows that do not fit the vector preconditions are loaded synchronously into the idle
// stage instead, same schedule). After the K loop the stages are reused as the fp32 C tile
// [BM][BN+4], so that the epilogue converts and stores whole 16-byte chunks of output rows.
template <typename T, typename Idx, int BM, int BN, int BK, int WM, int WN>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)
    conv_forward_table_wmma(const ConvTableArgs<T, Idx> a) {
  constexpr int kThreads = (BM / WM) * (BN / WN) * 32;
  constexpr int kLdA = BK + 8, kLdB = BN + 8, kLdC = BN + 4;
  constexpr int kStage = BM * kLdA + BK * kLdB;  // elements
  constexpr int kBytesAB = 2 * kStage * static_cast<int>(sizeof(T));
  constexpr int kBytesC = BM * kLdC * static_cast<int>(sizeof(float));
  static_assert((BM * kLdA * sizeof(T)) % 128 == 0 && (kStage * sizeof(T)) % 128 == 0,
                "every stage and its B tile must keep the 32-byte fragment alignment");
  __shared__ __align__(128) unsigned char smem[kBytesAB > kBytesC ? kBytesAB : kBytesC];
  __shared__ int64_t s_in[BM];

  const int g = blockIdx.y / a.n_tiles, n0 = (blockIdx.y % a.n_tiles) * BN;
  const int cin = a.cin_g, cout = a.cout_g;
  const int64_t num_rel = a.num_relations;
  const TableColumn<BM, Idx> column = table_column<BM>(a, g);
  T* stages = reinterpret_cast<T*>(smem);

  // Starts the loads of step (r, k0) into `stage`; s_in must hold relation r's column.
  auto issue = [&](int64_t r, int k0, int stage) {
    T* As = stages + stage * kStage;
    T* Bs = As + BM * kLdA;
    const T* w = a.weight + (r * a.groups + g) * int64_t{cin} * cout;
    const auto a_rows = [&](int i) { return s_in[i]; };
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
    cp_async_commit();
  };

  const int warp = threadIdx.x / 32, wm = warp / (BN / WN), wn = warp % (BN / WN);
  WmmaWarpTile<T, WM, WN, nvcuda::wmma::row_major> tile;
  tile.zero();
  int64_t r = column.next(0, s_in);
  int k0 = 0, stage = 0;
  if (r < num_rel) issue(r, 0, 0);
  __syncthreads();  // the loop's first search rewrites s_in, which the issue above reads
  while (r < num_rel) {
    int64_t next_r = r;
    int next_k0 = k0 + BK;
    if (next_k0 >= cin) {
      next_k0 = 0;
      next_r = column.next(r + 1, s_in);
    }
    // The idle stage was last read by the previous step's MMA, which the barrier below ended.
    if (next_r < num_rel) {
      issue(next_r, next_k0, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* As = stages + stage * kStage;
    tile.template mma<BK>(As + wm * WM * kLdA, kLdA, As + BM * kLdA + wn * WN, kLdB);
    __syncthreads();
    r = next_r;
    k0 = next_k0;
    stage ^= 1;
  }

  float* Cs = reinterpret_cast<float*>(smem);
  tile.store(Cs + wm * WM * kLdC + wn * WN, kLdC);
  __syncthreads();
  const int64_t m0 = int64_t{blockIdx.x} * BM, ldo = int64_t{a.groups} * cout;
  T* out = a.out + int64_t{g} * cout + n0;
  if (a.vec_out) {
    constexpr int V = kVecElems<T>, kChunks = BN / V;
    for (int idx = threadIdx.x; idx < BM * kChunks; idx += kThreads) {
      const int m = idx / kChunks, c = (idx % kChunks) * V;
      if (m0 + m >= a.num_out || n0 + c >= cout) continue;
      T e[V];
#pragma unroll
      for (int j = 0; j < V; ++j) e[j] = from_acc<T>(Cs[m * kLdC + c + j]);
      uint4 u;
      memcpy(&u, e, sizeof(u));
      *reinterpret_cast<uint4*>(out + (m0 + m) * ldo + c) = u;
    }
  } else {
    for (int idx = threadIdx.x; idx < BM * BN; idx += kThreads) {
      const int m = idx / BN, n = idx % BN;
      if (m0 + m < a.num_out && n0 + n < cout) out[(m0 + m) * ldo + n] = from_acc<T>(Cs[m * kLdC + n]);
    }
  }
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

  const int g = blockIdx.y / a.n_tiles, n0 = (blockIdx.y % a.n_tiles) * BN;
  const int cin = a.cin_g, cout = a.cout_g;
  const TableColumn<BM, Idx> column = table_column<BM>(a, g);
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

  const int64_t m0 = int64_t{blockIdx.x} * BM, ldo = int64_t{a.groups} * cout;
  T* out = a.out + int64_t{g} * cout;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t o = m0 + tm + i * (BM / TM);
    if (o >= a.num_out) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int n = n0 + tn + j * (BN / TN);
      if (n < cout) out[o * ldo + n] = tile.acc[i][j];
    }
  }
}

}  // namespace relconv::cuda
