// One relational_conv call with its arguments by name (csrc/library.cpp documents each), for the
// kernels at other dispatch keys (autograd, autocast) and the prepared call (prepared_conv.cpp), which
// build the op's calls from parts: named fields instead of fourteen positions.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "dispatch/ops.h"

namespace relconv {

struct ConvCall {
  at::Tensor x, weight;
  at::Tensor in_index, out_index, rel_ptr;
  std::optional<at::Tensor> scale;
  c10::SymInt num_out;
  std::optional<at::Tensor> neighbor_table, table_order, bias;
  bool relu = false;
  std::optional<at::Tensor> transposed_table, transposed_order;
  bool sorted_tables = false;

  // The op through the dispatcher, at the dispatch keys below the caller's.
  at::Tensor run() const {
    return conv_op().call(x, weight, in_index, out_index, rel_ptr, scale, num_out, neighbor_table, table_order, bias,
                          relu, transposed_table, transposed_order, sorted_tables);
  }
};

}  // namespace relconv
