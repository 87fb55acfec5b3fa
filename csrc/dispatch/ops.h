// Typed handles to the relconv ops through the dispatcher, for kernels registered at other dispatch
// keys (autograd, autocast) that call back into the ops, and for the direct Python entries of the
// per-layer ops (library.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace relconv {

using ConvSignature = at::Tensor(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& in_index,
                                 const at::Tensor& out_index, const at::Tensor& rel_ptr,
                                 const std::optional<at::Tensor>& scale, c10::SymInt num_out,
                                 const std::optional<at::Tensor>& neighbor_table,
                                 const std::optional<at::Tensor>& table_order,
                                 const std::optional<at::Tensor>& bias, bool relu,
                                 const std::optional<at::Tensor>& transposed_table,
                                 const std::optional<at::Tensor>& transposed_order, bool sorted_tables);
using WeightGradSignature = at::Tensor(const at::Tensor& x, const at::Tensor& grad_out, const at::Tensor& in_index,
                                       const at::Tensor& out_index, const at::Tensor& rel_ptr,
                                       const std::optional<at::Tensor>& scale, int64_t groups,
                                       std::optional<at::ScalarType> out_dtype);

inline const c10::TypedOperatorHandle<ConvSignature>& conv_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("relconv::relational_conv", "").typed<ConvSignature>();
  return op;
}

inline const c10::TypedOperatorHandle<WeightGradSignature>& weight_grad_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("relconv::relational_conv_weight_grad", "")
                             .typed<WeightGradSignature>();
  return op;
}

using TablePairsSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor& table);

inline const c10::TypedOperatorHandle<TablePairsSignature>& table_pairs_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("relconv::table_pairs", "").typed<TablePairsSignature>();
  return op;
}

using BatchNormSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor& x, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps, bool relu, const std::optional<at::Tensor>& num_batches_tracked);

inline const c10::TypedOperatorHandle<BatchNormSignature>& batch_norm_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("relconv::batch_norm_act", "").typed<BatchNormSignature>();
  return op;
}

}  // namespace relconv
