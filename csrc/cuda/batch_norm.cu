// CUDA launchers of relconv::batch_norm_act and its backward (kernels in batch_norm.cuh). A training
// forward is two kernels (statistics + finalize, apply); a training backward the same (sums +
// finalize, input gradient); an eval forward one kernel. The reduction tickets need no per-call
// clearing (stream_tickets). Every size comes from tensor shapes: no host synchronisation,
// capturable in a CUDA graph.
#include "common/error_message.h"
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>

#include "common/batch_norm_checks.h"
#include "cuda/batch_norm.cuh"

namespace relconv {
namespace {

using cuda::acc_t;
using cuda::BnShape;
using cuda::kBnThreads;
using Opt = std::optional<at::Tensor>;

// Channels per tile: each tile's last block finalises its channels, so narrower tiles spread that
// serial tail over more blocks; 64 channels keep a tile's row segment at 128-512 contiguous bytes.
constexpr int64_t kTileChannels = 64;
// Reduction kernels: the fewest row steps a thread takes before another block is worth it. They
// launch at most as many blocks as fit the SMs at once (one wave; the grid is their occupancy).
constexpr int64_t kMinStepsPerThread = 4;
// Up to this many blocks a tile's partials are summed in one level: the second level's fence and
// ticket cost more than summing a few dozen rows at once.
constexpr int64_t kOneLevelBlocks = 32;
// Element-wise kernels: enough resident blocks to cover the SMs' thread slots.
constexpr int64_t kApplyBlocksPerSm = 8;

// Calls f(T{}, P{}) with the CUDA types of x's and the parameters' dtypes.
template <typename F>
void dispatch_bn_types(at::ScalarType x, at::ScalarType param, F&& f) {
  switch (x) {
    case at::kFloat: return f(float{}, float{});
    case at::kDouble: return f(double{}, double{});
    case at::kHalf: return param == at::kHalf ? f(__half{}, __half{}) : f(__half{}, float{});
    case at::kBFloat16:
      return param == at::kBFloat16 ? f(__nv_bfloat16{}, __nv_bfloat16{}) : f(__nv_bfloat16{}, float{});
    default: RELCONV_CHECK(false, "relconv batch_norm_act: unsupported dtype ", x);
  }
}

// Calls f(std::integral_constant<int, V>{}) with 16-byte vectors when every row pointer allows them.
template <typename T, typename F>
void dispatch_vec(bool vec, F&& f) {
  if (vec) {
    f(std::integral_constant<int, cuda::kVecElems<T>>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

template <typename T>
bool vectorizable(int64_t channels, std::initializer_list<const void*> ptrs) {
  if (channels % cuda::kVecElems<T> != 0) return false;
  return std::all_of(ptrs.begin(), ptrs.end(), [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; });
}

template <typename U>
U* ptr_or_null(const Opt& t) {
  return t.has_value() ? reinterpret_cast<U*>(t->data_ptr()) : nullptr;
}

template <typename U>
const U* cptr(const at::Tensor& t) {
  return reinterpret_cast<const U*>(t.const_data_ptr());
}

// The tiling of x (see batch_norm.cuh) and the grid sizes of both kernel kinds.
struct Launch {
  BnShape shape;
  int tiles;
  int reduce_blocks;  // per tile
  int groups;         // of reduce blocks, per tile
  int apply_blocks;
};

// Blocks of `kernel` (kBnThreads threads) that fit one SM at once, per instantiation.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel) {
  int blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kBnThreads, 0));
  return std::max(blocks, 1);
}

Launch plan(int64_t rows, int64_t channels, int vec, int64_t reduce_per_sm) {
  RELCONV_CHECK(channels <= std::numeric_limits<int32_t>::max() / 2, "relconv batch_norm_act: too many channels (",
              channels, ")");
  const int64_t groups = channels / vec;
  const int64_t wanted_tiles = (channels + kTileChannels - 1) / kTileChannels;
  const int64_t lanes = (groups + wanted_tiles - 1) / wanted_tiles;
  const int64_t tiles = (groups + lanes - 1) / lanes;
  RELCONV_CHECK(tiles <= 65535, "relconv batch_norm_act: too many channels (", channels, ")");
  const int64_t rows_per_iter = kBnThreads / lanes;
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t steps = (rows + rows_per_iter - 1) / rows_per_iter;

  const int64_t reduce_cap = std::max<int64_t>(1, reduce_per_sm * sms / tiles);
  int64_t reduce_blocks = std::clamp<int64_t>((steps + kMinStepsPerThread - 1) / kMinStepsPerThread, 1, reduce_cap);
  const int64_t chunk_steps = (steps + reduce_blocks - 1) / reduce_blocks;
  const int64_t rows_per_block = chunk_steps * rows_per_iter;
  reduce_blocks = (rows + rows_per_block - 1) / rows_per_block;  // no block without rows

  // Two summing levels of about sqrt(blocks) partials each (batch_norm.cuh); one for few blocks.
  int64_t group_blocks = reduce_blocks;
  if (reduce_blocks > kOneLevelBlocks) {
    group_blocks = 1;
    while (group_blocks * group_blocks < reduce_blocks) ++group_blocks;
  }

  const int64_t apply_blocks = std::clamp<int64_t>(steps, 1, std::max<int64_t>(1, kApplyBlocksPerSm * sms / tiles));
  return {BnShape{rows, static_cast<int>(channels), static_cast<int>(lanes), static_cast<int>(rows_per_iter),
                  rows_per_block, static_cast<int>(group_blocks)},
          static_cast<int>(tiles), static_cast<int>(std::max<int64_t>(reduce_blocks, 1)),
          static_cast<int>((reduce_blocks + group_blocks - 1) / group_blocks), static_cast<int>(apply_blocks)};
}

// Reduction tickets that are zero whenever a kernel on `stream` starts: one buffer per (device,
// stream), cleared when first made and kept zero by the kernels themselves (batch_norm.cuh). Kernels
// on one stream run in order, so they never share a ticket at the same time; torch's streams live
// as long as the process. Saves a memset (a host API call) per reduction: two per BatchNorm layer of
// a training step. Null where a per-call cleared ticket is needed instead: while the stream is
// being captured into a CUDA graph (the graph must not depend on state made outside it) and past
// kStreamTickets tiles.
unsigned* stream_tickets(int64_t count, const at::Tensor& like, cudaStream_t stream) {
  constexpr int64_t kStreamTickets = 1024;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (count > kStreamTickets || cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();  // a refused query (capture on another thread) is not an error here
    return nullptr;
  }
  static std::mutex mutex;
  // Never destroyed: the buffers must outlive every kernel, and static destructors run after the
  // CUDA runtime may have shut down.
  static auto* buffers = new std::map<std::pair<c10::DeviceIndex, cudaStream_t>, at::Tensor>();
  const std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& buffer = (*buffers)[{like.device().index(), stream}];
  if (!buffer.defined()) {
    buffer = at::empty({kStreamTickets}, like.options().dtype(at::kInt));
    C10_CUDA_CHECK(cudaMemsetAsync(buffer.mutable_data_ptr(), 0, buffer.nbytes(), stream));
  }
  return static_cast<unsigned*>(buffer.mutable_data_ptr());
}

// Scratch of one reduction: partials [2][blocks][C] and `coef_floats` more accumulation-type values,
// and one ticket per tile: the stream's (stream_tickets) or, where there are none, a per-call one
// after the values, cleared by a memset.
struct Workspace {
  at::Tensor storage;
  void* partials;
  void* coef;
  unsigned* tickets;
};

Workspace workspace(const Launch& l, const at::Tensor& x, int64_t coef_floats, cudaStream_t stream) {
  const int64_t elem = x.scalar_type() == at::kDouble ? 8 : 4;
  const int64_t partial_bytes = 2 * int64_t{l.reduce_blocks + l.groups} * l.shape.channels * elem;
  const int64_t coef_bytes = coef_floats * elem;
  const int64_t tickets = int64_t{l.tiles} * (1 + l.groups);
  Workspace w;
  w.tickets = stream_tickets(tickets, x, stream);
  const int64_t ticket_bytes = w.tickets ? 0 : tickets * static_cast<int64_t>(sizeof(unsigned));
  w.storage = at::empty({partial_bytes + coef_bytes + ticket_bytes}, x.options().dtype(at::kByte));
  auto* base = static_cast<char*>(w.storage.data_ptr());
  w.partials = base;
  w.coef = base + partial_bytes;
  if (!w.tickets) {
    w.tickets = reinterpret_cast<unsigned*>(base + partial_bytes + coef_bytes);
    C10_CUDA_CHECK(cudaMemsetAsync(w.tickets, 0, ticket_bytes, stream));
  }
  return w;
}

template <typename T, typename P>
cuda::BnParams<T, P> params(const Opt& weight, const Opt& bias, const Opt& running_mean, const Opt& running_var,
                            const at::Tensor& save_mean, const at::Tensor& save_invstd, double eps, bool training) {
  cuda::BnParams<T, P> p{};
  p.weight = ptr_or_null<const P>(weight);
  p.bias = ptr_or_null<const P>(bias);
  p.running_mean = ptr_or_null<const P>(running_mean);
  p.running_var = ptr_or_null<const P>(running_var);
  p.save_mean = training ? cptr<acc_t<T>>(save_mean) : nullptr;
  p.save_invstd = training ? cptr<acc_t<T>>(save_invstd) : nullptr;
  p.eps = eps;
  p.training = training;
  return p;
}

dim3 grid(int blocks, const Launch& l) { return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(l.tiles)); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_cuda(const at::Tensor& x, const Opt& weight,
                                                                   const Opt& bias, const Opt& running_mean,
                                                                   const Opt& running_var, bool training,
                                                                   double momentum, double eps, bool relu,
                                                                   const Opt& num_batches_tracked) {
  const auto param_type = check_batch_norm_args(x, weight, bias, running_mean, running_var, training);
  check_batch_counter(num_batches_tracked, x);
  RELCONV_CHECK_VALUE(x.is_contiguous(), "x must be contiguous");
  const c10::cuda::CUDAGuard guard(x.device());
  const auto acc_opts = x.options().dtype(acc_dtype(x.scalar_type()));
  const int64_t n = x.size(0), c = x.size(1);
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) {
    // An empty batch has no statistics (zeros are returned) and leaves the running ones alone; it
    // still counts as a batch, as in torch's BatchNorm.
    if (training && num_batches_tracked) num_batches_tracked->add_(1);
    const int64_t saved = training ? c : 0;
    return {out, at::zeros({saved}, acc_opts), at::zeros({saved}, acc_opts)};
  }
  at::Tensor save_mean = at::empty({training ? c : 0}, acc_opts);
  at::Tensor save_invstd = at::empty({training ? c : 0}, acc_opts);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_bn_types(x.scalar_type(), param_type, [&](auto t, auto pt) {
    using T = decltype(t);
    using P = decltype(pt);
    const T* xp = cptr<T>(x);
    T* yp = reinterpret_cast<T*>(out.data_ptr());
    dispatch_vec<T>(vectorizable<T>(c, {xp, yp}), [&](auto v) {
      constexpr int V = decltype(v)::value;
      static const int64_t stats_per_sm = resident_blocks(cuda::bn_stats<T, P, V>);
      const Launch l = plan(n, c, V, stats_per_sm);
      if (training) {
        const Workspace w = workspace(l, x, 0, stream);
        cuda::BnStatsArgs<T, P> a{};
        a.x = xp;
        a.partials = static_cast<acc_t<T>*>(w.partials);
        a.tickets = w.tickets;
        a.save_mean = reinterpret_cast<acc_t<T>*>(save_mean.data_ptr());
        a.save_invstd = reinterpret_cast<acc_t<T>*>(save_invstd.data_ptr());
        a.running_mean = ptr_or_null<P>(running_mean);
        a.running_var = ptr_or_null<P>(running_var);
        a.batch_counter = ptr_or_null<int64_t>(num_batches_tracked);
        a.momentum = momentum;
        a.eps = eps;
        cuda::bn_stats<T, P, V><<<grid(l.reduce_blocks, l), kBnThreads, 0, stream>>>(l.shape, a);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      const auto p = params<T, P>(weight, bias, running_mean, running_var, save_mean, save_invstd, eps, training);
      cuda::bn_apply<T, P, V><<<grid(l.apply_blocks, l), kBnThreads, 0, stream>>>(l.shape, xp, yp, p, relu);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {out, save_mean, save_invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& x, const Opt& weight, const Opt& bias, const Opt& running_mean,
    const Opt& running_var, const at::Tensor& save_mean, const at::Tensor& save_invstd, bool training, double eps,
    bool relu, std::array<bool, 3> output_mask) {
  const auto param_type = check_batch_norm_args(x, weight, bias, running_mean, running_var, training);
  check_batch_norm_backward_args(grad_out, x, save_mean, save_invstd, training);
  RELCONV_CHECK_VALUE(x.is_contiguous(), "x must be contiguous");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.size(0), c = x.size(1);
  const auto param_opts = x.options().dtype(param_type);
  at::Tensor grad_x = output_mask[0] ? at::empty_like(x) : at::empty({0}, x.options());
  at::Tensor grad_w = at::empty({output_mask[1] ? c : 0}, param_opts);
  at::Tensor grad_b = at::empty({output_mask[2] ? c : 0}, param_opts);
  if (x.numel() == 0) return {grad_x, grad_w.zero_(), grad_b.zero_()};
  const c10::MaybeOwned<at::Tensor> g = grad_out.expect_contiguous();
  const bool sums = output_mask[1] || output_mask[2] || (training && output_mask[0]);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_bn_types(x.scalar_type(), param_type, [&](auto t, auto pt) {
    using T = decltype(t);
    using P = decltype(pt);
    const T* xp = cptr<T>(x);
    const T* gp = cptr<T>(*g);
    T* gxp = output_mask[0] ? reinterpret_cast<T*>(grad_x.data_ptr()) : nullptr;
    dispatch_vec<T>(vectorizable<T>(c, {xp, gp, gxp}), [&](auto v) {
      constexpr int V = decltype(v)::value;
      static const int64_t reduce_per_sm = resident_blocks(cuda::bn_backward_reduce<T, P, V>);
      const Launch l = plan(n, c, V, reduce_per_sm);
      const auto p = params<T, P>(weight, bias, running_mean, running_var, save_mean, save_invstd, eps, training);
      const bool training_grad_x = training && output_mask[0];
      acc_t<T>* coef = nullptr;
      Workspace w{};  // held until both kernels are queued
      if (sums) {
        w = workspace(l, x, training_grad_x ? 2 * c : 0, stream);
        cuda::BnBackwardArgs<T, P> a{};
        a.grad_out = gp;
        a.x = xp;
        a.grad_x = training ? nullptr : gxp;  // eval: the input gradient is written by this kernel
        a.partials = static_cast<acc_t<T>*>(w.partials);
        a.tickets = w.tickets;
        a.grad_weight = output_mask[1] ? reinterpret_cast<P*>(grad_w.data_ptr()) : nullptr;
        a.grad_bias = output_mask[2] ? reinterpret_cast<P*>(grad_b.data_ptr()) : nullptr;
        coef = training_grad_x ? static_cast<acc_t<T>*>(w.coef) : nullptr;
        a.coef = coef;
        cuda::bn_backward_reduce<T, P, V><<<grid(l.reduce_blocks, l), kBnThreads, 0, stream>>>(l.shape, a, p, relu);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      // Training needs the sums first; eval without a parameter gradient needs no reduction at all.
      if (gxp && (training || !sums)) {
        cuda::bn_backward_apply<T, P, V>
            <<<grid(l.apply_blocks, l), kBnThreads, 0, stream>>>(l.shape, gp, xp, gxp, coef, p, relu);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
  });
  return {grad_x, grad_w, grad_b};
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CUDA, m) {
  m.impl("batch_norm_act", &batch_norm_act_cuda);
  m.impl("batch_norm_act_backward", &batch_norm_act_backward_cuda);
}

}  // namespace relconv
