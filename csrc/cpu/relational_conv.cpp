// CPU kernels of the relational-convolution ops.
//
// One level of parallelism, chosen by size (see DESIGN.md §4 for the dataflows):
//  * Forward, the common case: pairs are bucketed by ranges of output rows balanced by pair count,
//    a few buckets per thread handed out dynamically. A thread walks a bucket relation by relation in
//    cache-sized tiles (gather,
//    single-threaded BLAS, scaled scatter-add; csrc/cpu/pair_tiles.h). Buckets own disjoint output
//    rows, so there are no races, and every output row sums its pairs in (relation, pair) order, the
//    same order for every thread count: deterministic run to run (across thread counts only BLAS's
//    rounding of a row may change with the other rows of its tile).
//  * Forward, when one output row holds so many pairs that the buckets cannot be balanced (a hub
//    node): no outer loop; ATen's threaded GEMM per relation chunk, then a serial scatter.
//  * Weight gradient: each relation's pairs are cut into chunks whose size depends on the problem
//    only (not the thread count); chunks run in parallel with single-threaded BLAS into their own
//    partial dW, and partials are summed in chunk order. Deterministic run to run.
// Small problems run on the calling thread: a parallel region costs more than it saves.
// at::parallel_for is an inline OpenMP loop: this file must be compiled with -fopenmp (setup.py),
// otherwise every loop here silently runs on one thread.
#include "common/error_message.h"
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <vector>

#include "common/checks.h"
#include "cpu/pair_tiles.h"

namespace relconv {
namespace {

// Multiply-adds below which a call stays on one thread.
constexpr int64_t kSerialWork = int64_t{1} << 21;
// Buckets per thread: small enough units that a thread slowed by a busy core does not hold up the
// others (at::parallel_for splits a range statically, so work is handed out through a counter).
constexpr int64_t kBucketsPerThread = 8;

// Runs fn(i) for i in [0, n) on up to at::get_num_threads() threads, each taking the next index.
// Which thread runs an index never changes what it computes, so results stay deterministic.
template <typename Fn>
void dynamic_for(int64_t n, const Fn& fn) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  });
}

// Row ranges and rel_ptr are validated on the CPU (cheap, and the data is already host-resident):
// a bad map must raise, never write out of bounds.
void check_map_data(const at::Tensor& in_index, const at::Tensor& out_index, const at::Tensor& rel_ptr,
                    int64_t num_in, int64_t num_out) {
  const auto* ptr = rel_ptr.data_ptr<int64_t>();
  const int64_t num_rel = rel_ptr.numel() - 1;
  RELCONV_CHECK_VALUE(ptr[0] == 0, "rel_ptr must start at 0, got ", ptr[0]);
  RELCONV_CHECK_VALUE(ptr[num_rel] == in_index.numel(), "rel_ptr[-1] = ", ptr[num_rel],
                    " must equal the number of pairs (", in_index.numel(), ")");
  for (int64_t r = 0; r < num_rel; ++r) {
    RELCONV_CHECK_VALUE(ptr[r] <= ptr[r + 1], "rel_ptr must be monotone non-decreasing, but rel_ptr[", r,
                      "] = ", ptr[r], " > rel_ptr[", r + 1, "] = ", ptr[r + 1]);
  }
  if (in_index.numel() == 0) return;
  for (auto [name, t, n] : {std::tuple{"in_index", &in_index, num_in},
                            std::tuple{"out_index", &out_index, num_out}}) {
    auto [lo, hi] = at::aminmax(*t);
    const int64_t l = lo.item<int64_t>(), h = hi.item<int64_t>();
    RELCONV_CHECK_VALUE(l >= 0 && h < n, name, " values must lie in [0, ", n, "), got [", l, ", ", h, "]");
  }
}

// Pairs regrouped by bucket of output rows, then by relation, keeping pair order within each
// (bucket, relation) segment. Segment (b, r) is perm[seg[b * R + r], seg[b * R + r + 1]).
struct Buckets {
  int64_t count = 1;
  int64_t largest = 0;  // pairs in the fullest bucket
  std::vector<int64_t> perm;
  std::vector<int64_t> seg;
};

// Splits the output rows into up to `want` contiguous ranges of about P / want pairs each. A row
// holding more than a share (a hub node) makes its bucket larger; `largest` tells the caller.
template <typename index_t>
Buckets bucket_pairs(const index_t* out_idx, const int64_t* ptr, int64_t num_rel, int64_t num_pairs,
                     int64_t num_out, int64_t want) {
  Buckets bk;
  std::vector<int32_t> bucket_of_out;
  if (want > 1) {
    std::vector<int64_t> deg(num_out, 0);
    for (int64_t p = 0; p < num_pairs; ++p) ++deg[out_idx[p]];
    bucket_of_out.assign(num_out, 0);
    const int64_t share = (num_pairs + want - 1) / want;
    int64_t b = 0, filled = 0;
    for (int64_t o = 0; o < num_out; ++o) {
      if (filled >= share && b + 1 < want) ++b, filled = 0;
      bucket_of_out[o] = static_cast<int32_t>(b);
      filled += deg[o];
      bk.largest = std::max(bk.largest, filled);
    }
    bk.count = b + 1;
  }
  const int64_t nb = bk.count;
  bk.perm.resize(num_pairs);
  bk.seg.assign(nb * num_rel + 1, 0);
  if (nb == 1) {
    bk.largest = num_pairs;
    for (int64_t p = 0; p < num_pairs; ++p) bk.perm[p] = p;
    for (int64_t r = 0; r <= num_rel; ++r) bk.seg[r] = ptr[r];
    return bk;
  }
  // Counting sort, parallel over relations: each relation fills only its own (b, r) segments.
  std::vector<int64_t> counts(num_rel * nb, 0);  // [r][b]
  at::parallel_for(0, num_rel, 1, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r)
      for (int64_t p = ptr[r]; p < ptr[r + 1]; ++p) ++counts[r * nb + bucket_of_out[out_idx[p]]];
  });
  for (int64_t b = 0, acc = 0; b < nb; ++b)
    for (int64_t r = 0; r < num_rel; ++r) {
      bk.seg[b * num_rel + r] = acc;
      acc += counts[r * nb + b];
    }
  bk.seg[nb * num_rel] = num_pairs;
  at::parallel_for(0, num_rel, 1, [&](int64_t rb, int64_t re) {
    std::vector<int64_t> cursor(nb);
    for (int64_t r = rb; r < re; ++r) {
      for (int64_t b = 0; b < nb; ++b) cursor[b] = bk.seg[b * num_rel + r];
      for (int64_t p = ptr[r]; p < ptr[r + 1]; ++p) bk.perm[cursor[bucket_of_out[out_idx[p]]]++] = p;
    }
  });
  return bk;
}

template <typename scalar_t, typename acc_t, typename index_t>
void forward_buckets(acc_t* out, const scalar_t* x, const acc_t* w, const index_t* in_idx,
                     const index_t* out_idx, const acc_t* scale, const Buckets& bk, int64_t num_rel,
                     const ConvShape& s) {
  const int64_t cin = s.groups * s.cin_g, cout = s.groups * s.cout_g;
  const int64_t rows = cpu::tile_rows(cin, cout, sizeof(acc_t));
  const int64_t wstride = s.groups * s.cin_g * s.cout_g;
  auto run = [&](int64_t b) {
    // Per-bucket buffers: a few hundred KiB at most, cheap next to a bucket's GEMMs.
    std::vector<acc_t> a(rows * cin), c(rows * cout);
    const cpu::SingleThreadedBlas one_thread;
    for (int64_t r = 0; r < num_rel; ++r) {
      const int64_t lo = bk.seg[b * num_rel + r], hi = bk.seg[b * num_rel + r + 1];
      for (int64_t t0 = lo; t0 < hi; t0 += rows) {
        const int64_t n = std::min(rows, hi - t0);
        const int64_t* pairs = bk.perm.data() + t0;
        cpu::gather_rows(a.data(), x, cin, in_idx, pairs, n);
        cpu::grouped_gemm(c.data(), a.data(), w + r * wstride, n, s.groups, s.cin_g, s.cout_g);
        cpu::scatter_add_rows(out, c.data(), cout, out_idx, scale, pairs, n);
      }
    }
  };
  if (bk.count == 1) {
    run(0);
  } else {
    dynamic_for(bk.count, run);
  }
}

// Hub fallback: a relation chunk at a time, gathered whole and multiplied by ATen's threaded GEMM,
// then scattered in pair order on the calling thread (no parallel loop around the GEMMs).
template <typename acc_t, typename index_t>
void forward_threaded_gemm(at::Tensor& out, const at::Tensor& xa, const at::Tensor& wa,
                           const at::Tensor& in_index, const at::Tensor& out_index,
                           const std::optional<at::Tensor>& scale, const int64_t* ptr, const ConvShape& s) {
  const int64_t cout = s.groups * s.cout_g;
  const int64_t chunk = std::max<int64_t>(1024, (int64_t{32} << 20) / ((xa.size(1) + cout) * xa.element_size()));
  const auto* oi = out_index.data_ptr<index_t>();
  const acc_t* sc = scale.has_value() ? scale->data_ptr<acc_t>() : nullptr;
  for (int64_t r = 0; r < s.num_relations; ++r) {
    for (int64_t lo = ptr[r]; lo < ptr[r + 1]; lo += chunk) {
      const int64_t hi = std::min(ptr[r + 1], lo + chunk), n = hi - lo;
      const at::Tensor rows = xa.index_select(0, in_index.slice(0, lo, hi));
      at::Tensor prod = at::empty({n, cout}, rows.options());
      const at::Tensor wr = wa[r];
      if (s.groups == 1) {
        at::mm_out(prod, rows, wr[0]);
      } else {
        prod.view({n, s.groups, s.cout_g})
            .transpose(0, 1)
            .copy_(at::bmm(rows.view({n, s.groups, s.cin_g}).transpose(0, 1), wr));
      }
      std::vector<int64_t> pairs(n);
      for (int64_t t = 0; t < n; ++t) pairs[t] = lo + t;
      cpu::scatter_add_rows(out.data_ptr<acc_t>(), prod.data_ptr<acc_t>(), cout, oi, sc, pairs.data(), n);
    }
  }
}

// The epilogue on the accumulator (bias, then ReLU), then its one rounding to the output dtype: the
// order the CUDA table kernel uses, so both devices round the same value.
at::Tensor finish(at::Tensor& acc, const std::optional<at::Tensor>& bias, bool relu, at::ScalarType dtype) {
  if (bias.has_value()) acc.add_(*bias);
  if (relu) acc.relu_();
  return acc.to(dtype);
}

at::Tensor relational_conv_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& in_index,
                               const at::Tensor& out_index, const at::Tensor& rel_ptr,
                               const std::optional<at::Tensor>& scale, int64_t num_out,
                               const std::optional<at::Tensor>& neighbor_table,
                               const std::optional<at::Tensor>& table_order,
                               const std::optional<at::Tensor>& bias, bool relu,
                               const std::optional<at::Tensor>& transposed_table,
                               const std::optional<at::Tensor>& transposed_order, bool /*sorted_tables*/) {
  // The pair lists carry the same information as the neighbour tables; the CPU path uses the former
  // (the table orders and the tables' row sequence, schedules of the CUDA table kernel, mean nothing
  // here). The transposed table is checked all the same: a bad argument fails on every device.
  const ConvShape s = check_conv_args(x, weight, in_index, out_index, rel_ptr, scale);
  check_neighbor_table(neighbor_table, table_order, in_index, scale, num_out, s.num_relations);
  check_transposed_table(transposed_table, transposed_order, neighbor_table, x.size(0), s.num_relations);
  check_bias(bias, x, s.groups * s.cout_g);
  RELCONV_CHECK_VALUE(num_out >= 0, "num_out must be non-negative, got ", num_out);
  check_map_data(in_index, out_index, rel_ptr, x.size(0), num_out);
  const auto acc = acc_dtype(x.scalar_type());
  const int64_t cin = s.groups * s.cin_g, cout = s.groups * s.cout_g;
  at::Tensor out = at::zeros({num_out, cout}, x.options().dtype(acc));
  // No pairs, or no channels (BLAS rejects a zero leading dimension): the sum is all zeros.
  if (s.num_pairs == 0 || cout == 0 || cin == 0) return finish(out, bias, relu, x.scalar_type());
  const at::Tensor xc = x.contiguous();
  const at::Tensor wa = grouped_weight(weight).to(acc).contiguous();
  const at::Tensor ii = in_index.contiguous(), oi = out_index.contiguous();
  const std::optional<at::Tensor> sc = scale.has_value() ? std::optional(scale->contiguous()) : std::nullopt;
  const auto* ptr = rel_ptr.data_ptr<int64_t>();
  const int64_t threads = at::get_num_threads();
  const bool parallel = threads > 1 && s.num_pairs * cin * s.cout_g >= kSerialWork;
  const int64_t want = parallel ? std::min(threads * kBucketsPerThread, std::max<int64_t>(num_out, 1)) : 1;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "relational_conv_cpu", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    AT_DISPATCH_INDEX_TYPES(oi.scalar_type(), "relational_conv_cpu", [&] {
      const Buckets bk = bucket_pairs(oi.data_ptr<index_t>(), ptr, s.num_relations, s.num_pairs, num_out, want);
      // A bucket holding over twice a thread's share would leave the other threads idle most of the time.
      if (parallel && bk.largest * threads > 2 * s.num_pairs) {
        forward_threaded_gemm<acc_t, index_t>(out, xc.to(acc), wa, ii, oi, sc, ptr, s);
        return;
      }
      forward_buckets<scalar_t, acc_t, index_t>(out.data_ptr<acc_t>(), xc.data_ptr<scalar_t>(),
                                                wa.data_ptr<acc_t>(), ii.data_ptr<index_t>(),
                                                oi.data_ptr<index_t>(), sc ? sc->data_ptr<acc_t>() : nullptr,
                                                bk, s.num_relations, s);
    });
  });
  return finish(out, bias, relu, x.scalar_type());
}

// Pairs per weight-gradient chunk: a function of the problem only, so the summation order (and the
// result) does not change with the thread count. Bounded so that partial dW buffers stay <= 64 MiB.
int64_t wgrad_chunk(int64_t num_pairs, int64_t dw_elems, int64_t elem_size) {
  const int64_t by_count = std::clamp<int64_t>(num_pairs / 256, 1024, 16384);
  const int64_t by_memory = num_pairs * dw_elems * elem_size / (int64_t{64} << 20) + 1;
  return std::max(by_count, by_memory);
}

at::Tensor relational_conv_weight_grad_cpu(const at::Tensor& x, const at::Tensor& grad_out,
                                           const at::Tensor& in_index, const at::Tensor& out_index,
                                           const at::Tensor& rel_ptr, const std::optional<at::Tensor>& scale,
                                           int64_t groups, std::optional<at::ScalarType> out_dtype) {
  const ConvShape s = check_weight_grad_args(x, grad_out, in_index, out_index, rel_ptr, scale, groups);
  const at::ScalarType out = weight_grad_dtype(x, out_dtype);
  check_map_data(in_index, out_index, rel_ptr, x.size(0), grad_out.size(0));
  const auto acc = acc_dtype(x.scalar_type());
  at::Tensor dw = at::zeros({s.num_relations, s.groups, s.cin_g, s.cout_g}, x.options().dtype(acc));
  const int64_t dw_elems = s.groups * s.cin_g * s.cout_g;
  if (s.num_pairs == 0 || dw_elems == 0) return dw.to(out);
  const at::Tensor xc = x.contiguous(), gc = grad_out.contiguous();
  const at::Tensor ii = in_index.contiguous(), oi = out_index.contiguous();
  const std::optional<at::Tensor> sc = scale.has_value() ? std::optional(scale->contiguous()) : std::nullopt;
  const auto* ptr = rel_ptr.data_ptr<int64_t>();
  const int64_t cin = s.groups * s.cin_g, cout = s.groups * s.cout_g;

  // Work items: (relation, first pair, last pair, partial slot or -1 = write dw[r] directly).
  const int64_t chunk = wgrad_chunk(s.num_pairs, dw_elems, c10::elementSize(acc));
  struct Item {
    int64_t r, lo, hi, slot;
  };
  std::vector<Item> items;
  std::vector<int64_t> first_slot(s.num_relations + 1, 0);
  int64_t slots = 0;
  for (int64_t r = 0; r < s.num_relations; ++r) {
    first_slot[r] = slots;
    const int64_t n = ptr[r + 1] - ptr[r];
    if (n == 0) continue;
    const int64_t pieces = (n + chunk - 1) / chunk;
    for (int64_t k = 0; k < pieces; ++k) {
      const int64_t lo = ptr[r] + k * chunk;
      items.push_back({r, lo, std::min(ptr[r + 1], lo + chunk), pieces == 1 ? -1 : slots + k});
    }
    if (pieces > 1) slots += pieces;
  }
  first_slot[s.num_relations] = slots;
  at::Tensor partial = at::empty({slots, dw_elems}, dw.options());

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "relational_conv_wgrad_cpu", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    AT_DISPATCH_INDEX_TYPES(oi.scalar_type(), "relational_conv_wgrad_cpu", [&] {
      const auto* xp = xc.data_ptr<scalar_t>();
      const auto* gp = gc.data_ptr<scalar_t>();
      const auto* ip = ii.data_ptr<index_t>();
      const auto* op = oi.data_ptr<index_t>();
      const acc_t* scp = sc ? sc->data_ptr<acc_t>() : nullptr;
      acc_t* dwp = dw.data_ptr<acc_t>();
      acc_t* pp = slots ? partial.data_ptr<acc_t>() : nullptr;
      const int64_t rows = cpu::tile_rows(cin, cout, sizeof(acc_t));
      auto run = [&](int64_t i0, int64_t i1) {
        std::vector<acc_t> a(rows * cin), g(rows * cout);
        std::vector<int64_t> pairs(rows);
        const cpu::SingleThreadedBlas one_thread;
        for (int64_t i = i0; i < i1; ++i) {
          const Item& it = items[i];
          acc_t* dst = it.slot < 0 ? dwp + it.r * dw_elems : pp + it.slot * dw_elems;
          for (int64_t t0 = it.lo; t0 < it.hi; t0 += rows) {
            const int64_t n = std::min(rows, it.hi - t0);
            for (int64_t t = 0; t < n; ++t) pairs[t] = t0 + t;
            cpu::gather_rows(a.data(), xp, cin, ip, pairs.data(), n);
            cpu::gather_rows(g.data(), gp, cout, op, pairs.data(), n);
            if (scp != nullptr) cpu::scale_rows(g.data(), cout, scp, pairs.data(), n);
            cpu::grouped_gemm_tn(dst, a.data(), g.data(), n, s.groups, s.cin_g, s.cout_g,
                                 acc_t(t0 == it.lo ? 0 : 1));
          }
        }
      };
      const int64_t items_n = static_cast<int64_t>(items.size());
      if (at::get_num_threads() > 1 && s.num_pairs * cin * s.cout_g >= kSerialWork) {
        dynamic_for(items_n, [&](int64_t i) { run(i, i + 1); });
      } else {
        run(0, items_n);
      }
      // Partials of split relations, summed in chunk order.
      for (int64_t r = 0; r < s.num_relations; ++r) {
        if (first_slot[r + 1] == first_slot[r]) continue;
        at::Tensor dst = dw[r].view({dw_elems});
        at::sum_out(dst, partial.slice(0, first_slot[r], first_slot[r + 1]), {0});
      }
    });
  });
  return dw.to(out);
}

// The sum over the pairs, added into out (the CPU conv's result, rounded to x's dtype, then added).
void relational_conv_add_cpu(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& in_index, const at::Tensor& out_index, const at::Tensor& rel_ptr,
                             const std::optional<at::Tensor>& scale) {
  const ConvShape s = check_conv_args(x, weight, in_index, out_index, rel_ptr, scale);
  check_add_out(out, x, weight, s.groups * s.cout_g);
  out.add_(relational_conv_cpu(x, weight, in_index, out_index, rel_ptr, scale, out.size(0), std::nullopt,
                               std::nullopt, std::nullopt, false, std::nullopt, std::nullopt, false));
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CPU, m) {
  m.impl("relational_conv", &relational_conv_cpu);
  m.impl("relational_conv_add_", &relational_conv_add_cpu);
  m.impl("relational_conv_weight_grad", &relational_conv_weight_grad_cpu);
}

}  // namespace relconv
