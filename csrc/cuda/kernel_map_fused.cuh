#pragma once
// A small coordinate set's submanifold map in one cooperative launch: -1 fill of table, hash slots
// and error word, hash insert, and the symmetric table's queries, phases separated by grid-wide
// barriers. The split path (memset, hash_insert_rows, submanifold_table_kernel) costs three host
// API calls, and on a 75k-voxel scan its GPU work (~23 us) is short enough that those calls and the
// idle gaps between the three launches decide the build's latency. The error word is published to
// pinned host memory between the insert and the queries (WordSlot), so a check waits for the insert
// alone and needs no copy, event or stream synchronisation of its own.
#include <cooperative_groups.h>

#include <cstdint>

#include "cuda/kernel_map_hash.cuh"
#include "cuda/kernel_map_query.cuh"

namespace relconv::cuda {

// Where a kernel publishes a final error word for the host: one 8-byte slot of pinned, mapped host
// memory, written as (ticket << 32 | word) in one store so that the host never pairs a ticket with
// another call's word. `host` null: nothing to publish.
struct WordSlot {
  unsigned long long* host;
  uint32_t ticket;
};

// Called by one thread once the word is final (every insert done and visible: a grid barrier or
// the end of the insert kernel). The word is read from L2: this SM never cached it.
__device__ __forceinline__ void publish_word(const WordSlot& slot, const int32_t* error) {
  const auto word = static_cast<uint32_t>(__ldcg(error));
  *reinterpret_cast<volatile unsigned long long*>(slot.host) =
      static_cast<unsigned long long>(slot.ticket) << 32 | word;
}

// The split path's publication: one thread, queued right after hash_insert_rows.
__global__ void publish_word_kernel(WordSlot slot, const int32_t* error) { publish_word(slot, error); }

// The arguments of fused_submanifold_map. `buffer` holds [fill_words] int32: table [n, K], slots and
// the error word (the one-buffer layout of hashed_submanifold_table); nothing in it need be set.
struct FusedMapArgs {
  const int32_t* coords;
  int64_t n;
  int32_t* buffer;
  int64_t fill_words;
  int32_t* slots;
  SlotLayout layout;
  int32_t* error;
  KernelGeometry g;  // symmetric: odd size per axis
  WordSlot publish;
};

// Launched cooperatively with at most as many blocks as fit the GPU at once (grid.sync()); every
// phase loops over its items with the grid's stride. kCube as in submanifold_table_kernel (the
// host keeps n * queries below 2^31).
template <int kCube>
__global__ void __launch_bounds__(kMapThreads) fused_submanifold_map(FusedMapArgs a) {
  namespace cg = cooperative_groups;
  const cg::grid_group grid = cg::this_grid();
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // The caching allocator's blocks are 256-byte aligned: whole int4s, then the tail.
  const int64_t vecs = a.fill_words / 4;
  for (int64_t i = first; i < vecs; i += stride) reinterpret_cast<int4*>(a.buffer)[i] = make_int4(-1, -1, -1, -1);
  for (int64_t i = vecs * 4 + first; i < a.fill_words; i += stride) a.buffer[i] = -1;
  grid.sync();
  for (int64_t i = first; i < a.n; i += stride) insert_row(a.coords, i, a.slots, a.layout, a.error);
  grid.sync();
  if (first == 0 && a.publish.host != nullptr) publish_word(a.publish, a.error);
  const HashView in{a.coords, a.slots, a.layout, a.n};
  auto* table = a.buffer;  // the table leads the buffer
  const int64_t queries = a.n * submanifold_queries(kCube > 0 ? kCube * kCube * kCube : a.g.volume);
  for (int64_t t = first; t < queries; t += stride) submanifold_query<int32_t, kCube, true>(in, a.g, table, t);
}

}  // namespace relconv::cuda
