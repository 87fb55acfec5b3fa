// Autocast kernels: under torch.autocast the features and weights run in the autocast dtype
// (fp16/bf16, tensor cores on the GPU) instead of whatever dtype the caller's tensors have. Without
// them a custom op is invisible to autocast: an fp32 model under autocast ran every relconv conv in
// fp32 (SIMT) and paid for autocast's casts around it, slower than plain fp32.
// The bias goes with them (the op wants it in x's dtype); the per-pair scale stays in its
// accumulation dtype (float32 for half inputs). The weight is passed on in its own dtype: the
// autograd kernel casts it below autograd (see ConvFunction), so a training step records no cast
// node per conv and the weight gradient reaches the float32 parameter without a ToCopyBackward.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "dispatch/conv_call.h"
#include "dispatch/ops.h"

namespace relconv {
namespace {

template <c10::DispatchKey kKey, c10::DeviceType kDevice>
at::Tensor conv_autocast(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& in_index,
                         const at::Tensor& out_index, const at::Tensor& rel_ptr,
                         const std::optional<at::Tensor>& scale, c10::SymInt num_out,
                         const std::optional<at::Tensor>& neighbor_table,
                         const std::optional<at::Tensor>& table_order, const std::optional<at::Tensor>& bias,
                         bool relu, const std::optional<at::Tensor>& transposed_table,
                         const std::optional<at::Tensor>& transposed_order, bool sorted_tables) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
  const auto dtype = at::autocast::get_autocast_dtype(kDevice);
  return ConvCall{at::autocast::cached_cast(dtype, x, kDevice),
                  weight,
                  in_index,
                  out_index,
                  rel_ptr,
                  scale,
                  std::move(num_out),
                  neighbor_table,
                  table_order,
                  at::autocast::cached_cast(dtype, bias, kDevice),
                  relu,
                  transposed_table,
                  transposed_order,
                  sorted_tables}
      .run();
}

template <c10::DispatchKey kKey, c10::DeviceType kDevice>
at::Tensor weight_grad_autocast(const at::Tensor& x, const at::Tensor& grad_out, const at::Tensor& in_index,
                                const at::Tensor& out_index, const at::Tensor& rel_ptr,
                                const std::optional<at::Tensor>& scale, int64_t groups,
                                std::optional<at::ScalarType> out_dtype) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
  const auto dtype = at::autocast::get_autocast_dtype(kDevice);
  return weight_grad_op().call(at::autocast::cached_cast(dtype, x, kDevice),
                               at::autocast::cached_cast(dtype, grad_out, kDevice), in_index, out_index, rel_ptr,
                               scale, groups, out_dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, AutocastCUDA, m) {
  m.impl("relational_conv", &conv_autocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>);
  m.impl("relational_conv_weight_grad",
         &weight_grad_autocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>);
}

TORCH_LIBRARY_IMPL(relconv, AutocastCPU, m) {
  m.impl("relational_conv", &conv_autocast<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>);
  m.impl("relational_conv_weight_grad", &weight_grad_autocast<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>);
}

}  // namespace relconv
