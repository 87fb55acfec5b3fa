#pragma once
// Kernels of the grid conv map (grid_map.cu): the output sites and neighbour table of a regular or
// transposed convolution on a bounded grid, where an output grid point o and an input point i meet
// through kernel index r when i = o * stride - padding + r * dilation (regular) or o = i * stride -
// padding + r * dilation (transposed), per axis, inside the grids' extents. This is the dense conv's
// own geometry, the one spconv's layers keep, and unlike relconv's native strided map (outputs at
// floor(p / stride) * stride) its output sites depend on the kernel and the padding.
#include <cstdint>

#include "cuda/kernel_map_hash.cuh"

namespace relconv::cuda {

// A coordinate outside its grid (or a batch index outside [0, batch_size)); cleared in the shared
// inverted error word next to hash_insert_rows' bits.
constexpr int32_t kErrOutsideGrid = 8;

// One axis of an affine step between the grids: point c reaches t = (c * scale + base + r * step) /
// div through kernel index r, when the division is exact and 0 <= t < limit. Input to output and
// output to input are both of this form (grid_map.cu sets the four coefficients).
struct GridAxis {
  int64_t scale, base, step, div, limit;

  // div is 1 on one side of every map (no division) and the stride on the other; a negative
  // numerator reaches nothing, and the rest divide in 32 bits while they fit (a 64-bit division is
  // a long instruction sequence, and these kernels run a few per thread).
  __device__ __forceinline__ bool reach(int32_t c, int32_t r, int32_t& t) const {
    const int64_t num = c * scale + base + r * step;
    if (num < 0) return false;
    int64_t q = num;
    if (div != 1) {
      if (num <= UINT32_MAX) {
        const auto u = static_cast<uint32_t>(num), d = static_cast<uint32_t>(div);
        q = u / d;
      } else {
        q = num / div;
      }
      if (q * div != num) return false;
    }
    if (q >= limit) return false;
    t = static_cast<int32_t>(q);
    return true;
  }
};

struct GridStep {
  GridAxis axis[3];
  int32_t size[3];  // kernel size per axis; index r has the first axis slowest (spconv's weight order)
  int32_t volume;

  __device__ __forceinline__ bool reach(const Coord& c, int32_t r, Coord& t) const {
    const int32_t r2 = r % size[2], r01 = r / size[2];
    const int32_t r1 = r01 % size[1], r0 = r01 / size[1];
    t.b = c.b;
    return axis[0].reach(c.x, r0, t.x) && axis[1].reach(c.y, r1, t.y) && axis[2].reach(c.z, r2, t.z);
  }
};

// The source grid's bounds, checked on every input row.
struct GridBounds {
  int64_t batch_size, extent[3];

  __device__ __forceinline__ bool contains(const Coord& c) const {
    return c.b >= 0 && c.b < batch_size && c.x >= 0 && c.x < extent[0] && c.y >= 0 && c.y < extent[1] &&
           c.z >= 0 && c.z < extent[2];
  }
};

// Output sites as int64 keys ((b * L0 + t0) * L1 + t1) * L2 + t2 over the output extents L (the host
// checks they fit 62 bits): sorting the keys sorts the sites by (batch, t0, t1, t2).
struct SiteKeys {
  int64_t extent[3];

  __device__ __forceinline__ unsigned long long key(const Coord& t) const {
    return static_cast<unsigned long long>(((t.b * extent[0] + t.x) * extent[1] + t.y) * extent[2] + t.z);
  }
  __device__ __forceinline__ int4 coord(unsigned long long key) const {
    auto k = static_cast<int64_t>(key);
    const auto z = static_cast<int32_t>(k % extent[2]);
    k /= extent[2];
    const auto y = static_cast<int32_t>(k % extent[1]);
    k /= extent[1];
    const auto x = static_cast<int32_t>(k % extent[0]);
    return make_int4(static_cast<int32_t>(k / extent[0]), x, y, z);
  }
};

constexpr unsigned long long kEmptyKey = ~0ull;  // all ones: one 0xFF memset empties the set

// murmur3's 64-bit finaliser, folded to the slot bits.
__device__ __forceinline__ uint32_t hash_key(unsigned long long k) {
  k ^= k >> 33;
  k *= 0xFF51AFD7ED558CCDull;
  k ^= k >> 33;
  k *= 0xC4CEB9FE1A85EC53ull;
  k ^= k >> 33;
  return static_cast<uint32_t>(k);
}

// The output sites as an open-addressing set of keys (linear probing; the set never fills: the host
// sizes it above the number of candidates). The CAS alone: reading the slot first, to skip the atomic
// for keys already there, was no faster (H200, the sites kernels of three backbones' four strided
// maps: 345 / 156 / 122 us with the read, 339 / 153 / 117 without).
struct SiteKeySet {
  unsigned long long* __restrict__ set;
  uint32_t mask;

  __device__ __forceinline__ void add(unsigned long long key) const {
    uint32_t s = hash_key(key) & mask;
    while (true) {
      const unsigned long long old = atomicCAS(set + s, kEmptyKey, key);
      if (old == kEmptyKey || old == key) return;
      s = (s + 1) & mask;
    }
  }
};

// The output sites as bits over the output grid's key space, cleared for a site (the 0xFF memset
// that presets the hash slots presets them too): a scan of the words' site counts then ranks the
// sites in key order, with no select and no sort of the keys.
struct SiteBits {
  uint32_t* __restrict__ bits;

  __device__ __forceinline__ void add(unsigned long long key) const {
    atomicAnd(bits + (key >> 5), ~(1u << (key & 31)));
  }
};

// The sites a word of SiteBits holds.
struct SitesInWord {
  __host__ __device__ __forceinline__ int32_t operator()(uint32_t word) const {
#ifdef __CUDA_ARCH__
    return __popc(~word);
#else
    return __builtin_popcount(~word);
#endif
  }
};

// One thread per (input row, kernel index), the index fastest (the host keeps n * volume below 2^31,
// so the thread index splits in 32 bits): every output site an input reaches goes into the key set,
// and the index-0 thread of each row inserts the row into the input hash (`slots`, which the table
// kernel reads; duplicates clear kErrDuplicate). Rows outside the input grid clear kErrOutsideGrid
// and reach nothing.
template <typename Sites>
__global__ void grid_sites_kernel(const int32_t* __restrict__ coords, int64_t n, GridBounds bounds, GridStep step,
                                  int32_t* __restrict__ slots, SlotLayout layout, SiteKeys keys, Sites sites,
                                  int32_t* __restrict__ error) {
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * step.volume) return;
  const uint32_t i = t / static_cast<uint32_t>(step.volume);
  const auto r = static_cast<int32_t>(t - i * static_cast<uint32_t>(step.volume));
  if (r == 0) insert_row(coords, i, slots, layout, error);
  const Coord c = load_coord(coords, i);
  if (!bounds.contains(c)) {
    if (r == 0) atomicAnd(error, ~kErrOutsideGrid);
    return;
  }
  Coord o;
  if (step.reach(c, r, o)) sites.add(keys.key(o));
}

struct IsSiteKey {
  __host__ __device__ __forceinline__ bool operator()(unsigned long long k) const { return k != kEmptyKey; }
};

// out[m] = the site of sorted key m.
__global__ void site_coords_kernel(const unsigned long long* __restrict__ sorted, int64_t m, SiteKeys keys,
                                   int32_t* __restrict__ out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < m) reinterpret_cast<int4*>(out)[j] = keys.coord(sorted[j]);
}

// out[rank] = the site of each cleared bit of SiteBits, one thread per word; `ranks` holds the
// inclusive scan of the words' site counts.
__global__ void site_coords_from_bits_kernel(const uint32_t* __restrict__ bits, const int32_t* __restrict__ ranks,
                                             int64_t words, SiteKeys keys, int32_t* __restrict__ out) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= words) return;
  uint32_t present = ~bits[w];
  int32_t rank = ranks[w] - __popc(present);
  while (present != 0) {
    const int bit = __ffs(present) - 1;
    reinterpret_cast<int4*>(out)[rank++] = keys.coord((static_cast<unsigned long long>(w) << 5) | bit);
    present &= present - 1;
  }
}

// table[m, r] = the input row that output site m reads through kernel index r, or -1. One thread per
// entry, r fastest (a warp writes consecutive entries and re-reads one site from cache).
// The host keeps m * volume below 2^31, so the entry index splits in 32 bits.
__global__ void grid_table_kernel(HashView in, const int32_t* __restrict__ sites, int64_t m, GridStep back,
                                  int32_t* __restrict__ table) {
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= m * back.volume) return;
  const uint32_t o = t / static_cast<uint32_t>(back.volume);
  const auto r = static_cast<int32_t>(t - o * static_cast<uint32_t>(back.volume));
  Coord q;
  table[t] = back.reach(load_coord(sites, o), r, q) ? in.find(q) : -1;
}

}  // namespace relconv::cuda
