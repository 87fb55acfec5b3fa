// CUDA kernels of relconv::csr_row_sum (the sum of each R-GCN slot's inputs, relconv/graph/slots.py,
// and its input gradient). A group of lanes owns `lanes` consecutive rows: each lane holds a slice
// of four channels (two in float64). The group loads its entries' columns and weights together and
// walks them in order, each lane gathering its slice of several entries at once across row
// boundaries (R-GCN's slots mostly hold one to three inputs, so a row at a time would wait on every
// gather chain), and writes each row once; the output is never zero-filled or rescaled.
//
// Knowledge graphs have hub rows (AM: a slot of 58k entries, an input of 369k): one lane group
// walking such a row would hold up the whole call for milliseconds. Rows longer than kChunk entries
// are therefore cut into chunks of kChunk entries, listed on the device by the row kernel; a second
// kernel sums each chunk and adds it atomically into a float32 (float64) row of a scratch buffer, and
// a third writes those rows out. The host learns nothing: the lists and the scratch are sized for
// the most long rows and chunks the entry count allows. The chunks' order of addition varies run to
// run; under torch.use_deterministic_algorithms every row is walked whole by its group.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "common/csr_row_sum_checks.h"
#include "cuda/kernel_launch.h"
#include "cuda/numeric.cuh"

namespace relconv {
namespace {

using cuda::acc_t;
using cuda::from_acc;
using cuda::to_acc;

constexpr int kThreads = 256;
// The gathers are latency-bound: four 256-thread blocks per SM (at most 64 registers a thread)
// keep more of them in flight than the registers the unrolled walk would otherwise take (95 in
// bfloat16), even with a few spilled. On an H200, AM's slot sum (5.5M rows, 12M entries, C64),
// queued ms forward / transposed: float32 1.25 / 1.28 -> 1.11 / 1.19, bfloat16 (16-byte slices)
// 1.37 / 1.41 -> 1.24 / 1.24.
constexpr int kMinBlocks = 4;
// Entries a lane group sums before its row counts as long (and the length of a long row's chunks).
constexpr int64_t kChunk = 64;

template <typename T, int V>
struct alignas(sizeof(T) * V) Slice {
  T v[V];
};

template <typename T, typename I, int V>
struct Args {
  const I* row_ptr;
  const I* col;
  const T* values;
  const Slice<T, V>* x;
  Slice<T, V>* out;
  int64_t rows, num_x, num_entries, slices;
  int lanes_log2;
  // Long rows (null when rows are walked whole): their count, their rows, their chunks
  // (long-row number, first entry) and a float32 / float64 row of C channels each.
  unsigned long long* counts;  // [2]: long rows, chunks
  int64_t* long_rows;
  int64_t* chunks;  // [2 * max chunks]
  acc_t<T>* scratch;
};

// A group of lanes of one warp: its number in the grid, this thread's lane and the group's lanes
// as a warp mask (for the shuffles, which only the group's lanes join).
struct Group {
  int64_t index;
  int lane, lanes;
  int first_lane;  // the group's first lane in its warp
  unsigned mask;
};

__device__ __forceinline__ Group group_of(int lanes_log2) {
  const int64_t t = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  Group g;
  g.index = t >> lanes_log2;
  g.lanes = 1 << lanes_log2;
  g.lane = threadIdx.x & (g.lanes - 1);
  g.first_lane = (threadIdx.x & 31) & ~(g.lanes - 1);
  g.mask = g.lanes == 32 ? 0xffffffffu : ((1u << g.lanes) - 1) << g.first_lane;
  return g;
}

// Entries [begin, end) of `row`, clamped to the entry array.
template <typename T, typename I, int V>
__device__ __forceinline__ void row_range(const Args<T, I, V>& a, int64_t row, int64_t& begin, int64_t& end) {
  begin = min(max(static_cast<int64_t>(a.row_ptr[row]), int64_t{0}), a.num_entries);
  end = max(min(static_cast<int64_t>(a.row_ptr[row + 1]), a.num_entries), begin);
}

// Gathers in flight per lane: its slice of each of kUnroll entries is loaded before any is summed
// (2 or 8 took 10% to 30% longer on AM's slot sum).
constexpr int kUnroll = 4;

// Walks entries [begin, end), which belong to `rows` consecutive rows whose ends lane r of the
// group holds in `row_end` (r < rows), and hands each row's sum of slice s to done(r, acc), in row
// order, empty rows included. The group loads the entries' columns and weights together, a batch of
// `lanes` at a time, and each lane gathers its slice of kUnroll entries at once, across row
// boundaries: a short row does not wait for the one before it. Lanes past the slices join the
// shuffles and gather nothing. Columns outside x are skipped.
template <typename T, typename I, int V, typename Done>
__device__ __forceinline__ void walk(const Args<T, I, V>& a, const Group& g, int64_t s, int64_t begin, int64_t end,
                                     int64_t row_end, int rows, Done&& done) {
  using Acc = acc_t<T>;
  const bool active = s < a.slices;
  int r = 0;
  int64_t r_end = __shfl_sync(g.mask, row_end, 0, g.lanes);
  Acc acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = Acc{0};
  for (int64_t base = begin; base < end; base += g.lanes) {
    const int64_t e = base + g.lane;
    int64_t col = -1;
    Acc w = Acc{0};
    if (e < end) {
      const int64_t i = a.col[e];
      if (i >= 0 && i < a.num_x) {
        col = i;
        w = to_acc(a.values[e]);
      }
    }
    const int count = static_cast<int>(min(static_cast<int64_t>(g.lanes), end - base));
    for (int j0 = 0; j0 < count; j0 += kUnroll) {
      Slice<T, V> xs[kUnroll];
      Acc ws[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = __shfl_sync(g.mask, col, (j0 + u) & (g.lanes - 1), g.lanes);
        ws[u] = __shfl_sync(g.mask, w, (j0 + u) & (g.lanes - 1), g.lanes);
        if (active && j0 + u < count && i >= 0) {
          xs[u] = a.x[i * a.slices + s];
        } else {
          ws[u] = Acc{0};
#pragma unroll
          for (int k = 0; k < V; ++k) xs[u].v[k] = T{};
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j0 + u >= count) break;
        // Rows are group-uniform: every lane advances past the same (empty or finished) rows.
        while (base + j0 + u >= r_end && r + 1 < rows) {
          done(r, acc);
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k] = Acc{0};
          r_end = __shfl_sync(g.mask, row_end, ++r, g.lanes);
        }
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += ws[u] * to_acc(xs[u].v[k]);
      }
    }
  }
  done(r, acc);
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = Acc{0};
  for (++r; r < rows; ++r) done(r, acc);
}

// One lane group per `lanes` consecutive rows. A long row's first lane lists it and its chunks
// and zeroes its scratch row; the group then walks each run of short rows between the long ones.
template <typename T, typename I, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocks) row_sum_kernel(Args<T, I, V> a) {
  const Group g = group_of(a.lanes_log2);
  const int64_t first = g.index * g.lanes;
  if (first >= a.rows) return;
  const int n = static_cast<int>(min(static_cast<int64_t>(g.lanes), a.rows - first));
  int64_t begin = 0, end = 0;
  if (g.lane < n) row_range(a, first + g.lane, begin, end);
  const bool is_long = a.counts != nullptr && end - begin > kChunk;
  if (is_long) {
    const int64_t slot = static_cast<int64_t>(atomicAdd(&a.counts[0], 1ull));
    const int64_t chunks = (end - begin + kChunk - 1) / kChunk;
    const int64_t at = static_cast<int64_t>(atomicAdd(&a.counts[1], static_cast<unsigned long long>(chunks)));
    a.long_rows[slot] = first + g.lane;
    for (int64_t c = 0; c < chunks; ++c) {
      a.chunks[2 * (at + c)] = slot;
      a.chunks[2 * (at + c) + 1] = begin + c * kChunk;
    }
    for (int64_t k = 0; k < a.slices * V; ++k) a.scratch[slot * a.slices * V + k] = acc_t<T>{0};
  }
  const unsigned long_rows = __ballot_sync(g.mask, is_long) >> g.first_lane;
  for (int64_t s0 = 0; s0 < a.slices; s0 += g.lanes) {
    const int64_t s = s0 + g.lane;
    for (int r0 = 0; r0 < n;) {
      if ((long_rows >> r0) & 1u) {
        ++r0;
        continue;
      }
      // The run of short rows r0 .. r1 - 1: up to the next long row or the group's last row.
      const unsigned later = long_rows >> r0;
      const int r1 = later == 0 ? n : min(n, r0 + __ffs(later) - 1);
      // Row r0 + k's end, in lane k of the group.
      const int64_t run_row_end = __shfl_sync(g.mask, end, (r0 + g.lane) & (g.lanes - 1), g.lanes);
      const int64_t run_begin = __shfl_sync(g.mask, begin, r0, g.lanes);
      const int64_t run_end = __shfl_sync(g.mask, end, r1 - 1, g.lanes);
      walk(a, g, s, run_begin, max(run_end, run_begin), run_row_end, r1 - r0, [&](int r, const acc_t<T>(&acc)[V]) {
        if (s >= a.slices) return;
        Slice<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = from_acc<T>(acc[k]);
        a.out[(first + r0 + r) * a.slices + s] = o;
      });
      r0 = r1;
    }
  }
}

// One lane group per listed chunk: adds its entries' sum into its long row's scratch row.
template <typename T, typename I, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocks) chunk_sum_kernel(Args<T, I, V> a) {
  const Group g = group_of(a.lanes_log2);
  if (g.index >= static_cast<int64_t>(a.counts[1])) return;
  const int64_t slot = a.chunks[2 * g.index], begin = a.chunks[2 * g.index + 1];
  int64_t row_begin, row_end;
  row_range(a, a.long_rows[slot], row_begin, row_end);
  const int64_t end = min(begin + kChunk, row_end);
  acc_t<T>* dst = a.scratch + slot * a.slices * V;
  for (int64_t s0 = 0; s0 < a.slices; s0 += g.lanes) {
    const int64_t s = s0 + g.lane;
    walk(a, g, s, begin, end, end, 1, [&](int, const acc_t<T>(&acc)[V]) {
      if (s >= a.slices) return;
#pragma unroll
      for (int k = 0; k < V; ++k) atomicAdd(dst + s * V + k, acc[k]);
    });
  }
}

// One lane group per long row: writes its scratch row out in the output dtype.
template <typename T, typename I, int V>
__global__ void __launch_bounds__(kThreads) long_row_out_kernel(Args<T, I, V> a) {
  const Group g = group_of(a.lanes_log2);
  if (g.index >= static_cast<int64_t>(a.counts[0])) return;
  const int64_t row = a.long_rows[g.index];
  const acc_t<T>* src = a.scratch + g.index * a.slices * V;
  for (int64_t s = g.lane; s < a.slices; s += g.lanes) {
    Slice<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_acc<T>(src[s * V + k]);
    a.out[row * a.slices + s] = o;
  }
}

template <typename T, typename I, int V>
void launch(const at::Tensor& row_ptr, const at::Tensor& col, const at::Tensor& values, const at::Tensor& x,
            at::Tensor& out, cudaStream_t stream) {
  Args<T, I, V> a{};
  a.row_ptr = row_ptr.const_data_ptr<I>();
  a.col = col.const_data_ptr<I>();
  a.values = reinterpret_cast<const T*>(values.const_data_ptr());
  a.x = reinterpret_cast<const Slice<T, V>*>(x.const_data_ptr());
  a.out = reinterpret_cast<Slice<T, V>*>(out.mutable_data_ptr());
  a.rows = out.size(0);
  a.num_x = x.size(0);
  a.num_entries = col.numel();
  a.slices = x.size(1) / V;
  // At least 8 lanes a group: they load a batch of 8 entries' columns together even where fewer
  // slices span the channels.
  a.lanes_log2 = 3;
  while ((1 << a.lanes_log2) < a.slices && a.lanes_log2 < 5) ++a.lanes_log2;
  const auto grid = [&](int64_t groups) {
    return launch::blocks_for(groups << a.lanes_log2, kThreads, "csr_row_sum");
  };
  // A long row has more than kChunk entries; a row of d entries has ceil(d / kChunk) chunks, at
  // most d / kChunk + 1.
  const int64_t max_long = a.num_entries / (kChunk + 1);
  const int64_t max_chunks = (a.num_entries + kChunk - 1) / kChunk + max_long;
  at::Tensor counts, lists, scratch;
  if (max_long > 0 && !at::globalContext().deterministicAlgorithms()) {
    const auto opts = x.options();
    counts = at::empty({2}, opts.dtype(at::kLong));
    C10_CUDA_CHECK(cudaMemsetAsync(counts.mutable_data_ptr(), 0, 2 * sizeof(int64_t), stream));
    lists = at::empty({max_long + 2 * max_chunks}, opts.dtype(at::kLong));
    scratch = at::empty({max_long, x.size(1)}, opts.dtype(std::is_same_v<T, double> ? at::kDouble : at::kFloat));
    a.counts = reinterpret_cast<unsigned long long*>(counts.mutable_data_ptr());
    a.long_rows = lists.mutable_data_ptr<int64_t>();
    a.chunks = a.long_rows + max_long;
    a.scratch = reinterpret_cast<acc_t<T>*>(scratch.mutable_data_ptr());
  }
  row_sum_kernel<T, I, V><<<grid((a.rows + (1 << a.lanes_log2) - 1) >> a.lanes_log2), kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (a.counts == nullptr) return;
  chunk_sum_kernel<T, I, V><<<grid(max_chunks), kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  long_row_out_kernel<T, I, V><<<grid(max_long), kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Slices of four channels (two in float64, 16 bytes) where the channel count and the base addresses
// allow; one element a lane otherwise. 16-bit features take 8-byte slices, not 16-byte ones: twice
// the lanes a group, each batch of columns spread over more gathers (AM's bfloat16 slot sum 1.24 /
// 1.24 -> 1.08 / 1.12 ms).
template <typename T, typename I>
void launch_widest(const at::Tensor& row_ptr, const at::Tensor& col, const at::Tensor& values, const at::Tensor& x,
                   at::Tensor& out, cudaStream_t stream) {
  constexpr int kV = std::min(cuda::kVecElems<T>, 4);
  const auto aligned = [](const at::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % (sizeof(T) * kV) == 0;
  };
  if (x.size(1) % kV == 0 && aligned(x) && aligned(out)) {
    launch<T, I, kV>(row_ptr, col, values, x, out, stream);
  } else {
    launch<T, I, 1>(row_ptr, col, values, x, out, stream);
  }
}

template <typename T>
void launch_indexed(const at::Tensor& row_ptr, const at::Tensor& col, const at::Tensor& values, const at::Tensor& x,
                    at::Tensor& out, cudaStream_t stream) {
  if (row_ptr.scalar_type() == at::kInt) {
    launch_widest<T, int32_t>(row_ptr, col, values, x, out, stream);
  } else {
    launch_widest<T, int64_t>(row_ptr, col, values, x, out, stream);
  }
}

at::Tensor csr_row_sum_cuda(const at::Tensor& row_ptr, const at::Tensor& col, const at::Tensor& values,
                            const at::Tensor& x) {
  check_csr_row_sum_args(row_ptr, col, values, x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({row_ptr.numel() - 1, x.size(1)}, x.options());
  if (out.numel() == 0) return out;
  if (x.size(0) == 0) return out.zero_();  // every column is out of range: nothing to gather
  const at::Tensor ptr = row_ptr.contiguous(), c = col.contiguous(), v = values.contiguous(), xc = x.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  switch (x.scalar_type()) {
    case at::kHalf: launch_indexed<__half>(ptr, c, v, xc, out, stream); break;
    case at::kBFloat16: launch_indexed<__nv_bfloat16>(ptr, c, v, xc, out, stream); break;
    case at::kFloat: launch_indexed<float>(ptr, c, v, xc, out, stream); break;
    default: launch_indexed<double>(ptr, c, v, xc, out, stream); break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CUDA, m) { m.impl("csr_row_sum", &csr_row_sum_cuda); }

}  // namespace relconv
