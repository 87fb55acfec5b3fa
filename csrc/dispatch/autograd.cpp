// Autograd of the relconv ops in C++. A Python autograd function (torch.library.register_autograd)
// costs ~30 us of host time per call even under no_grad, more than the whole CUDA launch path of a
// cached-map layer; a C++ kernel at the Autograd key costs ~1 us.
//
// Gradients: the input gradient is the same op over the transposed map (in/out swapped, still
// grouped by relation) with W[r]^T; the weight gradient is relational_conv_weight_grad. Both are
// called through the dispatcher, so they are differentiable again (double backward). The epilogue
// (bias, ReLU) is differentiated here too: the incoming gradient is masked by (out > 0) when the op
// applied a ReLU, and the bias gradient is the masked gradient summed over the output rows.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "dispatch/ops.h"

namespace relconv {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor or_undefined(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }
std::optional<at::Tensor> as_optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}
// Whether an optional argument takes an input slot of the autograd node (custom_function.h's rule).
int64_t given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined() ? 1 : 0; }

// (in_index, out_index, rel_ptr) of the pairs in a neighbour table [num_out, R], sorted by
// (relation, out). The table forward accepts empty pair tensors ("not built", see
// relconv.core.RelationalMap.from_neighbor_table); the backward needs the pairs, so they are
// rebuilt here when a caller passed none and a gradient will be taken (one host sync).
std::tuple<at::Tensor, at::Tensor, at::Tensor> pairs_from_table(const at::Tensor& table) {
  const at::Tensor hit = table.t().ge(0);
  const at::Tensor nz = hit.nonzero();  // [P, 2] rows (relation, out), relation-major
  const at::Tensor rel = nz.select(1, 0), out = nz.select(1, 1);
  const at::Tensor in = table.index({out, rel});
  at::Tensor rel_ptr = at::zeros({table.size(1) + 1}, table.options().dtype(at::kLong));
  rel_ptr.slice(0, 1).copy_(hit.sum(1).cumsum(0));
  return {in, out.to(table.scalar_type()), rel_ptr};
}

class ConvFunction : public torch::autograd::Function<ConvFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& in_index, const at::Tensor& out_index, const at::Tensor& rel_ptr,
                            const std::optional<at::Tensor>& scale, c10::SymInt num_out,
                            const std::optional<at::Tensor>& neighbor_table,
                            const std::optional<at::Tensor>& table_order, const std::optional<at::Tensor>& bias,
                            bool relu) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor out = conv_op().call(x, weight, in_index, out_index, rel_ptr, scale, std::move(num_out),
                                    neighbor_table, table_order, bias, relu);
    // Only the x and weight gradients read the pairs; the bias gradient is a column sum of the grad.
    const bool needs_pairs = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
    // ReLU's derivative is (out > 0): the output is saved, not the pre-activation (which was never
    // materialised: the CUDA table kernel applies the ReLU in its epilogue).
    const at::Tensor saved_out = relu ? out : at::Tensor();
    if (needs_pairs && neighbor_table.has_value() && rel_ptr.sym_numel() == 0) {
      const auto [in, o, ptr] = pairs_from_table(*neighbor_table);
      ctx->save_for_backward({x, weight, in, o, ptr, or_undefined(scale), saved_out});
    } else {
      ctx->save_for_backward({x, weight, in_index, out_index, rel_ptr, or_undefined(scale), saved_out});
    }
    ctx->saved_data["num_in"] = x.sym_size(0);
    // needs_input_grad counts the tensor inputs actually given (absent optionals take no slot): the
    // bias comes after x, weight, the three pair tensors and whichever of scale, table, order exist.
    ctx->saved_data["bias_edge"] =
        given(bias) ? int64_t{5} + given(scale) + given(neighbor_table) + given(table_order) : int64_t{-1};
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &in_index = saved[2], &out_index = saved[3],
                     &rel_ptr = saved[4], &out = saved[6];
    const auto scale = as_optional(saved[5]);
    at::Tensor grad = grads[0];
    // Masking first: the bias, x and weight gradients all flow through the ReLU. The mask is
    // piecewise constant in the inputs, so this stays differentiable (double backward) in grad.
    if (out.defined()) grad = grad.masked_fill(out.le(0), 0);
    grad = grad.contiguous();
    at::Tensor grad_x, grad_w, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_x = conv_op().call(grad, weight.transpose(2, 3), out_index, in_index, rel_ptr, scale,
                              ctx->saved_data["num_in"].toSymInt(), std::nullopt, std::nullopt, std::nullopt,
                              false);
    }
    if (ctx->needs_input_grad(1)) {
      grad_w = weight_grad_op().call(x, grad, in_index, out_index, rel_ptr, scale, weight.size(1));
    }
    const int64_t bias_edge = ctx->saved_data["bias_edge"].toInt();
    if (bias_edge >= 0 && ctx->needs_input_grad(bias_edge)) {
      grad_bias = grad.sum(0);
    }
    return {grad_x,       grad_w,       at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), grad_bias,    at::Tensor()};
  }
};

class WeightGradFunction : public torch::autograd::Function<WeightGradFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& grad_out,
                            const at::Tensor& in_index, const at::Tensor& out_index, const at::Tensor& rel_ptr,
                            const std::optional<at::Tensor>& scale, int64_t groups) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({x, grad_out, in_index, out_index, rel_ptr, or_undefined(scale)});
    return weight_grad_op().call(x, grad_out, in_index, out_index, rel_ptr, scale, groups);
  }

  // dW = WG(x, g) is bilinear: d/dx = conv(g, gw^T, transposed map), d/dg = conv(x, gw, map).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &grad_out = saved[1], &in_index = saved[2], &out_index = saved[3],
                     &rel_ptr = saved[4];
    const auto scale = as_optional(saved[5]);
    const at::Tensor gw = grads[0].contiguous();
    at::Tensor dx, dg;
    if (ctx->needs_input_grad(0)) {
      dx = conv_op().call(grad_out, gw.transpose(2, 3), out_index, in_index, rel_ptr, scale, x.sym_size(0),
                          std::nullopt, std::nullopt, std::nullopt, false);
    }
    if (ctx->needs_input_grad(1)) {
      dg = conv_op().call(x, gw, in_index, out_index, rel_ptr, scale, grad_out.sym_size(0), std::nullopt,
                          std::nullopt, std::nullopt, false);
    }
    return {dx, dg, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor conv_autograd(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& in_index,
                         const at::Tensor& out_index, const at::Tensor& rel_ptr,
                         const std::optional<at::Tensor>& scale, c10::SymInt num_out,
                         const std::optional<at::Tensor>& neighbor_table,
                         const std::optional<at::Tensor>& table_order, const std::optional<at::Tensor>& bias,
                         bool relu) {
  return ConvFunction::apply(x, weight, in_index, out_index, rel_ptr, scale, std::move(num_out), neighbor_table,
                             table_order, bias, relu);
}

at::Tensor weight_grad_autograd(const at::Tensor& x, const at::Tensor& grad_out, const at::Tensor& in_index,
                                const at::Tensor& out_index, const at::Tensor& rel_ptr,
                                const std::optional<at::Tensor>& scale, int64_t groups) {
  return WeightGradFunction::apply(x, grad_out, in_index, out_index, rel_ptr, scale, groups);
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, Autograd, m) {
  m.impl("relational_conv", &conv_autograd);
  m.impl("relational_conv_weight_grad", &weight_grad_autograd);
}

}  // namespace relconv
