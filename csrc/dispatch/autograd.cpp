// Autograd of the relconv ops in C++. A Python autograd function (torch.library.register_autograd)
// costs ~30 us of host time per call even under no_grad, more than the whole CUDA launch path of a
// cached-map layer; a C++ kernel at the Autograd key costs ~1 us.
//
// Gradients: the input gradient is the same op over the transposed map (in/out swapped, still
// grouped by relation) with W[r]^T; the weight gradient is relational_conv_weight_grad. Both are
// called through the dispatcher, so they are differentiable again (double backward). When the caller
// gives the transposed map's neighbour table (transposed_table: only maps injective per relation both
// ways have one, see csrc/library.cpp), the CUDA input gradient is the table kernel over it (no
// atomics, bitwise reproducible); otherwise it runs over the pairs. The table is never derived here:
// a map with unique slots that repeats an input within a relation has no transposed table, and only
// the map knows which kind it is.
// The epilogue (bias, ReLU) is differentiated here too: the incoming gradient is masked by
// (out > 0) when the op applied a ReLU, and the bias gradient is the masked gradient summed over
// the output rows.
// The weight comes as [R, C_in, C_out] (groups == 1) or [R, G, C_in/G, C_out/G]; the backward views
// it as 4-D here, below autograd (no node of its own), and returns its gradient in the shape given.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "common/checks.h"
#include "dispatch/conv_call.h"
#include "dispatch/ops.h"

namespace relconv {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor or_undefined(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }
std::optional<at::Tensor> as_optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}
// The weight in the dtype the op runs in: a float32 weight with half-precision features is cast to
// the features' dtype (unrecorded); any other weight is returned as it is.
at::Tensor weight_for_op(const at::Tensor& x, const at::Tensor& weight) {
  const bool mixed =
      weight.scalar_type() == at::kFloat && (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16);
  return mixed ? weight.to(x.scalar_type()) : weight;
}
// Whether autograd has work in a call: a recorded input that needs a gradient, or a forward-mode
// tangent on one (Function::apply then raises that the op has no jvp, rather than dropping it).
bool differentiated(bool recording, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c) {
  const auto tracked = [recording](const at::Tensor& t) {
    return t.defined() && ((recording && t.requires_grad()) || t._fw_grad(/*level=*/0).defined());
  };
  return tracked(a) || tracked(b) || (c.has_value() && tracked(*c));
}
// Whether an optional argument takes an input slot of the autograd node (custom_function.h's rule).
int64_t given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined() ? 1 : 0; }

// The tensors a conv node saves, by name (save_for_backward takes them as one list).
enum Saved : size_t {
  kX,
  kWeight,
  kInIndex,
  kOutIndex,
  kRelPtr,
  kScale,
  kOut,              // the output, when a ReLU masks the gradient
  kTable,            // the forward's neighbour table, when given
  kTableOrder,       // its schedule, with the transposed table
  kTransposed,       // the transposed table, when the CUDA input gradient runs over it
  kTransposedOrder,  // its schedule
  kCastWeight,       // the weight cast to x's dtype, when the op ran a float32 weight in half precision
  kNumSaved,
};

class ConvFunction : public torch::autograd::Function<ConvFunction> {
 public:
  // Function::apply finds the differentiable inputs among its arguments, so they come one by one.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& in_index, const at::Tensor& out_index, const at::Tensor& rel_ptr,
                            const std::optional<at::Tensor>& scale, c10::SymInt num_out,
                            const std::optional<at::Tensor>& neighbor_table,
                            const std::optional<at::Tensor>& table_order, const std::optional<at::Tensor>& bias,
                            bool relu, const std::optional<at::Tensor>& transposed_table,
                            const std::optional<at::Tensor>& transposed_order, bool sorted_tables) {
    at::AutoDispatchBelowADInplaceOrView below;
    // A float32 weight with half / bfloat16 x (a parameter under autocast, see autocast.cpp) runs in
    // x's dtype: cast here, unrecorded; the gradient comes back in x's dtype and the autograd engine
    // casts it to the weight's dtype. The cast copy is saved for the input gradient; a backward that
    // builds a graph (double backward) casts again from the saved weight, so that the cast is
    // recorded and reaches the weight. Other mismatches reach the checks.
    const at::Tensor w = weight_for_op(x, weight);
    const bool mixed = !w.is_same(weight);
    at::Tensor out = ConvCall{x,           w,    in_index, out_index,        rel_ptr,          scale,
                              std::move(num_out), neighbor_table, table_order, bias, relu, transposed_table,
                              transposed_order,   sorted_tables}
                         .run();
    // The transposed table serves the input gradient on CUDA only: the CPU kernel reads the pairs.
    const bool table_dgrad = transposed_table.has_value() && transposed_table->is_cuda();
    std::vector<at::Tensor> saved(kNumSaved);
    saved[kX] = x;
    saved[kWeight] = weight;
    saved[kInIndex] = in_index;
    saved[kOutIndex] = out_index;
    saved[kRelPtr] = rel_ptr;
    saved[kScale] = or_undefined(scale);
    // ReLU's derivative is (out > 0): the output is saved, not the pre-activation (which was never
    // materialised: the CUDA table kernel applies the ReLU in its epilogue).
    if (relu) saved[kOut] = out;
    // The table rebuilds absent pairs in the backward; with the transposed table and both orders
    // it runs the input gradient over the transposed one.
    saved[kTable] = or_undefined(neighbor_table);
    if (table_dgrad) {
      saved[kTableOrder] = or_undefined(table_order);
      saved[kTransposed] = *transposed_table;
      saved[kTransposedOrder] = or_undefined(transposed_order);
    }
    if (mixed) saved[kCastWeight] = w;
    ctx->save_for_backward(saved);
    ctx->saved_data["num_in"] = x.sym_size(0);
    ctx->saved_data["sorted_tables"] = sorted_tables;
    // needs_input_grad counts the tensor inputs actually given (absent optionals take no slot): the
    // bias comes after x, weight, the three pair tensors and whichever of scale, table, order exist.
    ctx->saved_data["bias_edge"] =
        given(bias) ? int64_t{5} + given(scale) + given(neighbor_table) + given(table_order) : int64_t{-1};
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[kX], &out = saved[kOut], &table = saved[kTable],
                     &transposed_table = saved[kTransposed], &saved_weight = saved[kWeight],
                     &cast = saved[kCastWeight];
    const auto scale = as_optional(saved[kScale]);
    at::Tensor grad = grads[0];
    // Masking first: the bias, x and weight gradients all flow through the ReLU. The mask is
    // piecewise constant in the inputs, so this stays differentiable (double backward) in grad.
    if (out.defined()) grad = grad.masked_fill(out.le(0), 0);
    grad = grad.contiguous();
    // The pairs as the forward got them; absent ones (a map built as a table, see pairs_absent) are
    // built from the table, on the device and without a host sync, by the gradient that reads them.
    at::Tensor in_index = saved[kInIndex], out_index = saved[kOutIndex], rel_ptr = saved[kRelPtr];
    const auto pairs = [&] {
      if (rel_ptr.sym_numel() == 0 && table.defined()) {
        // A table in its order's row sequence lists processing positions, not output rows.
        RELCONV_CHECK_VALUE(!ctx->saved_data["sorted_tables"].toBool(),
                            "relational_conv: with sorted_tables, a gradient that reads the pairs needs them passed");
        std::tie(in_index, out_index, rel_ptr) = table_pairs_op().call(table);
      }
    };
    at::Tensor grad_x, grad_w, grad_bias;
    if (ctx->needs_input_grad(0)) {
      const c10::SymInt num_in = ctx->saved_data["num_in"].toSymInt();
      const at::Tensor weight = !cast.defined()            ? saved_weight
                                : at::GradMode::is_enabled() ? saved_weight.to(x.scalar_type())  // recorded
                                                             : cast;
      // W[r]^T per group in either layout (3-D or 4-D): one view, which the 16-bit whole-tile CUDA
      // kernels read as stored and the others get copied in one launch (contiguous_weight).
      const at::Tensor weight_t = weight.transpose(-2, -1);
      if (transposed_table.defined()) {  // saved only when given on CUDA
        // The table forward of `grad` over the transposed table. The pairs go in swapped as the
        // forward got them (absent ones too: the table kernel reads neither, and reusing them spares
        // two allocations per backward). The forward's own table goes in as this call's transposed
        // table, so that its input gradient (the double backward) is a table forward again.
        grad_x = ConvCall{.x = grad,
                          .weight = weight_t,
                          .in_index = out_index,
                          .out_index = in_index,
                          .rel_ptr = rel_ptr,
                          .num_out = num_in,
                          .neighbor_table = transposed_table,
                          .table_order = as_optional(saved[kTransposedOrder]),
                          .transposed_table = table,
                          .transposed_order = as_optional(saved[kTableOrder]),
                          .sorted_tables = ctx->saved_data["sorted_tables"].toBool()}
                     .run();
      } else {
        pairs();
        grad_x = ConvCall{.x = grad,
                          .weight = weight_t,
                          .in_index = out_index,
                          .out_index = in_index,
                          .rel_ptr = rel_ptr,
                          .scale = scale,
                          .num_out = num_in}
                     .run();
      }
    }
    if (ctx->needs_input_grad(1)) {
      pairs();
      // A float32 weight run in half precision gets its gradient as accumulated, in float32.
      const auto dtype = cast.defined() ? std::optional(saved_weight.scalar_type()) : std::nullopt;
      // The op returns [R, G, C_in/G, C_out/G]; a 3-D weight (G = 1) gets its gradient in its own shape.
      const bool flat = saved_weight.dim() == 3;
      grad_w = weight_grad_op().call(x, grad, in_index, out_index, rel_ptr, scale, flat ? 1 : saved_weight.size(1),
                                     dtype);
      if (flat) grad_w = grad_w.squeeze(1);
    }
    const int64_t bias_edge = ctx->saved_data["bias_edge"].toInt();
    if (bias_edge >= 0 && ctx->needs_input_grad(bias_edge)) {
      grad_bias = grad.sum(0);
    }
    // One entry per forward argument: x, weight, in_index, out_index, rel_ptr, scale, num_out,
    // neighbor_table, table_order, bias, relu, transposed_table, transposed_order, sorted_tables.
    return {grad_x,       grad_w,       at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), grad_bias,    at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class WeightGradFunction : public torch::autograd::Function<WeightGradFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& grad_out,
                            const at::Tensor& in_index, const at::Tensor& out_index, const at::Tensor& rel_ptr,
                            const std::optional<at::Tensor>& scale, int64_t groups,
                            std::optional<at::ScalarType> out_dtype) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({x, grad_out, in_index, out_index, rel_ptr, or_undefined(scale)});
    return weight_grad_op().call(x, grad_out, in_index, out_index, rel_ptr, scale, groups, out_dtype);
  }

  // dW = WG(x, g) is bilinear: d/dx = conv(g, gw^T, transposed map), d/dg = conv(x, gw, map).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &grad_out = saved[1], &in_index = saved[2], &out_index = saved[3],
                     &rel_ptr = saved[4];
    const auto scale = as_optional(saved[5]);
    const at::Tensor gw = grads[0].to(x.scalar_type()).contiguous();  // out_dtype may be float32
    at::Tensor dx, dg;
    if (ctx->needs_input_grad(0)) {
      dx = ConvCall{.x = grad_out,
                    .weight = gw.transpose(2, 3),
                    .in_index = out_index,
                    .out_index = in_index,
                    .rel_ptr = rel_ptr,
                    .scale = scale,
                    .num_out = x.sym_size(0)}
               .run();
    }
    if (ctx->needs_input_grad(1)) {
      dg = ConvCall{.x = x,
                    .weight = gw,
                    .in_index = in_index,
                    .out_index = out_index,
                    .rel_ptr = rel_ptr,
                    .scale = scale,
                    .num_out = grad_out.sym_size(0)}
               .run();
    }
    return {dx, dg, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor conv_autograd(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& in_index,
                         const at::Tensor& out_index, const at::Tensor& rel_ptr,
                         const std::optional<at::Tensor>& scale, c10::SymInt num_out,
                         const std::optional<at::Tensor>& neighbor_table,
                         const std::optional<at::Tensor>& table_order, const std::optional<at::Tensor>& bias,
                         bool relu, const std::optional<at::Tensor>& transposed_table,
                         const std::optional<at::Tensor>& transposed_order, bool sorted_tables) {
  if (!differentiated(at::GradMode::is_enabled(), x, weight, bias)) {
    // Nothing to record: the op below autograd directly. Function::apply builds its node, context
    // and output wrapping even when it records nothing, several us of host time per inference layer.
    at::AutoDispatchBelowADInplaceOrView below;
    return ConvCall{x,          weight_for_op(x, weight), in_index, out_index, rel_ptr, scale, std::move(num_out),
                    neighbor_table, table_order, bias, relu, transposed_table, transposed_order,
                    sorted_tables}
        .run();
  }
  return ConvFunction::apply(x, weight, in_index, out_index, rel_ptr, scale, std::move(num_out), neighbor_table,
                             table_order, bias, relu, transposed_table, transposed_order, sorted_tables);
}

at::Tensor weight_grad_autograd(const at::Tensor& x, const at::Tensor& grad_out, const at::Tensor& in_index,
                                const at::Tensor& out_index, const at::Tensor& rel_ptr,
                                const std::optional<at::Tensor>& scale, int64_t groups,
                                std::optional<at::ScalarType> out_dtype) {
  if (!differentiated(at::GradMode::is_enabled(), x, grad_out, std::nullopt)) {
    // A backward that builds no graph (the usual one) calls this once per conv: no node to record.
    at::AutoDispatchBelowADInplaceOrView below;
    return weight_grad_op().call(x, grad_out, in_index, out_index, rel_ptr, scale, groups, out_dtype);
  }
  return WeightGradFunction::apply(x, grad_out, in_index, out_index, rel_ptr, scale, groups, out_dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, Autograd, m) {
  m.impl("relational_conv", &conv_autograd);
  m.impl("relational_conv_weight_grad", &weight_grad_autograd);
}

}  // namespace relconv
