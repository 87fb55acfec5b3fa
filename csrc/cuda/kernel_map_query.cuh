#pragma once
// Kernel-map kernels over the coordinate hash table (kernel_map_hash.cuh): its inserts, neighbour
// tables of submanifold and strided maps, and the coarse sites of a strided conv.
#include <cstdint>
#include <limits>

#include "cuda/kernel_map_hash.cuh"

namespace relconv::cuda {

// One thread per row (insert_row).
__global__ void hash_insert_rows(const int32_t* __restrict__ coords, int64_t n, int32_t* __restrict__ slots,
                                 SlotLayout layout, int32_t* __restrict__ error) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) insert_row(coords, i, slots, layout, error);
}

// Like hash_insert_rows, but equal rows are expected (many fine voxels share one coarse site) and
// the slot keeps the SMALLEST row holding the key: that row stands for the site, which makes the
// output order of strided coordinates deterministic (first occurrence in input row order). Equal
// keys have equal tags, so the smallest entry holds the smallest row. Other threads probing past
// the slot meanwhile compare against an equal key whichever row it holds.
__global__ void hash_insert_min_rows(const int32_t* __restrict__ coords, int64_t n, int32_t* __restrict__ slots,
                                     SlotLayout layout) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const Coord c = load_coord(coords, i);
  const uint32_t h = hash_coord(c);
  const int32_t mine = layout.entry(h, i);
  const int64_t s = claim_slot(coords, slots, layout, c, h, mine);
  if (s >= 0) atomicMin(slots + s, mine);
}

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
// the 64-beam scan 32 -> 26 us, on the real scan 31 -> 21 us (python -m benchmarks.run --suite voxel).
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
