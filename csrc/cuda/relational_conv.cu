// CUDA wrappers of the relational-convolution ops: validate (metadata only), fill the kernel arguments
// and call the launchers (conv_launch.h), which launch the configuration common/kernel_choice.h names:
// ONE main kernel covering all relations. No host synchronisation: every launch size comes from tensor shapes, so a
// forward pass can be captured in a CUDA graph.
#include "common/error_message.h"
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>

#include "common/checks.h"
#include "cuda/conv_launch.h"
#include "cuda/bias_rows.cuh"
#include "cuda/device_buffers.h"
#include "cuda/weight_transpose.cuh"

namespace relconv {
namespace {

using cuda::acc_t;

// Calls f(T{}, Idx{}) with the CUDA element type of `dtype` and the index type of `index_dtype`.
template <typename F>
void dispatch_types(at::ScalarType dtype, at::ScalarType index_dtype, F&& f) {
  auto with_index = [&](auto t) {
    if (index_dtype == at::kInt) {
      f(t, int32_t{});
    } else {
      f(t, int64_t{});
    }
  };
  switch (dtype) {
    case at::kFloat: return with_index(float{});
    case at::kDouble: return with_index(double{});
    case at::kHalf: return with_index(__half{});
    case at::kBFloat16: return with_index(__nv_bfloat16{});
    default: RELCONV_CHECK(false, "relconv CUDA kernels: unsupported dtype ", dtype);
  }
}

template <typename T>
const T* ptr(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.const_data_ptr());
}

// Whether p lies on a multiple of `bytes` (> 0).
bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
bool aligned16(const void* p) { return aligned_to(p, 16); }

void check_int32_channels(const ConvShape& s) {
  RELCONV_CHECK(s.cin_g <= std::numeric_limits<int32_t>::max() && s.cout_g <= std::numeric_limits<int32_t>::max() &&
                  s.groups <= std::numeric_limits<int32_t>::max(),
              "relconv CUDA kernels: channel counts must fit int32");
}

// Whether `weight` (not contiguous) is the transpose of a contiguous tensor's last two dimensions:
// storage [..., size(d - 1), size(d - 2)] row-major, the input gradient's W^T.
bool stored_transposed(const at::Tensor& weight) {
  const int64_t d = weight.dim();
  if (d < 2 || weight.is_contiguous()) return false;
  const int64_t cols = weight.size(d - 2), rows = weight.size(d - 1);
  bool transposed = weight.stride(d - 2) == 1 && weight.stride(d - 1) == cols;
  for (int64_t k = d - 3, expected = rows * cols; k >= 0 && transposed; expected *= weight.size(k), --k) {
    transposed = weight.size(k) == 1 || weight.stride(k) == expected;
  }
  return transposed;
}

// `weight` as a contiguous tensor of its own shape. A transposed one (stored_transposed) is copied by
// one transpose launch; any other non-contiguous layout falls back to aten.
at::Tensor contiguous_weight(const at::Tensor& weight, cudaStream_t stream) {
  const int64_t d = weight.dim();
  if (!stored_transposed(weight) || weight.numel() == 0) return weight.contiguous();
  // The storage holds [..., rows, cols] row-major.
  const int64_t cols = weight.size(d - 2), rows = weight.size(d - 1);
  if ((rows + 31) / 32 > 65535 || cols > std::numeric_limits<int32_t>::max()) return weight.contiguous();
  at::Tensor out = at::empty(weight.sizes(), weight.options());
  const int64_t mats = weight.numel() / (rows * cols);
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32),
                  static_cast<unsigned>(std::min<int64_t>(mats, 65535)));
  const dim3 block(32, 8);
  const auto launch = [&](auto element) {
    using E = decltype(element);
    cuda::transpose_matrices<E><<<grid, block, 0, stream>>>(reinterpret_cast<const E*>(weight.const_data_ptr()),
                                                            reinterpret_cast<E*>(out.mutable_data_ptr()), mats,
                                                            static_cast<int>(rows), static_cast<int>(cols));
  };
  switch (weight.element_size()) {
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    case 8: launch(uint64_t{}); break;
    default: return weight.contiguous();
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// [num_out, C] rows each holding `bias` ([C], x's dtype) in the accumulation dtype `options`.
at::Tensor bias_rows(const at::Tensor& bias, int64_t num_out, const at::TensorOptions& options, cudaStream_t stream) {
  const int64_t cols = bias.numel();
  at::Tensor out = at::empty({num_out, cols}, options);
  const int64_t total = out.numel();
  if (total == 0) return out;
  const at::Tensor b = bias.contiguous();
  // A few blocks per SM, their threads a multiple of a row's 16-byte chunks where whole chunks tile
  // a row: every thread then stores one chunk of bias values, read once, on each row it visits.
  const int64_t chunks = (total * out.element_size() + 15) / 16;
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  int64_t blocks = std::max<int64_t>(std::min<int64_t>((chunks + 255) / 256, 8 * sms), 1);
  if (cols * out.element_size() % 16 == 0) {
    const int64_t per_row = cols * out.element_size() / 16;
    const int64_t step = per_row / std::gcd(per_row, int64_t{256});  // blocks whose threads tile rows
    if (step <= (1 << 16)) blocks = (blocks + step - 1) / step * step;
  }
  blocks = std::min<int64_t>(blocks, 1 << 16);
  dispatch_types(bias.scalar_type(), at::kInt, [&](auto t, auto) {
    using T = decltype(t);
    cuda::fill_bias_rows<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(ptr<T>(b), cols, total,
                                                        reinterpret_cast<acc_t<T>*>(out.mutable_data_ptr()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// The pair-list fields shared by the forward and weight-gradient argument structs.
template <typename T, typename Idx, typename Args>
void fill_pair_args(Args& a, const at::Tensor& in_index, const at::Tensor& out_index, const at::Tensor& rel_ptr,
                    const std::optional<at::Tensor>& scale, const ConvShape& s, int64_t num_in, int64_t num_out) {
  a.in_index = ptr<Idx>(in_index);
  a.out_index = ptr<Idx>(out_index);
  a.rel_ptr = rel_ptr.const_data_ptr<int64_t>();
  a.scale = scale ? ptr<acc_t<T>>(*scale) : nullptr;
  a.num_in = num_in;
  a.num_out = num_out;
  a.num_pairs = s.num_pairs;
  a.num_relations = s.num_relations;
  a.groups = static_cast<int>(s.groups);
  a.cin_g = static_cast<int>(s.cin_g);
  a.cout_g = static_cast<int>(s.cout_g);
}

// The output-stationary path (see conv_forward_table.cuh); writes every output element itself.
// The epilogue (bias, then ReLU) runs inside the kernel; an output with no work still gets it.
at::Tensor relational_conv_table_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& table,
                                      const std::optional<at::Tensor>& order, bool rows_sorted, const ConvShape& s,
                                      int64_t num_out, const std::optional<at::Tensor>& bias, bool relu) {
  const int64_t cout = s.groups * s.cout_g;
  if (num_out == 0 || s.cout_g == 0) return at::empty({num_out, cout}, x.options());
  // The pair count may be unknown here (s.num_pairs == -1): an all -1 table yields zeros anyway.
  if (s.num_pairs == 0 || s.cin_g == 0 || s.num_relations == 0 || x.size(0) == 0) {
    if (!bias.has_value()) return at::zeros({num_out, cout}, x.options());
    // A copy, never a view: the output must not alias the bias (expand of [C] to [1, C] is contiguous).
    at::Tensor out = bias->expand({num_out, cout}).clone(at::MemoryFormat::Contiguous);
    return relu ? out.relu_() : out;
  }
  check_int32_channels(s);
  const bool half = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
  // mma.sync and cp.async need sm_80+; the tensor-core kernel keeps input rows as int32 in shared memory.
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  const bool rows_fit = x.size(0) <= std::numeric_limits<int32_t>::max();
  if (half) {
    RELCONV_CHECK(prop->major >= 8, "relconv's fp16/bf16 output-stationary kernel needs compute capability 8.0+, got ",
                prop->major, ".", prop->minor, "; use dataflow=Dataflow.FETCH_ON_DEMAND");
    RELCONV_CHECK(rows_fit, "relconv: the fp16/bf16 output-stationary kernel takes at most 2^31 - 1 input rows, got ",
                x.size(0));
  }
  // Whether fp32 may run on TF32 tensor cores; the kernel choice (common/kernel_choice.h) decides.
  const bool allow_tf32 = at::globalContext().allowTF32CuBLAS();
  at::Tensor out = at::empty({num_out, s.groups * s.cout_g}, x.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor xc = x.contiguous(), tc = table.contiguous();
  const std::optional<at::Tensor> oc = order.has_value() ? std::optional(order->contiguous()) : std::nullopt;
  const std::optional<at::Tensor> bc = bias.has_value() ? std::optional(bias->contiguous()) : std::nullopt;
  dispatch_types(x.scalar_type(), table.scalar_type(), [&](auto t, auto i) {
    using T = decltype(t);
    using Idx = decltype(i);
    constexpr int V = cuda::kVecElems<T>;
    cuda::ConvTableArgs<T, Idx> a{};
    a.x = ptr<T>(xc);
    a.table = ptr<Idx>(tc);
    a.order = oc ? ptr<Idx>(*oc) : nullptr;
    a.rows_sorted = rows_sorted;
    a.bias = bc ? ptr<T>(*bc) : nullptr;
    a.relu = relu;
    a.out = reinterpret_cast<T*>(out.mutable_data_ptr());
    a.num_in = x.size(0);
    a.num_out = num_out;
    a.num_relations = s.num_relations;
    a.groups = static_cast<int>(s.groups);
    a.cin_g = static_cast<int>(s.cin_g);
    a.cout_g = static_cast<int>(s.cout_g);
    a.vec_x = s.cin_g % V == 0 && aligned16(a.x);
    a.x_chunks = s.cin_g > 0 && aligned_to(a.x, s.cin_g * sizeof(T));
    a.vec_out2 = s.cout_g % 2 == 0 && aligned_to(a.out, 2 * sizeof(T));
    if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
      // The input gradient's W^T view: the whole-tile kernels read it as it is stored (rows of C_in_g),
      // with no transposed copy; other shapes take the copy below.
      if (stored_transposed(weight)) {
        a.weight = ptr<T>(weight);
        a.weight_t = true;
        a.vec_w = s.cin_g % V == 0 && aligned16(a.weight);
        if (launch::forward_table<T, Idx>(a, allow_tf32, stream)) return;
        a.weight_t = false;
      }
    }
    const at::Tensor wc = contiguous_weight(weight, stream);
    a.weight = ptr<T>(wc);
    a.vec_w = s.cout_g % V == 0 && aligned16(a.weight);
    launch::forward_table<T, Idx>(a, allow_tf32, stream);
  });
  return out;
}

// Adds every pair's scale * x[in] @ W[r] into `acc` ([num_out, groups * cout_g], contiguous, in x's
// accumulation dtype) with the atomics kernel, which has no epilogue: an output is complete only when
// every block is done.
void add_pairs(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& in_index, const at::Tensor& out_index,
               const at::Tensor& rel_ptr, const std::optional<at::Tensor>& scale, const ConvShape& s,
               int64_t num_out, at::Tensor& acc, cudaStream_t stream) {
  if (s.num_pairs == 0 || num_out == 0 || s.cin_g == 0 || s.cout_g == 0 || s.num_relations == 0) return;
  check_int32_channels(s);
  const at::Tensor xc = x.contiguous(), wc = contiguous_weight(weight, stream);
  const at::Tensor ii = in_index.contiguous(), oi = out_index.contiguous(), rp = rel_ptr.contiguous();
  const std::optional<at::Tensor> sc = scale.has_value() ? std::optional(scale->contiguous()) : std::nullopt;
  dispatch_types(x.scalar_type(), in_index.scalar_type(), [&](auto t, auto i) {
    using T = decltype(t);
    using Idx = decltype(i);
    constexpr int V = cuda::kVecElems<T>;
    cuda::ConvForwardArgs<T, Idx> a{};
    a.x = ptr<T>(xc);
    a.weight = ptr<T>(wc);
    fill_pair_args<T, Idx>(a, ii, oi, rp, sc, s, x.size(0), num_out);
    a.out = reinterpret_cast<acc_t<T>*>(acc.mutable_data_ptr());
    // Row offsets are multiples of cin_g (x) / cout_g (W), so those decide vector loads.
    a.vec_x = s.cin_g % V == 0 && aligned16(a.x);
    a.vec_w = s.cout_g % V == 0 && aligned16(a.weight);
    launch::forward_pairs<T, Idx>(a, rp, stream);
  });
}

at::Tensor relational_conv_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& in_index,
                                const at::Tensor& out_index, const at::Tensor& rel_ptr,
                                const std::optional<at::Tensor>& scale, int64_t num_out,
                                const std::optional<at::Tensor>& neighbor_table,
                                const std::optional<at::Tensor>& table_order, const std::optional<at::Tensor>& bias,
                                bool relu, const std::optional<at::Tensor>& transposed_table,
                                const std::optional<at::Tensor>& transposed_order, bool sorted_tables) {
  // A map built as a neighbour table passes no pairs to an inference forward (pairs_absent).
  const bool table_only = pairs_absent(neighbor_table, in_index, out_index, rel_ptr);
  const ConvShape s = check_conv_args(x, weight, in_index, out_index, rel_ptr, scale, table_only);
  RELCONV_CHECK_VALUE(num_out >= 0, "num_out must be non-negative, got ", num_out);
  RELCONV_CHECK_VALUE(x.is_cuda(), "x must be a CUDA tensor, got ", x.device());
  check_neighbor_table(neighbor_table, table_order, in_index, scale, num_out, s.num_relations);
  check_transposed_table(transposed_table, transposed_order, neighbor_table, x.size(0), s.num_relations);
  check_bias(bias, x, s.groups * s.cout_g);
  const c10::cuda::CUDAGuard guard(x.device());
  if (neighbor_table.has_value()) {
    return relational_conv_table_cuda(x, weight, *neighbor_table, table_order, sorted_tables, s, num_out, bias, relu);
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // float32/float64 accumulate straight into the output; half/bfloat16 into an fp32 buffer, cast at the end.
  // The accumulator starts from the bias: one write of it instead of a zero fill and a pass that adds
  // the bias (on an AM-shaped R-GCN layer, 1.67M rows of 64 fp32 channels on an H200, 100 us instead
  // of 95 + 313 us). ReLU is a pass over the accumulator before its one rounding to x's dtype.
  const int64_t out_shape[] = {num_out, s.groups * s.cout_g};
  const auto acc_options = x.options().dtype(acc_dtype(x.scalar_type()));
  at::Tensor out = bias.has_value() ? bias_rows(*bias, num_out, acc_options, stream)
                                    : memset_tensor(out_shape, acc_options, 0, stream);
  add_pairs(x, weight, in_index, out_index, rel_ptr, scale, s, num_out, out, stream);
  if (relu) out.relu_();
  return out.scalar_type() == x.scalar_type() ? out : out.to(x.scalar_type());
}

void relational_conv_add_cuda(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& in_index, const at::Tensor& out_index, const at::Tensor& rel_ptr,
                              const std::optional<at::Tensor>& scale) {
  const ConvShape s = check_conv_args(x, weight, in_index, out_index, rel_ptr, scale);
  RELCONV_CHECK_VALUE(x.is_cuda(), "x must be a CUDA tensor, got ", x.device());
  check_add_out(out, x, weight, s.groups * s.cout_g);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t num_out = out.size(0);
  if (out.is_contiguous() && out.scalar_type() == acc_dtype(x.scalar_type())) {
    add_pairs(x, weight, in_index, out_index, rel_ptr, scale, s, num_out, out, stream);
    return;
  }
  // A half / bfloat16 or strided out: the sum in its own accumulator, added with one rounding.
  const int64_t shape[] = {num_out, s.groups * s.cout_g};
  at::Tensor acc = memset_tensor(shape, x.options().dtype(acc_dtype(x.scalar_type())), 0, stream);
  add_pairs(x, weight, in_index, out_index, rel_ptr, scale, s, num_out, acc, stream);
  out.copy_(acc.add_(out));
}

// ---------------------------------------------------------------- weight gradient

// Deterministic (bitwise reproducible, no atomics) under torch.use_deterministic_algorithms(True).
at::Tensor relational_conv_weight_grad_cuda(const at::Tensor& x, const at::Tensor& grad_out,
                                            const at::Tensor& in_index, const at::Tensor& out_index,
                                            const at::Tensor& rel_ptr, const std::optional<at::Tensor>& scale,
                                            int64_t groups, std::optional<at::ScalarType> out_dtype) {
  const ConvShape s = check_weight_grad_args(x, grad_out, in_index, out_index, rel_ptr, scale, groups);
  const at::ScalarType out = weight_grad_dtype(x, out_dtype);
  RELCONV_CHECK_VALUE(x.is_cuda(), "x must be a CUDA tensor, got ", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  if (s.num_pairs == 0 || s.cin_g == 0 || s.cout_g == 0 || s.num_relations == 0 || x.size(0) == 0 ||
      grad_out.size(0) == 0) {
    return at::zeros({s.num_relations, s.groups, s.cin_g, s.cout_g}, x.options().dtype(out));
  }
  check_int32_channels(s);
  const at::Tensor xc = x.contiguous(), gc = grad_out.contiguous();
  const at::Tensor ii = in_index.contiguous(), oi = out_index.contiguous(), rp = rel_ptr.contiguous();
  const std::optional<at::Tensor> sc = scale.has_value() ? std::optional(scale->contiguous()) : std::nullopt;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  at::Tensor dw;
  dispatch_types(x.scalar_type(), in_index.scalar_type(), [&](auto t, auto i) {
    using T = decltype(t);
    using Idx = decltype(i);
    constexpr int V = cuda::kVecElems<T>;
    cuda::WeightGradArgs<T, Idx> a{};
    a.x = ptr<T>(xc);
    a.grad = ptr<T>(gc);
    fill_pair_args<T, Idx>(a, ii, oi, rp, sc, s, x.size(0), grad_out.size(0));
    a.vec_x = s.cin_g % V == 0 && aligned16(a.x);
    a.vec_g = s.cout_g % V == 0 && aligned16(a.grad);
    a.x_chunks = aligned_to(a.x, s.cin_g * sizeof(T));
    dw = launch::weight_grad<T, Idx>(a, rp, deterministic, x.options(), out, stream);
  });
  return dw;
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CUDA, m) {
  m.impl("relational_conv", &relational_conv_cuda);
  m.impl("relational_conv_add_", &relational_conv_add_cuda);
  m.impl("relational_conv_weight_grad", &relational_conv_weight_grad_cuda);
}

}  // namespace relconv