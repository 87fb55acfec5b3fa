#pragma once
// Kernel-map kernels over the coordinate hash table (kernel_map_hash.cuh): neighbour tables of
// submanifold and strided maps, the transposed table, and the coarse sites of a strided conv.
#include <cstdint>
#include <limits>

#include "cuda/kernel_map_hash.cuh"

namespace relconv::cuda {

// Kernel offsets follow relconv.voxel.kernel_map.kernel_offsets: weight order x slowest, z
// fastest; per axis an odd size k covers -(k-1)/2 .. (k-1)/2 and an even size 0 .. k-1. They are
// recomputed from k in registers, so building a map copies nothing from the host.
struct KernelGeometry {
  int32_t size[3];  // kernel size per axis
  int64_t step[3];  // dilation * tensor stride per axis, in coordinate units
  int32_t volume;   // size[0] * size[1] * size[2] = relations K
};

__device__ __forceinline__ int64_t axis_offset(int32_t idx, int32_t size) {
  return (size & 1) ? idx - size / 2 : idx;
}

__device__ __forceinline__ bool fits_int32(int64_t v) {
  return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
}

// The input row at p + offset_k * step, or -1. Queries that leave the int32 range cannot match any
// input and are misses. kCube > 0: the kernel is kCube^3, known at compile time, so that splitting k
// into axis indices costs multiplies instead of divisions (the map kernels are issue-bound).
template <int kCube = 0, bool kInKernel = false>
__device__ __forceinline__ int32_t find_neighbor(const HashView& in, const Coord& p, int32_t k,
                                                 const KernelGeometry& g) {
  const int32_t sx = kCube > 0 ? kCube : g.size[0], sy = kCube > 0 ? kCube : g.size[1];
  const int32_t sz = kCube > 0 ? kCube : g.size[2];
  const int32_t kz = k % sz;
  const int32_t ky = (k / sz) % sy;
  const int32_t kx = k / (sz * sy);
  const int64_t qx = p.x + axis_offset(kx, sx) * g.step[0];
  const int64_t qy = p.y + axis_offset(ky, sy) * g.step[1];
  const int64_t qz = p.z + axis_offset(kz, sz) * g.step[2];
  if (!fits_int32(qx) || !fits_int32(qy) || !fits_int32(qz)) return -1;
  return in.find<kInKernel>(Coord{p.b, static_cast<int32_t>(qx), static_cast<int32_t>(qy), static_cast<int32_t>(qz)});
}

// table[o, k] = input row at out_coords[o] + offset_k * step, or -1. One thread per (o, k) with k
// fastest, so a warp writes consecutive table entries and re-reads one output row from cache.
template <typename Idx>
__global__ void neighbor_table_kernel(HashView in, const int32_t* __restrict__ out_coords, int64_t num_out,
                                      KernelGeometry g, Idx* __restrict__ table) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= num_out * g.volume) return;
  const int64_t o = t / g.volume;
  const int32_t k = static_cast<int32_t>(t - o * g.volume);
  table[t] = static_cast<Idx>(find_neighbor(in, load_coord(out_coords, o), k, g));
}

// Queries per output row of submanifold_table_kernel: the offsets below the centre, and the centre.
__host__ __device__ constexpr int64_t submanifold_queries(int32_t volume) { return volume / 2 + 1; }

// The submanifold table of a symmetric kernel (odd size per axis, offsets -r..r: offset K-1-k is
// -offset_k) from half the queries: p_i = p_o + offset_k exactly when p_o = p_i + offset_{K-1-k},
// so the query of (o, k) for k below the centre also answers (i, K-1-k), and the centre entry is
// o itself. 13 hash probes per output instead of 27 for 3^3: the probes (random reads of the hash
// table and of the coordinate rows) are what the build costs once a scene outgrows the L2 cache.
// One thread per (o, k <= centre), k fastest. `table` must be filled with -1 first: the mirrored
// entries of absent neighbours are written by no one. Coordinates are unique (else the caller
// raises before the table is used), so no mirrored entry is written twice. kCube > 0: a kCube^3
// kernel with n * (K / 2 + 1) < 2^31 (the caller checks), whose thread index splits into (o, k) by a
// 32-bit division by a constant rather than a 64-bit one by a variable. With the 32-bit hash, ncu on
// 3.5M voxels (H100): 961 -> 901 us, SM throughput 68% -> 46%, now bound by L2 (77%); the map op on
// the 64-beam scan 32 -> 26 us, on the real scan 31 -> 21 us (gpu_checks/session15_probes.txt).
// submanifold_query answers query t < n * submanifold_queries (kCube > 0: t < 2^32); the kernel runs
// one thread per query, fused_submanifold_map (kernel_map_fused.cuh) loops over them (kInKernel: see
// HashView::find).
template <typename Idx, int kCube, bool kInKernel = false>
__device__ __forceinline__ void submanifold_query(const HashView& in, const KernelGeometry& g, Idx* __restrict__ table,
                                                  int64_t t) {
  const int32_t volume = kCube > 0 ? kCube * kCube * kCube : g.volume;
  const int32_t half = volume / 2;  // the centre's index; queries k < half, mirrors K-1-k > half
  int64_t o;
  int32_t k;
  if constexpr (kCube > 0) {
    constexpr auto kQueries = static_cast<uint32_t>(submanifold_queries(kCube * kCube * kCube));
    const auto t32 = static_cast<uint32_t>(t);
    o = t32 / kQueries;
    k = static_cast<int32_t>(t32 - static_cast<uint32_t>(o) * kQueries);
  } else {
    o = t / (half + 1);
    k = static_cast<int32_t>(t - o * (half + 1));
  }
  if (k == half) {
    table[o * volume + half] = static_cast<Idx>(o);
    return;
  }
  const int32_t row = find_neighbor<kCube, kInKernel>(in, load_coord(in.coords, o), k, g);
  table[o * volume + k] = static_cast<Idx>(row);
  if (row >= 0) table[static_cast<int64_t>(row) * volume + (volume - 1 - k)] = static_cast<Idx>(o);
}

template <typename Idx, int kCube>
__global__ void submanifold_table_kernel(HashView in, int64_t n, KernelGeometry g, Idx* __restrict__ table) {
  if constexpr (kCube > 0) {
    const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n * submanifold_queries(kCube * kCube * kCube)) submanifold_query<Idx, kCube>(in, g, table, t);
  } else {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t < n * submanifold_queries(g.volume)) submanifold_query<Idx, kCube>(in, g, table, t);
  }
}

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

__device__ __forceinline__ int64_t floor_to_step(int32_t v, int64_t step) {
  const int64_t q = v >= 0 ? v / step : -((-static_cast<int64_t>(v) + step - 1) / step);
  return q * step;
}

// coarse[i] = (b, floor(p / step) * step per axis): the output site that input row i falls into.
// Rounding down can leave int32 for coordinates near its minimum; those raise kErrOverflow.
// `error` is the (inverted) status word of strided_coords: it starts all ones and a bit is cleared per
// problem, as in hash_insert_rows' word, whose value (`input_error`, the input's own hash, when the
// input is still unchecked) the first thread folds in, so that one read on the host sees both.
__global__ void coarse_coords_kernel(const int32_t* __restrict__ coords, int64_t n, int64_t sx, int64_t sy,
                                     int64_t sz, int32_t* __restrict__ coarse, int32_t* __restrict__ error,
                                     const int32_t* __restrict__ input_error) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i == 0 && input_error != nullptr) atomicAnd(error, *input_error);
  if (i >= n) return;
  const Coord p = load_coord(coords, i);
  const int64_t x = floor_to_step(p.x, sx), y = floor_to_step(p.y, sy), z = floor_to_step(p.z, sz);
  if (!fits_int32(x) || !fits_int32(y) || !fits_int32(z)) atomicAnd(error, ~kErrOverflow);
  reinterpret_cast<int4*>(coarse)[i] =
      make_int4(p.b, static_cast<int32_t>(x), static_cast<int32_t>(y), static_cast<int32_t>(z));
}

// representative[i] = i when row i is the smallest row of its coarse site (the slot's value after
// hash_insert_min_rows), else -1; a stable select of the non-negative entries lists the sites in
// order of first occurrence.
__global__ void site_representatives_kernel(HashView coarse, int64_t n, int32_t* __restrict__ representative) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t row = coarse.find(load_coord(coarse.coords, i));
  representative[i] = row == static_cast<int32_t>(i) ? row : -1;
}

// out[m] = coords[rows[m]] for the selected representative rows.
__global__ void gather_rows_kernel(const int32_t* __restrict__ coords, const int32_t* __restrict__ rows, int64_t m,
                                   int32_t* __restrict__ out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= m) return;
  reinterpret_cast<int4*>(out)[j] = __ldg(reinterpret_cast<const int4*>(coords) + rows[j]);
}

struct IsNonNegative {
  __host__ __device__ __forceinline__ bool operator()(int32_t v) const { return v >= 0; }
};

}  // namespace relconv::cuda
