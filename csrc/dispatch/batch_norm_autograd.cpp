// Autograd of relconv::batch_norm_act in C++ (~1 us of host time, against ~30 us for a Python
// autograd function; see autograd.cpp). The node saves x, weight, bias and the statistics the
// forward used: the batch ones it returned (save_mean, save_invstd) when training, the running ones
// otherwise. The ReLU's mask is recomputed from them by the backward kernel, so the output is not
// saved.
//
// The backward op is not differentiable. Under create_graph=True the gradients come back through a
// DelayedError node (what torch.autograd.function.once_differentiable does): a first-order backward
// works, differentiating the gradients again raises a clear error instead of returning wrong zeros.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>

#include "dispatch/ops.h"

namespace relconv {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Opt = std::optional<at::Tensor>;

using BatchNormBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const Opt&, const Opt&, const Opt&, const Opt&, const at::Tensor&,
    const at::Tensor&, bool, double, bool, std::array<bool, 3>);

const c10::TypedOperatorHandle<BatchNormBackwardSignature>& batch_norm_backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("relconv::batch_norm_act_backward", "")
                             .typed<BatchNormBackwardSignature>();
  return op;
}

at::Tensor or_undefined(const Opt& t) { return t.has_value() ? *t : at::Tensor(); }
Opt as_optional(const at::Tensor& t) { return t.defined() ? Opt(t) : std::nullopt; }

// The running statistics change in place; their version counters say so, as torch's BatchNorm does,
// so that a backward which saved them earlier (an eval-mode call) fails loudly instead of reading
// the new values.
void bump_version(const Opt& t) {
  if (t.has_value() && !t->is_inference()) torch::autograd::impl::bump_version(*t);
}

class BatchNormActFunction : public torch::autograd::Function<BatchNormActFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const Opt& weight, const Opt& bias,
                               const Opt& running_mean, const Opt& running_var, bool training, double momentum,
                               double eps, bool relu, const Opt& num_batches_tracked) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, save_mean, save_invstd] = batch_norm_op().call(x, weight, bias, running_mean, running_var, training,
                                                              momentum, eps, relu, num_batches_tracked);
    if (training) {
      bump_version(running_mean);
      bump_version(running_var);
      bump_version(num_batches_tracked);
      ctx->save_for_backward({x, or_undefined(weight), or_undefined(bias), save_mean, save_invstd});
    } else {
      ctx->save_for_backward(
          {x, or_undefined(weight), or_undefined(bias), or_undefined(running_mean), or_undefined(running_var)});
    }
    ctx->mark_non_differentiable({save_mean, save_invstd});
    // The statistics outputs never get a gradient: materialising theirs would cost two zero-filled
    // tensors (two fills) per backward. An undefined output gradient is handled below instead.
    ctx->set_materialize_grads(false);
    ctx->saved_data["training"] = training;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["relu"] = relu;
    // needs_input_grad counts only the tensor inputs actually given (custom_function.h's rule).
    const bool has_weight = weight.has_value() && weight->defined();
    ctx->saved_data["weight_edge"] = has_weight ? int64_t{1} : int64_t{-1};
    ctx->saved_data["bias_edge"] = bias.has_value() && bias->defined() ? int64_t{1} + has_weight : int64_t{-1};
    return {out, save_mean, save_invstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(10);  // nothing flows back through the output
    const auto saved = ctx->get_saved_variables();
    const bool training = ctx->saved_data["training"].toBool();
    const int64_t weight_edge = ctx->saved_data["weight_edge"].toInt();
    const int64_t bias_edge = ctx->saved_data["bias_edge"].toInt();
    const std::array<bool, 3> mask = {ctx->needs_input_grad(0), weight_edge >= 0 && ctx->needs_input_grad(weight_edge),
                                      bias_edge >= 0 && ctx->needs_input_grad(bias_edge)};
    const at::Tensor stat0 = training ? at::Tensor() : saved[3];
    const at::Tensor stat1 = training ? at::Tensor() : saved[4];
    // The eval-mode backward reads the running statistics; its saved-statistics arguments are empty.
    const at::Tensor no_stat = training ? at::Tensor() : at::empty({0}, saved[0].options());
    const bool create_graph = at::GradMode::is_enabled();
    variable_list out(3);
    {
      at::AutoDispatchBelowADInplaceOrView below;
      auto [gx, gw, gb] = batch_norm_backward_op().call(
          grads[0], saved[0], as_optional(saved[1]), as_optional(saved[2]), as_optional(stat0), as_optional(stat1),
          training ? saved[3] : no_stat, training ? saved[4] : no_stat, training,
          ctx->saved_data["eps"].toDouble(), ctx->saved_data["relu"].toBool(), mask);
      out = {mask[0] ? gx : at::Tensor(), mask[1] ? gw : at::Tensor(), mask[2] ? gb : at::Tensor()};
    }
    if (create_graph) {
      for (auto& t : out) {
        if (!t.defined()) continue;
        t = t.detach();
        t.set_requires_grad(true);  // so that the error node becomes their grad_fn
      }
      torch::autograd::DelayedError error("relconv::batch_norm_act: double backward is not supported", 3);
      out = error.apply(std::move(out));
    }
    // One entry per forward argument: x, weight, bias, running_mean, running_var, training, momentum,
    // eps, relu, num_batches_tracked.
    return {out[0],       out[1],       out[2],       at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_autograd(const at::Tensor& x, const Opt& weight,
                                                                       const Opt& bias, const Opt& running_mean,
                                                                       const Opt& running_var, bool training,
                                                                       double momentum, double eps, bool relu,
                                                                       const Opt& num_batches_tracked) {
  auto outs = BatchNormActFunction::apply(x, weight, bias, running_mean, running_var, training, momentum, eps, relu,
                                          num_batches_tracked);
  return {outs[0], outs[1], outs[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, Autograd, m) { m.impl("batch_norm_act", &batch_norm_act_autograd); }

}  // namespace relconv
