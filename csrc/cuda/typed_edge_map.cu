// CUDA build of a typed graph's relational map (relconv.graph.build_rgcn_map): the edges sorted by
// (relation, target), their range checks, the relation offsets and the mean scales. Four launches
// (a memset, the key kernel, CUB's radix sort over only the key bits in use, the pair kernel) and
// one host wait, for the range check's word, which the host reads while the sort runs. The same
// build in torch ops took about thirty launches, which set the cost of a forward whose map is built
// in the call on small graphs. Its CPU twin is cpu/typed_edge_map.cpp.
#include "common/error_message.h"
#include "common/typed_edge_map_checks.h"
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <limits>
#include <tuple>
#include <type_traits>

#include "cuda/device_buffers.h"
#include "cuda/kernel_launch.h"

namespace relconv {
namespace {

constexpr int kThreads = 256;

// Bits of the error word: which argument holds a value out of range.
enum : int32_t { kBadRelation = 1, kBadSource = 2, kBadTarget = 4 };

// key = relation * num_dst + target and id = e for edge e. An edge out of range gets key 0 (the
// host raises before anything reads the map) and sets its bits of the error word.
template <typename E, typename R, typename K, typename V>
__global__ void edge_keys_kernel(const E* __restrict__ src, const E* __restrict__ dst, const R* __restrict__ rel,
                                 int64_t n, int64_t num_src, int64_t num_dst, int64_t num_rel, K* __restrict__ keys,
                                 V* __restrict__ ids, int32_t* __restrict__ error) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= n) return;
  const int64_t s = src[e], d = dst[e], r = rel[e];
  const int32_t bad = (r < 0 || r >= num_rel ? kBadRelation : 0) | (s < 0 || s >= num_src ? kBadSource : 0) |
                      (d < 0 || d >= num_dst ? kBadTarget : 0);
  if (bad != 0) atomicOr(error, bad);
  keys[e] = bad != 0 ? K{0} : static_cast<K>(r * num_dst + d);
  ids[e] = static_cast<V>(e);
}

// First position in keys[lo, hi) whose key is not below `value` (keys ascending).
template <typename K>
__device__ int64_t first_not_below(const K* __restrict__ keys, int64_t lo, int64_t hi, K value) {
  while (lo < hi) {
    const int64_t mid = lo + ((hi - lo) >> 1);
    if (keys[mid] < value) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// First position in keys[lo, hi) whose key is above `value`.
template <typename K>
__device__ int64_t first_above(const K* __restrict__ keys, int64_t lo, int64_t hi, K value) {
  while (lo < hi) {
    const int64_t mid = lo + ((hi - lo) >> 1);
    if (keys[mid] <= value) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Length of the run of keys equal to keys[p]: gallop from p each way (1, 2, 4, ... positions) until
// a different key brackets the run's end, then bisect the bracket. O(log run length) reads, the
// first of them beside p, where a search of the whole array costs O(log E) scattered reads (most
// slots hold one or two edges; on a 12M-edge graph the whole-array searches took 0.74 ms).
template <typename K>
__device__ int64_t run_length(const K* __restrict__ keys, int64_t n, int64_t p) {
  const K k = keys[p];
  int64_t first = p, probe = p - 1;
  for (int64_t step = 1; probe >= 0 && keys[probe] == k; probe = p - step) {
    first = probe;
    step <<= 1;
  }
  first = first_not_below(keys, probe < 0 ? 0 : probe + 1, first, k);  // probe < 0 or keys[probe] < k
  int64_t last = p;
  probe = p + 1;
  for (int64_t step = 1; probe < n && keys[probe] == k; probe = p + step) {
    last = probe;
    step <<= 1;
  }
  return first_above(keys, last + 1, probe < n ? probe : n, k) - first;  // probe >= n or keys[probe] > k
}

// Pair p of the sorted order: its input and output rows, and for a mean map 1 / the length of its
// (target, relation) slot, the run of equal keys around p (a scatter-add of slot sizes would
// serialise its atomics on a high-degree slot). Threads p <= R also write the relation offsets,
// each a search for the relation's first key.
template <typename E, typename K, typename V, typename I>
__global__ void sorted_pairs_kernel(const E* __restrict__ src, const E* __restrict__ dst, const K* __restrict__ keys,
                                    const V* __restrict__ ids, int64_t n, int64_t num_dst, int64_t num_rel,
                                    I* __restrict__ in_index, I* __restrict__ out_index, int64_t* __restrict__ rel_ptr,
                                    float* __restrict__ scale) {
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p <= num_rel) rel_ptr[p] = p == num_rel ? n : first_not_below(keys, 0, n, static_cast<K>(p * num_dst));
  if (p >= n) return;
  const int64_t e = ids[p];
  in_index[p] = static_cast<I>(src[e]);
  out_index[p] = static_cast<I>(dst[e]);
  if (scale != nullptr) scale[p] = 1.f / static_cast<float>(run_length(keys, n, p));
}

unsigned blocks_for(int64_t n) { return launch::blocks_for(n, kThreads, "typed_edge_map"); }

using EdgeMap = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t>;

template <typename E, typename R, typename K, typename V, typename I>
EdgeMap build(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& rel, int64_t num_src, int64_t num_dst,
              int64_t num_rel, bool mean, cudaStream_t stream) {
  const int64_t n = src.numel();
  const auto opts = src.options();
  const auto bytes = opts.dtype(at::kByte);
  const auto v_type = std::is_same_v<V, int32_t> ? at::kInt : at::kLong;
  at::Tensor ids[2] = {at::empty({n}, opts.dtype(v_type)), at::empty({n}, opts.dtype(v_type))};
  // Both key buffers and the error word in one allocation; CUB's scratch in a second, sized by CUB.
  const int64_t key_bytes = 2 * n * static_cast<int64_t>(sizeof(K));
  at::Tensor scratch = at::empty({key_bytes + 8}, bytes);
  K* keys = reinterpret_cast<K*>(scratch.mutable_data_ptr<uint8_t>());
  auto* error = reinterpret_cast<int32_t*>(scratch.mutable_data_ptr<uint8_t>() + key_bytes);
  C10_CUDA_CHECK(cudaMemsetAsync(error, 0, sizeof(int32_t), stream));
  edge_keys_kernel<E, R, K, V><<<blocks_for(n), kThreads, 0, stream>>>(
      src.const_data_ptr<E>(), dst.const_data_ptr<E>(), rel.const_data_ptr<R>(), n, num_src, num_dst, num_rel, keys,
      ids[0].mutable_data_ptr<V>(), error);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const DeferredWordRead check(error, stream);

  cub::DoubleBuffer<K> key_buf(keys, keys + n);
  cub::DoubleBuffer<V> id_buf(ids[0].mutable_data_ptr<V>(), ids[1].mutable_data_ptr<V>());
  // Sort only the bits a key can hold: the largest is num_rel * num_dst - 1 (at least one bit).
  const auto largest_key = static_cast<uint64_t>(num_rel * num_dst) - 1;
  const int end_bit = 64 - __builtin_clzll(largest_key | 1);
  size_t temp_bytes = 0;
  const auto sort = [&](void* temp) {
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, key_buf, id_buf, static_cast<V>(n), 0, end_bit,
                                                   stream));
  };
  sort(nullptr);
  at::Tensor temp = at::empty({static_cast<int64_t>(temp_bytes)}, bytes);
  sort(temp.mutable_data_ptr());
  const at::Tensor perm = ids[id_buf.selector];

  const auto i_opts = opts.dtype(std::is_same_v<I, int32_t> ? at::kInt : at::kLong);
  at::Tensor in_index = at::empty({n}, i_opts), out_index = at::empty({n}, i_opts);
  at::Tensor rel_ptr = at::empty({num_rel + 1}, opts.dtype(at::kLong));
  at::Tensor scale = at::empty({mean ? n : 0}, opts.dtype(at::kFloat));
  sorted_pairs_kernel<E, K, V, I><<<blocks_for(std::max(n, num_rel + 1)), kThreads, 0, stream>>>(
      src.const_data_ptr<E>(), dst.const_data_ptr<E>(), key_buf.Current(), perm.const_data_ptr<V>(), n, num_dst,
      num_rel, in_index.mutable_data_ptr<I>(), out_index.mutable_data_ptr<I>(), rel_ptr.mutable_data_ptr<int64_t>(),
      mean ? scale.mutable_data_ptr<float>() : nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {in_index, out_index, rel_ptr, scale, perm, *check.wait()};
}

template <typename E, typename R>
EdgeMap build_keyed(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& rel, int64_t num_src,
                    int64_t num_dst, int64_t num_rel, bool mean, at::ScalarType index_dtype, cudaStream_t stream) {
  const bool narrow_keys = num_rel * num_dst <= (int64_t{1} << 32);
  const bool narrow_ids = src.numel() <= std::numeric_limits<int32_t>::max();
  const bool narrow_index = index_dtype == at::kInt;
#define RELCONV_EDGE_MAP(K, V, I) \
  return build<E, R, K, V, I>(src, dst, rel, num_src, num_dst, num_rel, mean, stream)
  if (narrow_keys && narrow_ids) {
    if (narrow_index) RELCONV_EDGE_MAP(uint32_t, int32_t, int32_t);
    RELCONV_EDGE_MAP(uint32_t, int32_t, int64_t);
  }
  if (narrow_ids) {
    if (narrow_index) RELCONV_EDGE_MAP(uint64_t, int32_t, int32_t);
    RELCONV_EDGE_MAP(uint64_t, int32_t, int64_t);
  }
  if (narrow_keys) RELCONV_EDGE_MAP(uint32_t, int64_t, int64_t);
  RELCONV_EDGE_MAP(uint64_t, int64_t, int64_t);
#undef RELCONV_EDGE_MAP
}

EdgeMap typed_edge_map_cuda(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& edge_type,
                            int64_t num_src, int64_t num_dst, int64_t num_relations, bool mean,
                            at::ScalarType index_dtype) {
  check_typed_edge_map_args(src, dst, edge_type, num_src, num_dst, num_relations, index_dtype);
  RELCONV_CHECK_VALUE(src.is_cuda(), "typed_edge_map: src, dst and edge_type must be CUDA tensors here, got ",
                      src.device());
  const c10::cuda::CUDAGuard guard(src.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t n = src.numel();
  if (n == 0) {
    const auto opts = src.options();
    return {at::empty({0}, opts.dtype(index_dtype)), at::empty({0}, opts.dtype(index_dtype)),
            memset_tensor({num_relations + 1}, opts.dtype(at::kLong), 0, stream),
            at::empty({0}, opts.dtype(at::kFloat)), at::empty({0}, opts.dtype(at::kLong)), 0};
  }
  const at::Tensor s = src.contiguous(), d = dst.contiguous(), r = edge_type.contiguous();
  return AT_DISPATCH_INDEX_TYPES(s.scalar_type(), "typed_edge_map", [&] {
    using E = index_t;
    return AT_DISPATCH_INDEX_TYPES(r.scalar_type(), "typed_edge_map", [&] {
      return build_keyed<E, index_t>(s, d, r, num_src, num_dst, num_relations, mean, index_dtype, stream);
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CUDA, m) { m.impl("typed_edge_map", &typed_edge_map_cuda); }

}  // namespace relconv
