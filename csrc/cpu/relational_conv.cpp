// CPU kernels of the relational-convolution ops.
//
// Weight-stationary: gather the input rows of a chunk of relations, one blocked GEMM per relation
// through ATen, then a scatter-add into the output. The scatter is parallel over
// disjoint ranges of output rows: each thread scans the relation's pairs and adds only rows it owns,
// so there are no races and the summation order (pair order) is deterministic.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/checks.h"

namespace relconv {
namespace {

// Row ranges and rel_ptr are validated on the CPU (cheap, and the data is already host-resident):
// a bad map must raise, never write out of bounds.
void check_map_data(const at::Tensor& in_index, const at::Tensor& out_index, const at::Tensor& rel_ptr,
                    int64_t num_in, int64_t num_out) {
  const auto* ptr = rel_ptr.data_ptr<int64_t>();
  const int64_t num_rel = rel_ptr.numel() - 1;
  TORCH_CHECK_VALUE(ptr[0] == 0, "rel_ptr must start at 0, got ", ptr[0]);
  TORCH_CHECK_VALUE(ptr[num_rel] == in_index.numel(), "rel_ptr[-1] = ", ptr[num_rel],
                    " must equal the number of pairs (", in_index.numel(), ")");
  for (int64_t r = 0; r < num_rel; ++r) {
    TORCH_CHECK_VALUE(ptr[r] <= ptr[r + 1], "rel_ptr must be monotone non-decreasing, but rel_ptr[", r,
                      "] = ", ptr[r], " > rel_ptr[", r + 1, "] = ", ptr[r + 1]);
  }
  if (in_index.numel() == 0) return;
  for (auto [name, t, n] : {std::tuple{"in_index", &in_index, num_in},
                            std::tuple{"out_index", &out_index, num_out}}) {
    auto [lo, hi] = at::aminmax(*t);
    const int64_t l = lo.item<int64_t>(), h = hi.item<int64_t>();
    TORCH_CHECK_VALUE(l >= 0 && h < n, name, " values must lie in [0, ", n, "), got [", l, ", ", h, "]");
  }
}

// out[idx[p], :] += rows[p, :] for p in order, parallel over disjoint output-row ranges.
template <typename scalar_t, typename index_t>
void scatter_add_rows(at::Tensor& out, const at::Tensor& idx, const at::Tensor& rows) {
  const int64_t n = idx.numel(), c = rows.size(1), num_out = out.size(0);
  const auto* ix = idx.data_ptr<index_t>();
  const auto* src = rows.data_ptr<scalar_t>();
  auto* dst = out.data_ptr<scalar_t>();
  // Each thread reads all n indices; grain keeps that overhead small next to the row adds.
  const int64_t grain = std::max<int64_t>(1, num_out / std::max(1, at::get_num_threads()));
  at::parallel_for(0, num_out, grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = 0; p < n; ++p) {
      const int64_t o = ix[p];
      if (o < begin || o >= end) continue;
      const scalar_t* s = src + p * c;
      scalar_t* d = dst + o * c;
      for (int64_t k = 0; k < c; ++k) d[k] += s[k];
    }
  });
}

// rows [n, G*cin_g] @ w [G, cin_g, cout_g] -> out [n, G*cout_g] (block-diagonal per group).
void grouped_mm_out(at::Tensor out, const at::Tensor& rows, const at::Tensor& w) {
  const int64_t n = rows.size(0), g = w.size(0), cin_g = w.size(1), cout_g = w.size(2);
  if (g == 1) {
    at::mm_out(out, rows, w[0]);
    return;
  }
  out.view({n, g, cout_g}).transpose(0, 1).copy_(at::bmm(rows.view({n, g, cin_g}).transpose(0, 1), w));
}

// Pairs per chunk: bounds the gathered-rows and products buffers to ~64 MiB of accumulation type.
int64_t chunk_pairs(int64_t channels, int64_t elem_size) {
  return std::max<int64_t>(1024, (int64_t{64} << 20) / std::max<int64_t>(1, channels * elem_size));
}

at::Tensor relational_conv_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& in_index,
                               const at::Tensor& out_index, const at::Tensor& rel_ptr,
                               const std::optional<at::Tensor>& scale, int64_t num_out,
                               const std::optional<at::Tensor>& neighbor_table) {
  // The pair lists carry the same information as the neighbour table; the CPU path uses the former.
  const ConvShape s = check_conv_args(x, weight, in_index, out_index, rel_ptr, scale);
  check_neighbor_table(neighbor_table, in_index, scale, num_out, s.num_relations);
  TORCH_CHECK_VALUE(num_out >= 0, "num_out must be non-negative, got ", num_out);
  check_map_data(in_index, out_index, rel_ptr, x.size(0), num_out);
  const auto acc = acc_dtype(x.scalar_type());
  const at::Tensor xa = x.to(acc).contiguous();
  const at::Tensor wa = weight.to(acc).contiguous();
  at::Tensor out = at::zeros({num_out, s.groups * s.cout_g}, x.options().dtype(acc));
  const auto* ptr = rel_ptr.data_ptr<int64_t>();
  const int64_t budget = chunk_pairs(s.groups * (s.cin_g + s.cout_g), xa.element_size());
  // Few, large parallel regions per chunk of relations (gather, GEMMs, scatter) rather than three
  // per relation: OpenMP barriers are costly, and ruinous when the cores are shared.
  for (int64_t r0 = 0; r0 < s.num_relations;) {
    int64_t r1 = r0 + 1;
    while (r1 < s.num_relations && ptr[r1 + 1] - ptr[r0] <= budget) ++r1;
    const int64_t lo = ptr[r0], hi = ptr[r1];
    if (lo < hi) {
      const at::Tensor rows = xa.index_select(0, in_index.slice(0, lo, hi));
      at::Tensor prod = at::empty({hi - lo, s.groups * s.cout_g}, rows.options());
      // Relations write disjoint row ranges of prod; nested ATen calls run single-threaded.
      at::parallel_for(r0, r1, 1, [&](int64_t rb, int64_t re) {
        for (int64_t r = rb; r < re; ++r) {
          if (ptr[r] == ptr[r + 1]) continue;
          grouped_mm_out(prod.slice(0, ptr[r] - lo, ptr[r + 1] - lo), rows.slice(0, ptr[r] - lo, ptr[r + 1] - lo),
                         wa[r]);
        }
      });
      if (scale.has_value()) prod.mul_(scale->slice(0, lo, hi).unsqueeze(1));
      const at::Tensor oi = out_index.slice(0, lo, hi);
      AT_DISPATCH_FLOATING_TYPES(acc, "relational_conv_cpu", [&] {
        AT_DISPATCH_INDEX_TYPES(oi.scalar_type(), "relational_conv_cpu", [&] {
          scatter_add_rows<scalar_t, index_t>(out, oi, prod);
        });
      });
    }
    r0 = r1;
  }
  return out.to(x.scalar_type());
}

at::Tensor relational_conv_weight_grad_cpu(const at::Tensor& x, const at::Tensor& grad_out,
                                           const at::Tensor& in_index, const at::Tensor& out_index,
                                           const at::Tensor& rel_ptr, const std::optional<at::Tensor>& scale,
                                           int64_t groups) {
  const ConvShape s = check_weight_grad_args(x, grad_out, in_index, out_index, rel_ptr, scale, groups);
  check_map_data(in_index, out_index, rel_ptr, x.size(0), grad_out.size(0));
  const auto acc = acc_dtype(x.scalar_type());
  const at::Tensor xa = x.to(acc).contiguous();
  const at::Tensor ga = grad_out.to(acc).contiguous();
  at::Tensor dw = at::zeros({s.num_relations, s.groups, s.cin_g, s.cout_g}, x.options().dtype(acc));
  const auto* ptr = rel_ptr.data_ptr<int64_t>();
  // Relations write disjoint slices of dw, so they run in parallel; each GEMM is small enough that
  // ATen's own threading inside it would not pay for itself.
  at::parallel_for(0, s.num_relations, 1, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const int64_t lo = ptr[r], hi = ptr[r + 1], n = hi - lo;
      if (n == 0) continue;
      at::Tensor xr = xa.index_select(0, in_index.slice(0, lo, hi));
      at::Tensor gr = ga.index_select(0, out_index.slice(0, lo, hi));
      if (scale.has_value()) gr.mul_(scale->slice(0, lo, hi).unsqueeze(1));
      // [G, cin_g, n] @ [G, n, cout_g]
      at::Tensor dst = dw[r];
      at::bmm_out(dst, xr.view({n, s.groups, s.cin_g}).permute({1, 2, 0}),
                  gr.view({n, s.groups, s.cout_g}).transpose(0, 1));
    }
  });
  return dw.to(x.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CPU, m) {
  m.impl("relational_conv", &relational_conv_cpu);
  m.impl("relational_conv_weight_grad", &relational_conv_weight_grad_cpu);
}

}  // namespace relconv
