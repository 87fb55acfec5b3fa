#pragma once
// GPU hash table over voxel coordinates, keyed by the coordinate row itself.
//
// A slot is one int32: kEmptySlot, or a row index of an `[N, 4]` int32 (batch, x, y, z) coordinate
// array in the low `row_bits` bits under a tag (bits of the key's hash that did not pick the slot)
// in the bits above, the sign bit staying 0. Keys are never packed: a probe that finds a slot with
// its tag compares the four int32 of the stored row with the query, so any int32 coordinates work
// and no coordinate bounds (a host read) are needed. The tag is why probes are cheap: a probe reads
// the coordinate row (a second random read, from DRAM once a scene outgrows the L2 cache) only for
// slots whose tag matches, almost always the key itself, instead of for every occupied slot it
// passes. With capacity 2^k, rows need k - 1 bits (the table is at most half full), which leaves
// 32 - k tag bits in the same 4 bytes: 9 bits for a 3.5M-voxel scene, so the table costs no more
// memory than plain row indices. Open addressing with linear probing in a power-of-two table; the
// table is only ever filled by one insert kernel and read afterwards, so lookups need no atomics.
// Device functions only: several translation units include this header (kernel_map.cu, grid_map.cu),
// and a __global__ function defined here would be defined in each of them; the kernels that insert
// are in kernel_map_query.cuh.
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

// Neighbouring voxels differ in one low bit of one field: a multiply-add of the fields by odd
// constants, then murmur3's 32-bit finaliser, spreads that over the whole word so linear probing
// sees no clustering along scan lines. The low bits pick the slot, the bits above give the tag
// (slot and tag bits together are 32 at any capacity). A 64-bit hash took twice the instructions in
// the table kernels, which are issue-bound once the slots stay in L2 (ncu, 3.5M voxels: SM 68%).
__device__ __forceinline__ uint32_t hash_coord(const Coord& c) {
  uint32_t h = static_cast<uint32_t>(c.b) * 0x27D4EB2Fu + static_cast<uint32_t>(c.x) * 0x9E3779B1u +
               static_cast<uint32_t>(c.y) * 0x85EBCA77u + static_cast<uint32_t>(c.z) * 0xC2B2AE3Du;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// Slot layout of a table of capacity mask + 1 = 2^k (see the top of this file), built on the host.
struct SlotLayout {
  uint32_t mask;
  int32_t row_bits;  // k - 1

  // Slots of a table over `rows` rows: the smallest power of two >= 2 * rows (at least 32), so the
  // table stays at most half full, which the row bits above rely on.
  static int64_t capacity_for(int64_t rows) {
    int64_t cap = 32;
    while (cap < 2 * rows) cap *= 2;
    return cap;
  }
  static SlotLayout of_capacity(int64_t capacity) {
    int32_t k = 0;
    while ((int64_t{1} << k) < capacity) ++k;
    return SlotLayout{static_cast<uint32_t>(capacity - 1), k - 1};
  }
  __device__ __forceinline__ uint32_t first(uint32_t h) const { return h & mask; }
  __device__ __forceinline__ int32_t entry(uint32_t h, int64_t row) const {
    // The 31 - row_bits bits above the slot's (a 64-bit shift: row_bits + 1 reaches 32 at 2^32 slots).
    const auto tag = static_cast<uint32_t>(uint64_t{h} >> (row_bits + 1));
    return static_cast<int32_t>(tag << row_bits | static_cast<uint32_t>(row));
  }
  __device__ __forceinline__ int32_t row(int32_t e) const { return e & ((1 << row_bits) - 1); }
  // Whether slot entry e (not empty) may hold the key whose entries look like `like`.
  __device__ __forceinline__ bool same_tag(int32_t e, int32_t like) const { return (e ^ like) >> row_bits == 0; }
};

struct HashView {
  const int32_t* coords;  // the rows the slots point into
  const int32_t* slots;   // [layout.mask + 1]
  SlotLayout layout;
  int64_t num_rows;  // coords rows: a slot table built for other coordinates gives misses, not stray reads

  // Row holding `c`, or -1. Terminates because the table always has empty slots. kInKernel: the
  // slots were filled earlier in the same kernel (fused_submanifold_map, behind a grid barrier), so
  // they are read with plain loads, which the barrier orders, instead of through the read-only
  // cache, which may only serve data constant for the kernel's lifetime. Loads that bypassed L1
  // (ld.cg) made that kernel 41 us on the 64-beam scan, against 27 with these (H100).
  template <bool kInKernel = false>
  __device__ __forceinline__ int32_t find(const Coord& c) const {
    const uint32_t h = hash_coord(c);
    const int32_t like = layout.entry(h, 0);
    uint32_t s = layout.first(h);
    while (true) {
      const int32_t e = kInKernel ? slots[s] : __ldg(slots + s);
      if (e == kEmptySlot) return -1;
      if (layout.same_tag(e, like)) {
        const int32_t row = layout.row(e);
        if (row < num_rows && same(load_coord(coords, row), c)) return row;
      }
      s = (s + 1) & layout.mask;
    }
  }
};

// Linear-probing insert of `mine` (layout.entry of row i's hash h, key c): claims the first empty
// slot with CAS, or stops at a slot already holding an equal key. Returns -1 for a claimed slot, else
// the index of that equal key's slot (whichever row it holds meanwhile).
__device__ __forceinline__ int64_t claim_slot(const int32_t* __restrict__ coords, int32_t* __restrict__ slots,
                                              const SlotLayout& layout, const Coord& c, uint32_t h, int32_t mine) {
  uint32_t s = layout.first(h);
  while (true) {
    const int32_t old = atomicCAS(slots + s, kEmptySlot, mine);
    if (old == kEmptySlot) return -1;
    if (layout.same_tag(old, mine) && same(load_coord(coords, layout.row(old)), c)) return s;
    s = (s + 1) & layout.mask;
  }
}

// One thread per row. A slot already holding an equal row means a duplicate coordinate; the row is
// then left out and the (inverted) error word says so. Negative batch indices are flagged here too,
// so validating a new coordinate set costs this kernel and one read.
__device__ __forceinline__ void insert_row(const int32_t* __restrict__ coords, int64_t i, int32_t* __restrict__ slots,
                                           const SlotLayout& layout, int32_t* __restrict__ error) {
  const Coord c = load_coord(coords, i);
  if (c.b < 0) atomicAnd(error, ~kErrNegativeBatch);
  const uint32_t h = hash_coord(c);
  if (claim_slot(coords, slots, layout, c, h, layout.entry(h, i)) >= 0) atomicAnd(error, ~kErrDuplicate);
}

}  // namespace relconv::cuda
