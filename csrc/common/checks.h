#pragma once
// Argument validation shared by the CPU and CUDA implementations. Everything here reads only
// tensor metadata, never data, so it costs no host synchronisation on the GPU path.
#include "common/error_message.h"
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <optional>

namespace relconv {

// Accumulation dtype: half and bfloat16 accumulate in float32, everything else in itself.
inline at::ScalarType acc_dtype(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

struct ConvShape {
  int64_t num_relations;  // R
  int64_t groups;         // G
  int64_t cin_g;          // input channels per group
  int64_t cout_g;         // output channels per group
  int64_t num_pairs;      // P
};

// True when a neighbour table is given and the pair lists are not: empty in_index, out_index and
// rel_ptr (a map built as a table materialises its pairs only when a consumer needs them). Only the
// CUDA forward accepts this; everything else needs the pairs.
inline bool pairs_absent(const std::optional<at::Tensor>& table, const at::Tensor& in_index,
                         const at::Tensor& out_index, const at::Tensor& rel_ptr) {
  return table.has_value() && rel_ptr.numel() == 0 && in_index.numel() == 0 && out_index.numel() == 0;
}

// Checks the pair arrays, rel_ptr and scale against each other and against `like` (device).
// With `allow_absent_pairs`, an empty rel_ptr is accepted (see pairs_absent).
inline void check_map(const at::Tensor& like, const at::Tensor& in_index, const at::Tensor& out_index,
                      const at::Tensor& rel_ptr, const std::optional<at::Tensor>& scale,
                      at::ScalarType feat_dtype, bool allow_absent_pairs = false) {
  RELCONV_CHECK_VALUE(in_index.dim() == 1, "in_index must be 1-D, got shape ", in_index.sizes());
  RELCONV_CHECK_VALUE(out_index.dim() == 1, "out_index must be 1-D, got shape ", out_index.sizes());
  RELCONV_CHECK_VALUE(in_index.numel() == out_index.numel(), "in_index (", in_index.numel(),
                    " pairs) and out_index (", out_index.numel(), " pairs) must have the same length");
  RELCONV_CHECK_VALUE(in_index.scalar_type() == at::kInt || in_index.scalar_type() == at::kLong,
                    "in_index must be int32 or int64, got ", in_index.scalar_type());
  RELCONV_CHECK_VALUE(out_index.scalar_type() == in_index.scalar_type(),
                    "out_index dtype (", out_index.scalar_type(), ") must match in_index dtype (",
                    in_index.scalar_type(), ")");
  RELCONV_CHECK_VALUE(rel_ptr.dim() == 1 && (rel_ptr.numel() >= 1 || allow_absent_pairs),
                    "rel_ptr must be 1-D with num_relations + 1 entries, got shape ", rel_ptr.sizes());
  RELCONV_CHECK_VALUE(rel_ptr.scalar_type() == at::kLong, "rel_ptr must be int64, got ",
                    rel_ptr.scalar_type());
  for (const auto* t : {&in_index, &out_index, &rel_ptr}) {
    RELCONV_CHECK_VALUE(t->device() == like.device(), "in_index, out_index and rel_ptr must be on ",
                      like.device(), " like x, got ", t->device());
  }
  if (scale.has_value()) {
    const auto& s = *scale;
    RELCONV_CHECK_VALUE(s.dim() == 1 && s.numel() == in_index.numel(), "scale must have shape [",
                      in_index.numel(), "] (one per pair), got ", s.sizes());
    RELCONV_CHECK_VALUE(s.scalar_type() == acc_dtype(feat_dtype), "scale must be ",
                      acc_dtype(feat_dtype), " for ", feat_dtype, " features, got ", s.scalar_type());
    RELCONV_CHECK_VALUE(s.device() == like.device(), "scale must be on ", like.device(), ", got ",
                      s.device());
  }
}

inline void check_features(const char* name, const at::Tensor& t) {
  RELCONV_CHECK_VALUE(t.dim() == 2, name, " must be 2-D [rows, channels], got shape ", t.sizes());
  const auto dt = t.scalar_type();
  RELCONV_CHECK_VALUE(dt == at::kFloat || dt == at::kDouble || dt == at::kHalf || dt == at::kBFloat16,
                    name, " must be float32, float64, float16 or bfloat16, got ", dt);
}

// The op takes the weight as [R, C_in, C_out] (groups == 1) or [R, groups, C_in/groups, C_out/groups].
// The 3-D form exists so that a caller with groups == 1 passes its parameter as it is: a view of its
// own would be an autograd node per call, while the view below autograd (grouped_weight) is free.
inline void check_weight_layout(const at::Tensor& weight) {
  RELCONV_CHECK_VALUE(weight.dim() == 3 || weight.dim() == 4,
                    "weight must be 3-D [R, C_in, C_out] (groups = 1) or 4-D [R, groups, C_in/groups, "
                    "C_out/groups], got shape ",
                    weight.sizes());
}

// The 4-D layout the kernels index, [R, G, C_in/G, C_out/G]: a 3-D weight gains a unit group
// dimension. A contiguous 3-D weight has the memory of its 4-D view, so kernels that read only the
// data pointer and ConvShape (the CUDA launchers) may take either form as it is.
inline at::Tensor grouped_weight(const at::Tensor& weight) {
  check_weight_layout(weight);
  return weight.dim() == 3 ? weight.unsqueeze(1) : weight;
}

// With `allow_absent_pairs` (the CUDA table forward), empty pair lists and rel_ptr are accepted and
// ConvShape::num_pairs is -1 (unknown). The shape describes the weight's 4-D layout (grouped_weight).
inline ConvShape check_conv_args(const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& in_index, const at::Tensor& out_index,
                                 const at::Tensor& rel_ptr, const std::optional<at::Tensor>& scale,
                                 bool allow_absent_pairs = false) {
  check_features("x", x);
  check_weight_layout(weight);
  RELCONV_CHECK_VALUE(weight.scalar_type() == x.scalar_type(), "weight dtype (", weight.scalar_type(),
                    ") must match x dtype (", x.scalar_type(), ")");
  RELCONV_CHECK_VALUE(weight.device() == x.device(), "weight must be on ", x.device(), " like x, got ",
                    weight.device());
  check_map(x, in_index, out_index, rel_ptr, scale, x.scalar_type(), allow_absent_pairs);
  const bool absent = allow_absent_pairs && rel_ptr.numel() == 0;
  const bool flat = weight.dim() == 3;
  ConvShape s{weight.size(0), flat ? 1 : weight.size(1), weight.size(flat ? 1 : 2), weight.size(flat ? 2 : 3),
              absent ? -1 : in_index.numel()};
  RELCONV_CHECK_VALUE(absent || rel_ptr.numel() == s.num_relations + 1, "rel_ptr has ", rel_ptr.numel(),
                    " entries but weight has ", s.num_relations, " relations (expected R + 1 = ",
                    s.num_relations + 1, ")");
  RELCONV_CHECK_VALUE(x.size(1) == s.groups * s.cin_g, "x has ", x.size(1),
                    " channels but weight expects groups * C_in/groups = ", s.groups, " * ", s.cin_g);
  return s;
}

inline void check_neighbor_table(const std::optional<at::Tensor>& table, const std::optional<at::Tensor>& order,
                                 const at::Tensor& in_index, const std::optional<at::Tensor>& scale,
                                 int64_t num_out, int64_t num_relations) {
  RELCONV_CHECK_VALUE(!order.has_value() || table.has_value(), "table_order needs a neighbor_table");
  if (!table.has_value()) return;
  const auto& t = *table;
  RELCONV_CHECK_VALUE(t.dim() == 2 && t.size(0) == num_out && t.size(1) == num_relations,
                    "neighbor_table must have shape [num_out, R] = [", num_out, ", ", num_relations,
                    "], got ", t.sizes());
  RELCONV_CHECK_VALUE(t.scalar_type() == in_index.scalar_type(), "neighbor_table dtype (", t.scalar_type(),
                    ") must match in_index dtype (", in_index.scalar_type(), ")");
  RELCONV_CHECK_VALUE(t.device() == in_index.device(), "neighbor_table must be on ", in_index.device(),
                    ", got ", t.device());
  RELCONV_CHECK_VALUE(!scale.has_value(), "neighbor_table cannot be combined with a per-pair scale");
  if (!order.has_value()) return;
  RELCONV_CHECK_VALUE(order->dim() == 1 && order->size(0) == num_out, "table_order must have shape [num_out] = [",
                    num_out, "], got ", order->sizes());
  RELCONV_CHECK_VALUE(order->scalar_type() == t.scalar_type(), "table_order dtype (", order->scalar_type(),
                    ") must match neighbor_table dtype (", t.scalar_type(), ")");
  RELCONV_CHECK_VALUE(order->device() == t.device(), "table_order must be on ", t.device(), ", got ",
                    order->device());
}

// The transposed map's table [num_in, R] and its schedule order [num_in], read only by the backward
// (the input gradient's table kernel). Metadata only, like check_neighbor_table: that the table holds
// exactly the transposed pairs is the caller's promise (RelationalMap builds it from the table).
inline void check_transposed_table(const std::optional<at::Tensor>& transposed_table,
                                   const std::optional<at::Tensor>& transposed_order,
                                   const std::optional<at::Tensor>& neighbor_table, int64_t num_in,
                                   int64_t num_relations) {
  RELCONV_CHECK_VALUE(!transposed_order.has_value() || transposed_table.has_value(),
                    "transposed_order needs a transposed_table");
  if (!transposed_table.has_value()) return;
  RELCONV_CHECK_VALUE(neighbor_table.has_value(), "transposed_table needs a neighbor_table");
  const auto& t = *transposed_table;
  const auto& table = *neighbor_table;
  RELCONV_CHECK_VALUE(t.dim() == 2 && t.size(0) == num_in && t.size(1) == num_relations,
                    "transposed_table must have shape [num_in, R] = [", num_in, ", ", num_relations, "], got ",
                    t.sizes());
  RELCONV_CHECK_VALUE(t.scalar_type() == table.scalar_type(), "transposed_table dtype (", t.scalar_type(),
                    ") must match neighbor_table dtype (", table.scalar_type(), ")");
  RELCONV_CHECK_VALUE(t.device() == table.device(), "transposed_table must be on ", table.device(),
                    " like neighbor_table, got ", t.device());
  if (!transposed_order.has_value()) return;
  const auto& order = *transposed_order;
  RELCONV_CHECK_VALUE(order.dim() == 1 && order.size(0) == num_in, "transposed_order must have shape [num_in] = [",
                    num_in, "], got ", order.sizes());
  RELCONV_CHECK_VALUE(order.scalar_type() == t.scalar_type(), "transposed_order dtype (", order.scalar_type(),
                    ") must match transposed_table dtype (", t.scalar_type(), ")");
  RELCONV_CHECK_VALUE(order.device() == t.device(), "transposed_order must be on ", t.device(), ", got ",
                    order.device());
}

// The epilogue bias: [groups * cout_g] (cout_total) in x's dtype on x's device, added to every output row.
inline void check_bias(const std::optional<at::Tensor>& bias, const at::Tensor& x, int64_t cout_total) {
  if (!bias.has_value()) return;
  const auto& b = *bias;
  RELCONV_CHECK_VALUE(b.dim() == 1 && b.numel() == cout_total, "bias must have shape [C_out] = [", cout_total,
                    "], got ", b.sizes());
  RELCONV_CHECK_VALUE(b.scalar_type() == x.scalar_type(), "bias dtype (", b.scalar_type(), ") must match x dtype (",
                    x.scalar_type(), ")");
  RELCONV_CHECK_VALUE(b.device() == x.device(), "bias must be on ", x.device(), " like x, got ", b.device());
}

// relational_conv_add_'s out: [num_out, cout_total] in x's dtype on x's device, sharing no memory
// with x or weight (it is written while they are read).
inline void check_add_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, int64_t cout_total) {
  RELCONV_CHECK_VALUE(out.dim() == 2 && out.size(1) == cout_total, "out must have shape [num_out, ", cout_total,
                    "], got ", out.sizes());
  RELCONV_CHECK_VALUE(out.scalar_type() == x.scalar_type(), "out dtype (", out.scalar_type(),
                    ") must match x dtype (", x.scalar_type(), ")");
  RELCONV_CHECK_VALUE(out.device() == x.device(), "out must be on ", x.device(), " like x, got ", out.device());
  for (const at::Tensor* other : {&x, &weight}) {
    const auto status = at::get_overlap_status(out, *other);
    RELCONV_CHECK_VALUE(status != at::MemOverlapStatus::Full && status != at::MemOverlapStatus::Partial,
                      "out must not share memory with x or weight");
  }
}

// The weight gradient's dtype: x's, or float32 (the accumulator of half inputs, for float32 weights
// under autocast: returned as accumulated, with no rounding to half and back).
inline at::ScalarType weight_grad_dtype(const at::Tensor& x, std::optional<at::ScalarType> out_dtype) {
  if (!out_dtype.has_value()) return x.scalar_type();
  RELCONV_CHECK_VALUE(*out_dtype == x.scalar_type() || *out_dtype == at::kFloat,
                    "out_dtype must be x's dtype or float32, got ", *out_dtype, " for ", x.scalar_type(), " x");
  return *out_dtype;
}

inline ConvShape check_weight_grad_args(const at::Tensor& x, const at::Tensor& grad_out,
                                        const at::Tensor& in_index, const at::Tensor& out_index,
                                        const at::Tensor& rel_ptr,
                                        const std::optional<at::Tensor>& scale, int64_t groups) {
  check_features("x", x);
  check_features("grad_out", grad_out);
  RELCONV_CHECK_VALUE(grad_out.scalar_type() == x.scalar_type(), "grad_out dtype (",
                    grad_out.scalar_type(), ") must match x dtype (", x.scalar_type(), ")");
  RELCONV_CHECK_VALUE(grad_out.device() == x.device(), "grad_out must be on ", x.device(), ", got ",
                    grad_out.device());
  check_map(x, in_index, out_index, rel_ptr, scale, x.scalar_type());
  RELCONV_CHECK_VALUE(groups >= 1, "groups must be positive, got ", groups);
  RELCONV_CHECK_VALUE(x.size(1) % groups == 0, "x channels (", x.size(1), ") must be divisible by groups (",
                    groups, ")");
  RELCONV_CHECK_VALUE(grad_out.size(1) % groups == 0, "grad_out channels (", grad_out.size(1),
                    ") must be divisible by groups (", groups, ")");
  return ConvShape{rel_ptr.numel() - 1, groups, x.size(1) / groups, grad_out.size(1) / groups,
                   in_index.numel()};
}

}  // namespace relconv
