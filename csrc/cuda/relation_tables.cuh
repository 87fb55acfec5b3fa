#pragma once
// Kernels over a neighbour table [num_out, R] of any relational map with unique slots (voxel maps,
// graph maps built as tables): the transposed table, the padded pair lists and the schedule order
// of the output-stationary kernel. Launched by relation_tables.cu.
#include <cstdint>

namespace relconv::cuda {

// The transposed map's table from a forward table: pair (i, o, k) becomes (o, i, k). Every input
// row feeds at most one output per offset (q = p - offset is unique), so the writes never collide.
// `transposed` must be filled with -1 first.
template <typename Idx>
__global__ void transpose_table_kernel(const Idx* __restrict__ table, int64_t num_out, int32_t volume,
                                       Idx* __restrict__ transposed) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= num_out * volume) return;
  const Idx row = table[t];
  if (row < 0) return;
  const int64_t o = t / volume;
  transposed[static_cast<int64_t>(row) * volume + (t - o * volume)] = static_cast<Idx>(o);
}

// Pair lists of a table without a host sync (table_pairs): entries are taken relation-major, entry
// e = r * num_out + o reading table[o, r], so that an inclusive scan of the hit flags gives every hit
// its slot in the (relation, out) order of RelationalMap's pairs.
template <typename Idx>
__global__ void table_hit_flags_kernel(const Idx* __restrict__ table, int64_t num_out, int64_t num_relations,
                                       Idx* __restrict__ flags) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= num_out * num_relations) return;
  const int64_t r = e / num_out, o = e - r * num_out;
  flags[e] = table[o * num_relations + r] >= 0 ? 1 : 0;
}

// Scatters each hit to its slot (positions = inclusive scan of the flags), writes rel_ptr from the
// scan's value at the end of each relation, and -1 into the padding: slot e >= the pair count holds
// no pair, so thread e owns it (the hits go to slots below the count). Every entry is written, so
// the lists need no fill of their own.
template <typename Idx>
__global__ void table_pairs_kernel(const Idx* __restrict__ table, const Idx* __restrict__ positions,
                                   int64_t num_out, int64_t num_relations, Idx* __restrict__ in_index,
                                   Idx* __restrict__ out_index, int64_t* __restrict__ rel_ptr) {
  const int64_t capacity = num_out * num_relations;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= capacity) return;
  const int64_t r = e / num_out, o = e - r * num_out;
  if (e == 0) rel_ptr[0] = 0;
  if (o == num_out - 1) rel_ptr[r + 1] = positions[e];
  if (e >= static_cast<int64_t>(positions[capacity - 1])) {
    in_index[e] = -1;
    out_index[e] = -1;
  }
  const Idx row = table[o * num_relations + r];
  if (row < 0) return;
  const int64_t slot = static_cast<int64_t>(positions[e]) - 1;
  in_index[slot] = row;
  out_index[slot] = static_cast<Idx>(o);
}

// The schedule order of the output-stationary kernel (neighbor_table_order) sorts rows by a key
// built from the row's occupancy mask over the first kOrderKeyBits relations, in two passes:
//   1. occupancy_keys_kernel: mask bit r = relation r has an input, plus how many rows use each
//      relation (counts);
//   2. ranked_gray_keys_kernel: the bits are reordered by those counts, the most used relation in
//      the least significant bit, and the mask replaced by its rank in the reflected Gray sequence.
// Why: a tile computes every relation any of its rows uses, so the waste is in tiles that straddle
// several masks. A sort puts rows sharing high bits together, so the rarest relations in the high
// bits confine each of them to few tiles, while the common ones (used by nearly every tile anyway)
// vary fastest; Gray order makes neighbouring masks differ in one relation instead of a carry's
// worth. On the subm 3^3 tables of the benchmark scenes this cuts the (64-row tile, relation) steps
// against a plain mask sort by 10% (scan64), 15% (kitti-real) and 8% (scan128x8); counts rather than
// a fixed order of the offsets, since which relations are rare depends on the scene.
constexpr int kOrderKeyBits = 31;  // the key stays a non-negative int32

// keys[o] = occupancy mask of output row o, rows[o] = o (the identity the sort carries along), and
// counts[r] += rows using relation r. counts must be zeroed; blockDim.x a multiple of 32.
template <typename Idx>
__global__ void occupancy_keys_kernel(const Idx* __restrict__ table, int64_t num_out, int64_t num_relations,
                                      int32_t keyed, int32_t* __restrict__ keys, Idx* __restrict__ rows,
                                      int32_t* __restrict__ counts) {
  __shared__ int32_t block_counts[kOrderKeyBits];
  for (int r = threadIdx.x; r < keyed; r += blockDim.x) block_counts[r] = 0;
  __syncthreads();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t mask = 0;
  if (o < num_out) {
    const Idx* row = table + o * num_relations;
    for (int32_t r = 0; r < keyed; ++r) mask |= static_cast<uint32_t>(row[r] >= 0) << r;
    keys[o] = static_cast<int32_t>(mask);
    rows[o] = static_cast<Idx>(o);
  }
  // Threads past num_out carry an empty mask, so the whole warp can vote.
  for (int32_t r = 0; r < keyed; ++r) {
    const int used = __popc(__ballot_sync(0xffffffffu, (mask >> r) & 1u));
    if ((threadIdx.x & 31) == 0 && used > 0) atomicAdd(&block_counts[r], used);
  }
  __syncthreads();
  for (int r = threadIdx.x; r < keyed; r += blockDim.x) {
    if (block_counts[r] > 0) atomicAdd(&counts[r], block_counts[r]);
  }
}

// Bit of relation r in the reordered mask: the number of relations q used by more rows than r, or
// by as many with q < r (so equal counts keep the plain mask order).
__host__ __device__ __forceinline__ int32_t relation_key_bit(const int32_t* counts, int32_t r, int32_t keyed) {
  int32_t bit = 0;
  for (int32_t q = 0; q < keyed; ++q) bit += counts[q] > counts[r] || (counts[q] == counts[r] && q < r);
  return bit;
}

// Position of `word` in the reflected Gray sequence: the prefix XOR of its bits from the top.
__host__ __device__ __forceinline__ uint32_t gray_sequence_rank(uint32_t word) {
  for (int shift = 1; shift < 32; shift <<= 1) word ^= word >> shift;
  return word;
}

// keys[o] = gray_sequence_rank(mask with bit r moved to relation_key_bit(r)). Both maps are
// bijections, so rows with equal masks still get equal keys and rows with different masks different
// keys. Every block ranks the <= 31 counts itself, which costs less than a launch of its own.
__global__ void ranked_gray_keys_kernel(int32_t* __restrict__ keys, int64_t num_out, int32_t keyed,
                                        const int32_t* __restrict__ counts) {
  __shared__ int32_t s_counts[kOrderKeyBits], s_bit[kOrderKeyBits];
  const auto tid = static_cast<int32_t>(threadIdx.x);
  if (tid < keyed) s_counts[tid] = counts[tid];
  __syncthreads();
  if (tid < keyed) s_bit[tid] = relation_key_bit(s_counts, tid, keyed);
  __syncthreads();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= num_out) return;
  const auto mask = static_cast<uint32_t>(keys[o]);
  uint32_t word = 0;
  for (int32_t r = 0; r < keyed; ++r) word |= ((mask >> r) & 1u) << s_bit[r];
  keys[o] = static_cast<int32_t>(gray_sequence_rank(word));
}

}  // namespace relconv::cuda
