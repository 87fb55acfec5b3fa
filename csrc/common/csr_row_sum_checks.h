#pragma once
// Argument validation of relconv::csr_row_sum, shared by the CPU and CUDA kernels. Metadata only: no
// host synchronisation.
#include "common/error_message.h"
#include <ATen/ATen.h>

#include "common/checks.h"

namespace relconv {

inline void check_csr_row_sum_args(const at::Tensor& row_ptr, const at::Tensor& col, const at::Tensor& values,
                                   const at::Tensor& x) {
  check_features("x", x);
  RELCONV_CHECK_VALUE(row_ptr.dim() == 1 && row_ptr.numel() >= 1,
                      "csr_row_sum: row_ptr must be 1-D with rows + 1 entries, got shape ", row_ptr.sizes());
  RELCONV_CHECK_VALUE(row_ptr.scalar_type() == at::kInt || row_ptr.scalar_type() == at::kLong,
                      "csr_row_sum: row_ptr must be int32 or int64, got ", row_ptr.scalar_type());
  RELCONV_CHECK_VALUE(col.dim() == 1 && col.scalar_type() == row_ptr.scalar_type(),
                      "csr_row_sum: col must be 1-D with row_ptr's dtype (", row_ptr.scalar_type(), "), got shape ",
                      col.sizes(), " and ", col.scalar_type());
  RELCONV_CHECK_VALUE(values.dim() == 1 && values.numel() == col.numel(),
                      "csr_row_sum: values must be 1-D with one entry per col entry (", col.numel(), "), got shape ",
                      values.sizes());
  RELCONV_CHECK_VALUE(values.scalar_type() == x.scalar_type(), "csr_row_sum: values dtype (", values.scalar_type(),
                      ") must match x dtype (", x.scalar_type(), ")");
  for (const auto* t : {&row_ptr, &col, &values}) {
    RELCONV_CHECK_VALUE(t->device() == x.device(), "csr_row_sum: row_ptr, col and values must be on x's device (",
                        x.device(), "), got ", t->device());
  }
}

}  // namespace relconv
