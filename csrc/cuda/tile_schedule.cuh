#pragma once
// How one launch covers every relation without a host loop or a host read of rel_ptr.
//
// Each relation's pairs are cut into tiles of `pairs_per_tile` consecutive pairs; tiles never straddle
// two relations, so a block works with one weight matrix. A tiny single-block kernel turns rel_ptr
// into tile_ptr (CSR offsets of tiles per relation) on the device. The host launches an upper bound of
// blocks computed from plain ints; block b finds its relation by binary search in tile_ptr and
// surplus blocks exit. The tile size is either fixed (the forward: ceil(P / pairs_per_tile) + R
// blocks, each relation adding at most one partial tile) or chosen on the device from the pair count
// rel_ptr[R] so that at most `target_tiles` + R tiles result (the weight gradient): the host never
// needs the pair count, so pair lists padded past rel_ptr[R] (RelationalMap.kernel_pairs, built
// without a host sync) schedule exactly like exact ones.
#include <algorithm>
#include <cstdint>

namespace relconv::cuda {

// Pair range [begin, end) of relation r, clamped into [0, num_pairs] so that a malformed rel_ptr can
// never make a kernel read outside the pair arrays (such a map is rejected when it is built; the
// kernels must merely stay in bounds).
struct PairRange {
  int64_t begin, end;
};

__device__ __forceinline__ PairRange relation_pairs(const int64_t* __restrict__ rel_ptr, int64_t r,
                                                    int64_t num_pairs) {
  const int64_t b = min(max(rel_ptr[r], int64_t{0}), num_pairs);
  const int64_t e = min(max(rel_ptr[r + 1], b), num_pairs);
  return {b, e};
}

constexpr int kScheduleThreads = 512;

// The tile size of a schedule for `target_tiles`: the smallest multiple of `granule` that cuts the
// rel_ptr[R] pairs (clamped into [0, num_pairs]) into at most target_tiles tiles.
__device__ __forceinline__ int64_t target_tile_size(const int64_t* __restrict__ rel_ptr, int64_t num_relations,
                                                    int64_t num_pairs, int64_t target_tiles, int64_t granule) {
  const int64_t p = min(max(rel_ptr[num_relations], int64_t{0}), num_pairs);
  return max(int64_t{1}, ((p + target_tiles - 1) / target_tiles + granule - 1) / granule) * granule;
}

// tile_ptr[0] = 0, tile_ptr[r + 1] = tile_ptr[r] + ceil(pairs of relation r / pairs_per_tile), and
// tile_ptr[R + 1] = pairs_per_tile (tile_ptr has R + 2 entries). With target_tiles > 0 the tile size
// is the smallest multiple of `granule` that cuts the P = rel_ptr[R] pairs into at most target_tiles
// tiles (pairs_per_tile is then ignored). Block 0 (kScheduleThreads threads) walks the relations in
// chunks, carrying the running total. Blocks 1.. zero `zero_words` 32-bit words at `zero` (the weight
// gradient's atomic accumulator, which the next launch adds into): one launch instead of a memset
// and a launch, two host API calls per weight gradient being a measurable share of a training step.
// Defined in tile_schedule.cu (one definition for every translation unit that launches it).
__global__ void __launch_bounds__(kScheduleThreads)
    relation_tile_offsets(const int64_t* __restrict__ rel_ptr, int64_t num_relations, int64_t num_pairs,
                          int64_t pairs_per_tile, int64_t target_tiles, int64_t granule,
                          int64_t* __restrict__ tile_ptr, uint32_t* __restrict__ zero, int64_t zero_words);

// Blocks of relation_tile_offsets past the first that zero `words` words (none when words == 0).
inline unsigned zeroing_blocks(int64_t words) {
  constexpr int64_t kWordsPerBlock = int64_t{kScheduleThreads} * 16;  // 4 uint4 stores per thread
  return static_cast<unsigned>(std::min<int64_t>((words + kWordsPerBlock - 1) / kWordsPerBlock, 1024));
}

// The tile a block works on: relation r and its pair range [begin, end) (at most pairs_per_tile).
struct PairTile {
  bool valid;
  int64_t relation, begin, end;
};

__device__ __forceinline__ PairTile locate_tile(const int64_t* __restrict__ rel_ptr,
                                                const int64_t* __restrict__ tile_ptr, int64_t num_relations,
                                                int64_t num_pairs, int64_t pairs_per_tile, int64_t tile) {
  if (tile >= tile_ptr[num_relations]) return {false, 0, 0, 0};
  // Invariant tile_ptr[lo] <= tile < tile_ptr[hi]; ends at the last relation starting at or before
  // `tile`, which is non-empty because its successor's offset is larger.
  int64_t lo = 0, hi = num_relations;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (tile_ptr[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const PairRange pr = relation_pairs(rel_ptr, lo, num_pairs);
  const int64_t begin = pr.begin + (tile - tile_ptr[lo]) * pairs_per_tile;
  return {true, lo, begin, min(begin + pairs_per_tile, pr.end)};
}

// Tile `tile` of the target_tiles schedule of relation_tile_offsets, found by one warp (all 32 lanes
// call it; every lane gets the result) straight from rel_ptr, without a schedule launch: a warp scan
// of the relations' tile counts, 32 relations at a time. With `schedule` non-null the warp also
// writes the whole schedule there in tile_ptr's layout.
__device__ __forceinline__ PairTile own_pair_tile(const int64_t* __restrict__ rel_ptr, int64_t num_relations,
                                                  int64_t num_pairs, int64_t target_tiles, int64_t granule,
                                                  int64_t tile, int64_t* __restrict__ schedule) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t per_tile = target_tile_size(rel_ptr, num_relations, num_pairs, target_tiles, granule);
  if (schedule && lane == 0) schedule[0] = 0, schedule[num_relations + 1] = per_tile;
  PairTile found{false, 0, 0, 0};
  int64_t carry = 0;
  for (int64_t base = 0; base < num_relations; base += 32) {
    const int64_t r = base + lane;
    PairRange pr{0, 0};
    int64_t tiles = 0;
    if (r < num_relations) {
      pr = relation_pairs(rel_ptr, r, num_pairs);
      tiles = (pr.end - pr.begin + per_tile - 1) / per_tile;
    }
    int64_t inclusive = tiles;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int64_t v = __shfl_up_sync(kAll, inclusive, d);
      if (lane >= d) inclusive += v;
    }
    const int64_t first = carry + inclusive - tiles;
    if (schedule && r < num_relations) schedule[r + 1] = carry + inclusive;
    if (tile >= first && tile < first + tiles) {
      const int64_t begin = pr.begin + (tile - first) * per_tile;
      found = {true, r, begin, min(begin + per_tile, pr.end)};
    }
    carry += __shfl_sync(kAll, inclusive, 31);
  }
  const unsigned owner = __ballot_sync(kAll, found.valid);
  if (owner == 0) return found;
  const int src = __ffs(owner) - 1;
  return {true, __shfl_sync(kAll, found.relation, src), __shfl_sync(kAll, found.begin, src),
          __shfl_sync(kAll, found.end, src)};
}

}  // namespace relconv::cuda
