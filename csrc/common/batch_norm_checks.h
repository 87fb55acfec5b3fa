#pragma once
// Argument validation of relconv::batch_norm_act and its backward, shared by the CPU and CUDA
// kernels. Metadata only: no host synchronisation.
#include "common/error_message.h"
#include <ATen/ATen.h>

#include <optional>

#include "common/checks.h"

namespace relconv {

// Checks x [N, C] and the optional per-channel tensors; returns the parameter dtype (the dtype of
// every given weight / bias / running statistic: x's own, or float32 for half / bfloat16 x as torch's
// mixed BatchNorm allows; x's accumulation dtype when none is given).
inline at::ScalarType check_batch_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                            const std::optional<at::Tensor>& bias,
                                            const std::optional<at::Tensor>& running_mean,
                                            const std::optional<at::Tensor>& running_var, bool training) {
  check_features("x", x);
  const auto dt = x.scalar_type();
  const bool half = dt == at::kHalf || dt == at::kBFloat16;
  std::optional<at::ScalarType> param_dtype;
  const std::pair<const char*, const std::optional<at::Tensor>*> params[] = {
      {"weight", &weight}, {"bias", &bias}, {"running_mean", &running_mean}, {"running_var", &running_var}};
  for (const auto& [name, opt] : params) {
    if (!opt->has_value()) continue;
    const at::Tensor& p = **opt;
    RELCONV_CHECK_VALUE(p.dim() == 1 && p.size(0) == x.size(1), name, " must have shape [C] = [", x.size(1),
                      "], got ", p.sizes());
    RELCONV_CHECK_VALUE(p.device() == x.device(), name, " must be on ", x.device(), " like x, got ", p.device());
    RELCONV_CHECK_VALUE(p.scalar_type() == dt || (half && p.scalar_type() == at::kFloat), name, " must be ", dt,
                      half ? " or float32" : "", " for ", dt, " x, got ", p.scalar_type());
    RELCONV_CHECK_VALUE(!param_dtype || *param_dtype == p.scalar_type(), name, " dtype (", p.scalar_type(),
                      ") must match the other parameters' dtype (", *param_dtype, ")");
    RELCONV_CHECK_VALUE(p.is_contiguous(), name, " must be contiguous");
    param_dtype = p.scalar_type();
  }
  RELCONV_CHECK_VALUE(running_mean.has_value() == running_var.has_value(),
                    "running_mean and running_var must be given together");
  RELCONV_CHECK_VALUE(training || running_mean.has_value(),
                    "running_mean and running_var are required when training=False");
  // torch.nn.functional.batch_norm's rule: one value per channel has no batch variance.
  RELCONV_CHECK_VALUE(!training || x.size(0) != 1,
                    "Expected more than 1 value per channel when training, got input size ", x.sizes());
  return param_dtype.value_or(acc_dtype(dt));
}

// torch's BatchNorm counter (num_batches_tracked): an int64 one-element tensor on x's device.
inline void check_batch_counter(const std::optional<at::Tensor>& counter, const at::Tensor& x) {
  if (!counter.has_value()) return;
  RELCONV_CHECK_VALUE(counter->scalar_type() == at::kLong && counter->numel() == 1,
                    "num_batches_tracked must be an int64 tensor of one element, got ", counter->scalar_type(),
                    " of shape ", counter->sizes());
  RELCONV_CHECK_VALUE(counter->device() == x.device(), "num_batches_tracked must be on ", x.device(),
                    " like x, got ", counter->device());
}

// The backward's extra tensors against x: grad_out like x, the saved batch statistics [C] in the
// accumulation dtype when training.
inline void check_batch_norm_backward_args(const at::Tensor& grad_out, const at::Tensor& x,
                                           const at::Tensor& save_mean, const at::Tensor& save_invstd,
                                           bool training) {
  RELCONV_CHECK_VALUE(grad_out.sizes() == x.sizes(), "grad_out must have x's shape ", x.sizes(), ", got ",
                    grad_out.sizes());
  RELCONV_CHECK_VALUE(grad_out.scalar_type() == x.scalar_type() && grad_out.device() == x.device(),
                    "grad_out must be ", x.scalar_type(), " on ", x.device(), " like x, got ", grad_out.scalar_type(),
                    " on ", grad_out.device());
  if (!training) return;
  for (const auto* t : {&save_mean, &save_invstd}) {
    RELCONV_CHECK_VALUE(t->dim() == 1 && t->size(0) == x.size(1) && t->scalar_type() == acc_dtype(x.scalar_type()) &&
                          t->device() == x.device(),
                      "save_mean and save_invstd must be ", acc_dtype(x.scalar_type()), " [C] = [", x.size(1),
                      "] on ", x.device(), " when training, got ", t->scalar_type(), " ", t->sizes(), " on ",
                      t->device());
  }
}

}  // namespace relconv
