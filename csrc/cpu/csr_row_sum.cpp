// CPU kernel of relconv::csr_row_sum: each output row sums its run of (col, value) entries in
// order, rows split across threads (each row is written by one thread: deterministic).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/csr_row_sum_checks.h"

namespace relconv {
namespace {

at::Tensor csr_row_sum_cpu(const at::Tensor& row_ptr, const at::Tensor& col, const at::Tensor& values,
                           const at::Tensor& x) {
  check_csr_row_sum_args(row_ptr, col, values, x);
  const int64_t rows = row_ptr.numel() - 1, channels = x.size(1), num_x = x.size(0), num_entries = col.numel();
  at::Tensor out = at::empty({rows, channels}, x.options());
  const at::Tensor ptr = row_ptr.contiguous(), c = col.contiguous(), v = values.contiguous(), xc = x.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "csr_row_sum", [&] {
    using acc = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "csr_row_sum", [&] {
      const index_t* p = ptr.const_data_ptr<index_t>();
      const index_t* ci = c.const_data_ptr<index_t>();
      const scalar_t* vals = v.const_data_ptr<scalar_t>();
      const scalar_t* xs = xc.const_data_ptr<scalar_t>();
      scalar_t* o = out.mutable_data_ptr<scalar_t>();
      const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(channels, 1));
      at::parallel_for(0, rows, grain, [&](int64_t lo, int64_t hi) {
        std::vector<acc> sum(channels);
        for (int64_t r = lo; r < hi; ++r) {
          std::fill(sum.begin(), sum.end(), acc{0});
          // Entries outside [0, num_entries) or columns outside x are skipped, never read.
          const int64_t end = std::min<int64_t>(p[r + 1], num_entries);
          for (int64_t e = std::max<int64_t>(p[r], 0); e < end; ++e) {
            const int64_t i = ci[e];
            if (i < 0 || i >= num_x) continue;
            const acc w = static_cast<acc>(vals[e]);
            const scalar_t* xr = xs + i * channels;
            for (int64_t k = 0; k < channels; ++k) sum[k] += w * static_cast<acc>(xr[k]);
          }
          scalar_t* orow = o + r * channels;
          for (int64_t k = 0; k < channels; ++k) orow[k] = static_cast<scalar_t>(sum[k]);
        }
      });
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CPU, m) { m.impl("csr_row_sum", &csr_row_sum_cpu); }

}  // namespace relconv
