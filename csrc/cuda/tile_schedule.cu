// The schedule kernel of tile_schedule.cuh.
#include <cub/block/block_scan.cuh>

#include "cuda/tile_schedule.cuh"

namespace relconv::cuda {

__global__ void __launch_bounds__(kScheduleThreads)
    relation_tile_offsets(const int64_t* __restrict__ rel_ptr, int64_t num_relations, int64_t num_pairs,
                          int64_t pairs_per_tile, int64_t target_tiles, int64_t granule,
                          int64_t* __restrict__ tile_ptr, uint32_t* __restrict__ zero, int64_t zero_words) {
  if (blockIdx.x > 0) {
    // The buffer comes from the caching allocator (256-byte aligned): whole uint4s, then the tail.
    const int64_t stride = int64_t{gridDim.x - 1} * blockDim.x;
    const int64_t first = int64_t{blockIdx.x - 1} * blockDim.x + threadIdx.x;
    const int64_t vecs = zero_words / 4;
    for (int64_t i = first; i < vecs; i += stride) reinterpret_cast<uint4*>(zero)[i] = make_uint4(0, 0, 0, 0);
    for (int64_t i = vecs * 4 + first; i < zero_words; i += stride) zero[i] = 0;
    return;
  }
  using Scan = cub::BlockScan<int64_t, kScheduleThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int64_t carry, tile_size;
  if (threadIdx.x == 0) {
    carry = 0;
    tile_ptr[0] = 0;
    if (target_tiles > 0) pairs_per_tile = target_tile_size(rel_ptr, num_relations, num_pairs, target_tiles, granule);
    tile_size = pairs_per_tile;
    tile_ptr[num_relations + 1] = pairs_per_tile;
  }
  __syncthreads();
  pairs_per_tile = tile_size;
  for (int64_t base = 0; base < num_relations; base += kScheduleThreads) {
    const int64_t r = base + threadIdx.x;
    int64_t tiles = 0;
    if (r < num_relations) {
      const PairRange pr = relation_pairs(rel_ptr, r, num_pairs);
      tiles = (pr.end - pr.begin + pairs_per_tile - 1) / pairs_per_tile;
    }
    int64_t inclusive, chunk_total;
    Scan(scan_storage).InclusiveSum(tiles, inclusive, chunk_total);
    if (r < num_relations) tile_ptr[r + 1] = carry + inclusive;
    __syncthreads();  // everyone has read `carry` and scan_storage may be reused
    if (threadIdx.x == 0) carry += chunk_total;
    __syncthreads();
  }
}

}  // namespace relconv::cuda
