#pragma once
// GPU hash table over voxel coordinates, keyed by the coordinate row itself.
//
// A slot holds the int32 index of a row of an `[N, 4]` int32 (batch, x, y, z) coordinate array, or
// kEmptySlot. Keys are never packed: a probe compares the four int32 of the stored row with the
// query, so any int32 coordinates work and no coordinate bounds (a host read) are needed. Open
// addressing with linear probing in a power-of-two table kept at most half full; the table is
// only ever filled by one insert kernel and read afterwards, so lookups need no atomics.
#include <cstdint>

namespace relconv::cuda {

constexpr int32_t kEmptySlot = -1;

// Bits of the device error words the kernels raise (read once per coordinate set). The word of
// hash_insert_rows starts all ones and has a bit CLEARED per problem (it shares the hash table's
// one 0xFF memset); readers invert it.
constexpr int32_t kErrDuplicate = 1;      // two rows hold the same (batch, x, y, z)
constexpr int32_t kErrNegativeBatch = 2;  // a batch index below zero
constexpr int32_t kErrOverflow = 4;       // a strided output coordinate left the int32 range

constexpr int kMapThreads = 256;

struct Coord {
  int32_t b, x, y, z;
};

// Rows are 16 bytes; the wrappers guarantee 16-byte alignment, so one vector load reads a row.
__device__ __forceinline__ Coord load_coord(const int32_t* coords, int64_t row) {
  const int4 v = __ldg(reinterpret_cast<const int4*>(coords) + row);
  return Coord{v.x, v.y, v.z, v.w};
}

__device__ __forceinline__ bool same(const Coord& a, const Coord& b) {
  return a.b == b.b && a.x == b.x && a.y == b.y && a.z == b.z;
}

// Neighbouring voxels differ in one low bit of one field; the multiply-xorshift finaliser spreads
// that over the whole word so linear probing sees no clustering along scan lines.
__device__ __forceinline__ uint32_t hash_coord(const Coord& c) {
  uint64_t h = static_cast<uint64_t>(static_cast<uint32_t>(c.b)) * 0x9E3779B97F4A7C15ull;
  h += static_cast<uint64_t>(static_cast<uint32_t>(c.x)) * 0xC2B2AE3D27D4EB4Full;
  h += static_cast<uint64_t>(static_cast<uint32_t>(c.y)) * 0x165667B19E3779F9ull;
  h += static_cast<uint64_t>(static_cast<uint32_t>(c.z)) * 0x27D4EB2F165667C5ull;
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 33;
  return static_cast<uint32_t>(h);
}

struct HashView {
  const int32_t* coords;  // the rows the slots point into
  const int32_t* slots;   // [mask + 1]
  uint32_t mask;

  // Row holding `c`, or -1. Terminates because the table always has empty slots.
  __device__ __forceinline__ int32_t find(const Coord& c) const {
    uint32_t s = hash_coord(c) & mask;
    while (true) {
      const int32_t row = slots[s];
      if (row == kEmptySlot) return -1;
      if (same(load_coord(coords, row), c)) return row;
      s = (s + 1) & mask;
    }
  }
};

// One thread per row: claims an empty slot with CAS. A slot already holding an equal row means a
// duplicate coordinate; the row is then left out and the (inverted) error word says so. Negative batch
// indices are flagged here too, so validating a new coordinate set costs this kernel and one read.
__global__ void hash_insert_rows(const int32_t* __restrict__ coords, int64_t n, int32_t* __restrict__ slots,
                                 uint32_t mask, int32_t* __restrict__ error) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const Coord c = load_coord(coords, i);
  if (c.b < 0) atomicAnd(error, ~kErrNegativeBatch);
  uint32_t s = hash_coord(c) & mask;
  while (true) {
    const int32_t old = atomicCAS(slots + s, kEmptySlot, static_cast<int32_t>(i));
    if (old == kEmptySlot) return;
    if (same(load_coord(coords, old), c)) {
      atomicAnd(error, ~kErrDuplicate);
      return;
    }
    s = (s + 1) & mask;
  }
}

// Like hash_insert_rows, but equal rows are expected (many fine voxels share one coarse site) and
// the slot keeps the SMALLEST row holding the key: that row stands for the site, which makes the
// output order of strided coordinates deterministic (first occurrence in input row order). Other
// threads probing past the slot meanwhile compare against an equal key whichever row it holds.
__global__ void hash_insert_min_rows(const int32_t* __restrict__ coords, int64_t n, int32_t* __restrict__ slots,
                                     uint32_t mask) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const Coord c = load_coord(coords, i);
  uint32_t s = hash_coord(c) & mask;
  while (true) {
    const int32_t old = atomicCAS(slots + s, kEmptySlot, static_cast<int32_t>(i));
    if (old == kEmptySlot) return;
    if (same(load_coord(coords, old), c)) {
      atomicMin(slots + s, static_cast<int32_t>(i));
      return;
    }
    s = (s + 1) & mask;
  }
}

}  // namespace relconv::cuda
