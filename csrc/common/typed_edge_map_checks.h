#pragma once
// Argument validation of relconv::typed_edge_map, shared by the CPU and CUDA builders. Metadata
// only: no host synchronisation (the value ranges are the builders' error word).
#include "common/error_message.h"
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace relconv {

inline void check_typed_edge_map_args(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& edge_type,
                                      int64_t num_src, int64_t num_dst, int64_t num_relations,
                                      at::ScalarType index_dtype) {
  const auto index_like = [](const at::Tensor& t) {
    return t.scalar_type() == at::kInt || t.scalar_type() == at::kLong;
  };
  RELCONV_CHECK_VALUE(src.dim() == 1 && dst.dim() == 1 && edge_type.dim() == 1,
                      "typed_edge_map: src, dst and edge_type must be 1-D, got shapes ", src.sizes(), ", ",
                      dst.sizes(), " and ", edge_type.sizes());
  RELCONV_CHECK_VALUE(src.numel() == dst.numel() && src.numel() == edge_type.numel(),
                      "typed_edge_map: src, dst and edge_type must have one entry per edge, got ", src.numel(), ", ",
                      dst.numel(), " and ", edge_type.numel());
  RELCONV_CHECK_VALUE(index_like(src) && src.scalar_type() == dst.scalar_type() && index_like(edge_type),
                      "typed_edge_map: src and dst must share an int32 or int64 dtype and edge_type be int32 or "
                      "int64, got ", src.scalar_type(), ", ", dst.scalar_type(), " and ", edge_type.scalar_type());
  RELCONV_CHECK_VALUE(dst.device() == src.device() && edge_type.device() == src.device(),
                      "typed_edge_map: src, dst and edge_type must be on one device, got ", src.device(), ", ",
                      dst.device(), " and ", edge_type.device());
  RELCONV_CHECK_VALUE(num_src >= 0 && num_dst >= 0, "typed_edge_map: node counts must be non-negative, got ",
                      num_src, " and ", num_dst);
  RELCONV_CHECK_VALUE(src.numel() == 0 || (num_src > 0 && num_dst > 0),
                      "typed_edge_map: a graph with edges needs source and target nodes, got ", num_src, " and ",
                      num_dst);
  RELCONV_CHECK_VALUE(num_relations >= 1, "typed_edge_map: num_relations must be positive, got ", num_relations);
  RELCONV_CHECK_VALUE(num_dst == 0 || num_relations <= std::numeric_limits<int64_t>::max() / num_dst,
                      "typed_edge_map: num_relations * num_dst overflows int64: ", num_relations, " x ", num_dst);
  RELCONV_CHECK_VALUE(index_dtype == at::kInt || index_dtype == at::kLong,
                      "typed_edge_map: index_dtype must be int32 or int64, got ", index_dtype);
  RELCONV_CHECK_VALUE(index_dtype == at::kLong || src.numel() <= std::numeric_limits<int32_t>::max(),
                      "typed_edge_map: int32 indices hold at most 2^31 - 1 pairs, got ", src.numel());
  RELCONV_CHECK_VALUE(index_dtype == at::kLong || std::max(num_src, num_dst) <= std::numeric_limits<int32_t>::max(),
                      "typed_edge_map: int32 indices hold node ids below 2^31, got ", num_src, " source and ",
                      num_dst, " target nodes");
}

}  // namespace relconv
