// CPU kernel of relconv::sorted_key_pairs, the search of relconv.voxel's CPU kernel maps: output o
// meets input i through relation k when key_in[i] = key_out[o] + delta[k] (packed coordinates).
// With both key lists sorted, each relation's queries ascend with the output keys, so one forward
// walk over the input keys answers them all: O(N + M) per relation, relations split across threads,
// where a binary search per query (torch.searchsorted over K * M queries) took O(K M log N) (265k
// voxels, subm 3^3, 4 threads: 240 ms for a fresh layer's map).
#include "common/error_message.h"
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>

namespace relconv {
namespace {

void check_keys(const at::Tensor& keys, const at::Tensor& rows, const char* keys_name, const char* rows_name) {
  RELCONV_CHECK_VALUE(keys.dim() == 1 && keys.scalar_type() == at::kLong, "sorted_key_pairs: ", keys_name,
                      " must be a 1-D int64 tensor, got shape ", keys.sizes(), " and ", keys.scalar_type());
  RELCONV_CHECK_VALUE(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.numel() == keys.numel(),
                      "sorted_key_pairs: ", rows_name, " must be a 1-D int64 tensor with one row per key (",
                      keys.numel(), "), got shape ", rows.sizes(), " and ", rows.scalar_type());
}

template <typename T>
std::tuple<at::Tensor, at::Tensor, at::Tensor> pairs_through_table(const int64_t* ki, const int64_t* pi, int64_t n,
                                                                  const int64_t* ko, const int64_t* po, int64_t m,
                                                                  const int64_t* dk, int64_t r,
                                                                  const at::TensorOptions& opts) {
  at::Tensor table_tensor = at::empty({r, m}, opts.dtype(std::is_same_v<T, int32_t> ? at::kInt : at::kLong));
  T* const table = table_tensor.mutable_data_ptr<T>();
  at::Tensor counts = at::zeros({r + 1}, opts);
  int64_t* c = counts.mutable_data_ptr<int64_t>();
  at::parallel_for(0, r, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      T* row = table + k * m;
      std::fill(row, row + m, T{-1});
      int64_t i = 0, hits = 0;
      for (int64_t j = 0; j < m && i < n; ++j) {
        const int64_t q = ko[j] + dk[k];
        while (i < n && ki[i] < q) ++i;
        if (i < n && ki[i] == q) {
          row[po[j]] = static_cast<T>(pi[i]);
          ++hits;
        }
      }
      c[k + 1] = hits;
    }
  });
  at::Tensor rel_ptr = counts.cumsum(0);
  const int64_t* ptr = rel_ptr.const_data_ptr<int64_t>();
  at::Tensor in_index = at::empty({ptr[r]}, opts), out_index = at::empty({ptr[r]}, opts);
  int64_t* in = in_index.mutable_data_ptr<int64_t>();
  int64_t* out = out_index.mutable_data_ptr<int64_t>();
  at::parallel_for(0, r, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const T* row = table + k * m;
      int64_t p = ptr[k];
      for (int64_t o = 0; o < m; ++o) {
        if (row[o] >= 0) in[p] = row[o], out[p++] = o;
      }
    }
  });
  return {in_index, out_index, rel_ptr};
}

// (in_index, out_index, rel_ptr), int64: the pairs grouped by relation, each relation's outputs in
// ascending row order (the order of torch's search over a [K, M] query grid).
std::tuple<at::Tensor, at::Tensor, at::Tensor> sorted_key_pairs_cpu(const at::Tensor& keys, const at::Tensor& perm,
                                                                   const at::Tensor& out_keys,
                                                                   const at::Tensor& out_perm,
                                                                   const at::Tensor& deltas) {
  check_keys(keys, perm, "keys", "perm");
  check_keys(out_keys, out_perm, "out_keys", "out_perm");
  RELCONV_CHECK_VALUE(deltas.dim() == 1 && deltas.scalar_type() == at::kLong,
                      "sorted_key_pairs: deltas must be a 1-D int64 tensor, got shape ", deltas.sizes(), " and ",
                      deltas.scalar_type());
  const at::Tensor k_in = keys.contiguous(), p_in = perm.contiguous(), k_out = out_keys.contiguous(),
                   p_out = out_perm.contiguous(), d = deltas.contiguous();
  const int64_t n = k_in.numel(), m = k_out.numel(), r = d.numel();
  const int64_t* ki = k_in.const_data_ptr<int64_t>();
  const int64_t* pi = p_in.const_data_ptr<int64_t>();
  const int64_t* ko = k_out.const_data_ptr<int64_t>();
  const int64_t* po = p_out.const_data_ptr<int64_t>();
  const int64_t* dk = d.const_data_ptr<int64_t>();
  const auto rows_in = [](const int64_t* rows, int64_t count) {
    return std::all_of(rows, rows + count, [count](int64_t v) { return v >= 0 && v < count; });
  };
  RELCONV_CHECK_VALUE(rows_in(pi, n), "sorted_key_pairs: perm must hold rows in [0, ", n, ")");
  RELCONV_CHECK_VALUE(rows_in(po, m), "sorted_key_pairs: out_perm must hold rows in [0, ", m, ")");
  // table[k * m + o]: the input row output o reads through relation k, or -1; each relation's row
  // is filled and searched by one thread (in int32 below 2^31 inputs: half the scattered writes).
  if (n <= std::numeric_limits<int32_t>::max()) {
    return pairs_through_table<int32_t>(ki, pi, n, ko, po, m, dk, r, keys.options());
  }
  return pairs_through_table<int64_t>(ki, pi, n, ko, po, m, dk, r, keys.options());
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CPU, m) { m.impl("sorted_key_pairs", &sorted_key_pairs_cpu); }

}  // namespace relconv
