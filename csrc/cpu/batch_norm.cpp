// CPU kernels of relconv::batch_norm_act and its backward, in ATen ops over the accumulation dtype:
// the same arithmetic as the CUDA kernels (csrc/cuda/batch_norm.cuh), so that the op, its autograd
// node and its fake kernel work and are tested on any machine. relconv.ops.batch_norm_act itself
// sends CPU tensors to torch.nn.functional.batch_norm.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>

#include "common/batch_norm_checks.h"

namespace relconv {
namespace {

at::Tensor acc(const at::Tensor& t) { return t.to(acc_dtype(t.scalar_type())); }

// (mean, invstd) in the accumulation dtype: the batch statistics saved by the forward when training,
// else the running ones.
std::pair<at::Tensor, at::Tensor> statistics(const at::ScalarType acc_type,
                                             const std::optional<at::Tensor>& running_mean,
                                             const std::optional<at::Tensor>& running_var, const at::Tensor& save_mean,
                                             const at::Tensor& save_invstd, bool training, double eps) {
  if (training) return {save_mean, save_invstd};
  return {running_mean->to(acc_type), (running_var->to(acc_type) + eps).rsqrt()};
}

// The forward's output (before the ReLU) in the accumulation dtype.
at::Tensor affine(const at::Tensor& xa, const at::Tensor& mean, const at::Tensor& invstd,
                  const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias) {
  at::Tensor scale = weight ? invstd * weight->to(invstd.scalar_type()) : invstd;
  at::Tensor out = (xa - mean) * scale;
  return bias ? out + bias->to(invstd.scalar_type()) : out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_cpu(
    const at::Tensor& x, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps, bool relu, const std::optional<at::Tensor>& num_batches_tracked) {
  check_batch_norm_args(x, weight, bias, running_mean, running_var, training);
  check_batch_counter(num_batches_tracked, x);
  if (training && num_batches_tracked) num_batches_tracked->add_(1);
  const auto acc_type = acc_dtype(x.scalar_type());
  const int64_t n = x.size(0);
  if (x.numel() == 0) {
    // An empty batch has no statistics (zeros are returned) and leaves the running ones alone.
    const int64_t saved = training ? x.size(1) : 0;
    const auto opts = x.options().dtype(acc_type);
    return {at::empty_like(x), at::zeros({saved}, opts), at::zeros({saved}, opts)};
  }
  const at::Tensor xa = acc(x);
  at::Tensor mean, invstd;
  if (training) {
    mean = xa.mean(0);
    const at::Tensor var = (xa - mean).square().mean(0);
    invstd = (var + eps).rsqrt();
    if (running_mean) {
      running_mean->copy_(running_mean->to(acc_type) * (1 - momentum) + mean * momentum);
      running_var->copy_(running_var->to(acc_type) * (1 - momentum) +
                         var * (momentum * static_cast<double>(n) / static_cast<double>(n - 1)));
    }
  } else {
    std::tie(mean, invstd) = statistics(acc_type, running_mean, running_var, mean, invstd, false, eps);
  }
  at::Tensor out = affine(xa, mean, invstd, weight, bias);
  if (relu) out = out.clamp_min(0);
  const auto opts = x.options().dtype(acc_type);
  return {out.to(x.scalar_type()), training ? mean : at::empty({0}, opts),
          training ? invstd : at::empty({0}, opts)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const at::Tensor& save_mean, const at::Tensor& save_invstd,
    bool training, double eps, bool relu, std::array<bool, 3> output_mask) {
  const auto param_type = check_batch_norm_args(x, weight, bias, running_mean, running_var, training);
  check_batch_norm_backward_args(grad_out, x, save_mean, save_invstd, training);
  const auto acc_type = acc_dtype(x.scalar_type());
  const auto param_opts = x.options().dtype(param_type);
  const int64_t c = x.size(1);
  at::Tensor grad_x = output_mask[0] ? at::empty_like(x) : at::empty({0}, x.options());
  at::Tensor grad_w = at::empty({output_mask[1] ? c : 0}, param_opts);
  at::Tensor grad_b = at::empty({output_mask[2] ? c : 0}, param_opts);
  if (x.numel() == 0) return {grad_x, grad_w.zero_(), grad_b.zero_()};
  const auto [mean, invstd] = statistics(acc_type, running_mean, running_var, save_mean, save_invstd, training, eps);
  const at::Tensor xa = acc(x);
  at::Tensor g = acc(grad_out);
  // ReLU's derivative from the output as the forward stored it (rounded to x's dtype).
  if (relu) g = g.masked_fill(affine(xa, mean, invstd, weight, bias).to(x.scalar_type()).le(0), 0);
  const at::Tensor centered = xa - mean;
  const at::Tensor sum_g = g.sum(0);
  const at::Tensor sum_gx = (g * centered).sum(0);
  if (output_mask[1]) grad_w.copy_(sum_gx * invstd);
  if (output_mask[2]) grad_b.copy_(sum_g);
  if (output_mask[0]) {
    const at::Tensor scale = weight ? invstd * weight->to(acc_type) : invstd;
    at::Tensor gx = g;
    if (training) {
      const double inv_n = 1.0 / static_cast<double>(x.size(0));
      gx = g - sum_g * inv_n - centered * (invstd.square() * sum_gx * inv_n);
    }
    grad_x.copy_(gx * scale);
  }
  return {grad_x, grad_w, grad_b};
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CPU, m) {
  m.impl("batch_norm_act", &batch_norm_act_cpu);
  m.impl("batch_norm_act_backward", &batch_norm_act_backward_cpu);
}

}  // namespace relconv
