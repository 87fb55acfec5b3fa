// CPU build of a typed graph's relational map (relconv.graph.build_rgcn_map), the CUDA op's twin:
// the edges sorted stably by (relation, target) in two counting passes (by target, then by
// relation, whose counts are the relation offsets), the mean scales from the runs of equal keys, and
// the range checks as an error word, in one op and O(E + num_dst + R) where torch ops took a stable
// sort and a dozen more ops.
#include "common/error_message.h"
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/typed_edge_map_checks.h"

namespace relconv {
namespace {

// Bits of the error word: which argument holds a value out of range (as the CUDA op's).
enum : int64_t { kBadRelation = 1, kBadSource = 2, kBadTarget = 4 };

using EdgeMap = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t>;

// Stable counting sort of `order` (edge ids) by `digit(e)` in [0, buckets) into `sorted`; `start`
// ([buckets + 1] int64) receives the buckets' start offsets. The buffers are tensors: a bucket count
// too large for memory raises torch's allocation error, which names the size.
template <typename V, typename Digit>
void counting_sort(const V* order, int64_t n, int64_t buckets, Digit digit, V* sorted, const at::Tensor& start) {
  int64_t* first = start.mutable_data_ptr<int64_t>();
  std::fill(first, first + buckets + 1, int64_t{0});
  for (int64_t i = 0; i < n; ++i) ++first[digit(order[i]) + 1];
  for (int64_t b = 0; b < buckets; ++b) first[b + 1] += first[b];
  const at::Tensor cursor = start.narrow(0, 0, buckets).clone();
  int64_t* next = cursor.mutable_data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) sorted[next[digit(order[i])]++] = order[i];
}

template <typename E, typename R, typename V, typename I>
EdgeMap build(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& rel, int64_t num_src, int64_t num_dst,
              int64_t num_rel, bool mean) {
  const int64_t n = src.numel();
  const E* s = src.const_data_ptr<E>();
  const E* d = dst.const_data_ptr<E>();
  const R* r = rel.const_data_ptr<R>();
  const auto opts = src.options();
  const auto v_type = std::is_same_v<V, int32_t> ? at::kInt : at::kLong;
  // An edge out of range sorts as (relation 0, target 0), as on the GPU: the caller raises before
  // anything reads the map.
  std::atomic<int64_t> error{0};
  at::parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
    int64_t bad = 0;
    for (int64_t e = lo; e < hi; ++e) {
      bad |= (r[e] < 0 || r[e] >= num_rel ? kBadRelation : 0) | (s[e] < 0 || s[e] >= num_src ? kBadSource : 0) |
             (d[e] < 0 || d[e] >= num_dst ? kBadTarget : 0);
    }
    if (bad != 0) error.fetch_or(bad);
  });
  const bool checked = error.load() == 0;
  const auto target = [&](V e) -> int64_t { return checked || (d[e] >= 0 && d[e] < num_dst) ? d[e] : 0; };
  const auto relation = [&](V e) -> int64_t { return checked || (r[e] >= 0 && r[e] < num_rel) ? r[e] : 0; };

  std::vector<V> ids(n), by_target(n);
  for (int64_t e = 0; e < n; ++e) ids[e] = static_cast<V>(e);
  const auto longs = opts.dtype(at::kLong);
  if (num_dst <= std::max<int64_t>(4 * n, 1 << 16)) {
    counting_sort(ids.data(), n, num_dst, target, by_target.data(), at::empty({num_dst + 1}, longs));
  } else {
    // Far more targets than edges (a sampled subgraph of a large graph): a counting pass would walk
    // every target; a merge sort by target walks the edges.
    by_target = ids;
    std::stable_sort(by_target.begin(), by_target.end(), [&](V a, V b) { return target(a) < target(b); });
  }
  at::Tensor perm = at::empty({n}, opts.dtype(v_type));
  V* p = perm.mutable_data_ptr<V>();
  at::Tensor rel_ptr = at::empty({num_rel + 1}, longs);
  counting_sort(by_target.data(), n, num_rel, relation, p, rel_ptr);
  const int64_t* offsets = rel_ptr.const_data_ptr<int64_t>();
  const auto i_type = std::is_same_v<I, int32_t> ? at::kInt : at::kLong;
  at::Tensor in_index = at::empty({n}, opts.dtype(i_type)), out_index = at::empty({n}, opts.dtype(i_type));
  I* in = in_index.mutable_data_ptr<I>();
  I* out = out_index.mutable_data_ptr<I>();
  at::parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t q = lo; q < hi; ++q) {
      in[q] = static_cast<I>(s[p[q]]);
      out[q] = static_cast<I>(d[p[q]]);
    }
  });
  at::Tensor scale = at::empty({mean ? n : 0}, opts.dtype(at::kFloat));
  if (mean) {
    // 1 / the length of each run of equal targets in a relation's segment of the sorted pairs (a
    // map with values out of range is meaningless, and its caller raises).
    float* sc = scale.mutable_data_ptr<float>();
    at::parallel_for(0, num_rel, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        for (int64_t q = offsets[b]; q < offsets[b + 1];) {
          int64_t end = q + 1;
          while (end < offsets[b + 1] && out[end] == out[q]) ++end;
          const float inv = 1.f / static_cast<float>(end - q);
          for (; q < end; ++q) sc[q] = inv;
        }
      }
    });
  }
  return {in_index, out_index, rel_ptr, scale, perm, error.load()};
}

EdgeMap typed_edge_map_cpu(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& edge_type,
                           int64_t num_src, int64_t num_dst, int64_t num_relations, bool mean,
                           at::ScalarType index_dtype) {
  check_typed_edge_map_args(src, dst, edge_type, num_src, num_dst, num_relations, index_dtype);
  const at::Tensor s = src.contiguous(), d = dst.contiguous(), r = edge_type.contiguous();
  const bool narrow_ids = s.numel() <= std::numeric_limits<int32_t>::max();
  return AT_DISPATCH_INDEX_TYPES(s.scalar_type(), "typed_edge_map", [&] {
    using E = index_t;
    return AT_DISPATCH_INDEX_TYPES(r.scalar_type(), "typed_edge_map", [&]() -> EdgeMap {
      using R = index_t;
      if (narrow_ids && index_dtype == at::kInt) return build<E, R, int32_t, int32_t>(s, d, r, num_src, num_dst, num_relations, mean);
      if (narrow_ids) return build<E, R, int32_t, int64_t>(s, d, r, num_src, num_dst, num_relations, mean);
      return build<E, R, int64_t, int64_t>(s, d, r, num_src, num_dst, num_relations, mean);
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CPU, m) { m.impl("typed_edge_map", &typed_edge_map_cpu); }

}  // namespace relconv
