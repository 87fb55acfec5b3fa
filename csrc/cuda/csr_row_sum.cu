// CUDA kernels of relconv::csr_row_sum (the sum of each R-GCN slot's inputs, relconv/graph/slots.py,
// and its input gradient). A group of lanes owns one output row: each lane holds a 16-byte slice of
// the row's channels, walks the row's entries (two at a time, so that two gathers are in flight)
// and writes its slice once; the output is never zero-filled or rescaled.
//
// Knowledge graphs have hub rows (AM: a slot of 58k entries, an input of 369k): one lane group
// walking such a row would hold up the whole call for milliseconds. Rows longer than kChunk entries
// are therefore cut into chunks of kChunk entries, listed on the device by the row kernel; a second
// kernel sums each chunk and adds it atomically into a float32 (float64) row of a scratch buffer, and
// a third writes those rows out. The host learns nothing: the lists and the scratch are sized for
// the most long rows and chunks the entry count allows. The chunks' order of addition varies run to
// run; under torch.use_deterministic_algorithms every row is walked whole by one lane group.
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

// The lane group of this thread and its lane.
__device__ __forceinline__ int64_t group_of(int lanes_log2) {
  return (blockIdx.x * int64_t{kThreads} + threadIdx.x) >> lanes_log2;
}

// Sum over entries [begin, end) of values[e] * x[col[e]], slice s. Columns outside x are skipped.
template <typename T, typename I, int V>
__device__ __forceinline__ void sum_slice(const Args<T, I, V>& a, int64_t begin, int64_t end, int64_t s,
                                          acc_t<T> (&acc)[V]) {
  using Acc = acc_t<T>;
  const auto weight_of = [&](int64_t e, int64_t& i) -> Acc {
    i = a.col[e];
    if (i < 0 || i >= a.num_x) {
      i = 0;
      return Acc{0};
    }
    return to_acc(a.values[e]);
  };
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = Acc{0};
  int64_t e = begin;
  for (; e + 1 < end; e += 2) {
    int64_t i0, i1;
    const Acc w0 = weight_of(e, i0), w1 = weight_of(e + 1, i1);
    const Slice<T, V> p = a.x[i0 * a.slices + s], q = a.x[i1 * a.slices + s];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += w0 * to_acc(p.v[k]) + w1 * to_acc(q.v[k]);
  }
  if (e < end) {
    int64_t i0;
    const Acc w0 = weight_of(e, i0);
    const Slice<T, V> p = a.x[i0 * a.slices + s];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += w0 * to_acc(p.v[k]);
  }
}

// Entries [begin, end) of `row`, clamped to the entry array.
template <typename T, typename I, int V>
__device__ __forceinline__ void row_range(const Args<T, I, V>& a, int64_t row, int64_t& begin, int64_t& end) {
  begin = max(static_cast<int64_t>(a.row_ptr[row]), int64_t{0});
  end = min(static_cast<int64_t>(a.row_ptr[row + 1]), a.num_entries);
}

// One lane group per row: sums and writes a short row; lists a long one (first lane) and zeroes its
// scratch row.
template <typename T, typename I, int V>
__global__ void __launch_bounds__(kThreads) row_sum_kernel(Args<T, I, V> a) {
  const int64_t row = group_of(a.lanes_log2);
  if (row >= a.rows) return;
  const int lanes = 1 << a.lanes_log2;
  const int lane = threadIdx.x & (lanes - 1);
  int64_t begin, end;
  row_range(a, row, begin, end);
  if (a.counts != nullptr && end - begin > kChunk) {
    if (lane == 0) {
      const int64_t slot = static_cast<int64_t>(atomicAdd(&a.counts[0], 1ull));
      const int64_t n = (end - begin + kChunk - 1) / kChunk;
      const int64_t first = static_cast<int64_t>(atomicAdd(&a.counts[1], static_cast<unsigned long long>(n)));
      a.long_rows[slot] = row;
      for (int64_t c = 0; c < n; ++c) {
        a.chunks[2 * (first + c)] = slot;
        a.chunks[2 * (first + c) + 1] = begin + c * kChunk;
      }
      for (int64_t k = 0; k < a.slices * V; ++k) a.scratch[slot * a.slices * V + k] = acc_t<T>{0};
    }
    return;
  }
  for (int64_t s = lane; s < a.slices; s += lanes) {
    acc_t<T> acc[V];
    sum_slice(a, begin, end, s, acc);
    Slice<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_acc<T>(acc[k]);
    a.out[row * a.slices + s] = o;
  }
}

// One lane group per listed chunk: adds its entries' sum into its long row's scratch row.
template <typename T, typename I, int V>
__global__ void __launch_bounds__(kThreads) chunk_sum_kernel(Args<T, I, V> a) {
  const int64_t chunk = group_of(a.lanes_log2);
  if (chunk >= static_cast<int64_t>(a.counts[1])) return;
  const int lanes = 1 << a.lanes_log2;
  const int lane = threadIdx.x & (lanes - 1);
  const int64_t slot = a.chunks[2 * chunk], begin = a.chunks[2 * chunk + 1];
  int64_t row_begin, row_end;
  row_range(a, a.long_rows[slot], row_begin, row_end);
  const int64_t end = min(begin + kChunk, row_end);
  acc_t<T>* dst = a.scratch + slot * a.slices * V;
  for (int64_t s = lane; s < a.slices; s += lanes) {
    acc_t<T> acc[V];
    sum_slice(a, begin, end, s, acc);
#pragma unroll
    for (int k = 0; k < V; ++k) atomicAdd(dst + s * V + k, acc[k]);
  }
}

// One lane group per long row: writes its scratch row out in the output dtype.
template <typename T, typename I, int V>
__global__ void __launch_bounds__(kThreads) long_row_out_kernel(Args<T, I, V> a) {
  const int64_t slot = group_of(a.lanes_log2);
  if (slot >= static_cast<int64_t>(a.counts[0])) return;
  const int lanes = 1 << a.lanes_log2;
  const int lane = threadIdx.x & (lanes - 1);
  const int64_t row = a.long_rows[slot];
  const acc_t<T>* src = a.scratch + slot * a.slices * V;
  for (int64_t s = lane; s < a.slices; s += lanes) {
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
  row_sum_kernel<T, I, V><<<grid(a.rows), kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (a.counts == nullptr) return;
  chunk_sum_kernel<T, I, V><<<grid(max_chunks), kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  long_row_out_kernel<T, I, V><<<grid(max_long), kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// 16-byte slices where the channel count and the base addresses allow; one element a lane otherwise.
template <typename T, typename I>
void launch_widest(const at::Tensor& row_ptr, const at::Tensor& col, const at::Tensor& values, const at::Tensor& x,
                   at::Tensor& out, cudaStream_t stream) {
  constexpr int kV = cuda::kVecElems<T>;
  const auto aligned = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0; };
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
