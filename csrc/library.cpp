// Every relconv op schema, and the pybind11 module that makes `relconv._C` importable.
//
// Shapes (G = groups, R = relations, P = pairs):
//   x        [N_in, G * C_in_g]
//   weight   [R, G, C_in_g, C_out_g]
//   in_index, out_index  [P], int32 or int64 (same dtype), pairs sorted by relation
//   rel_ptr  [R + 1] int64, CSR offsets of each relation's pairs
//   scale    [P] in the accumulation dtype (float64 for float64 inputs, float32 otherwise)
//   neighbor_table  optional [num_out, R] (same dtype as the indices, -1 = no input): the
//            output-stationary view of the same pairs, given only for maps with at most one input
//            per (output, relation) and no scale; lets the CUDA kernel avoid atomics. It must
//            describe exactly the pairs in in_index/out_index (RelationalMap guarantees that).
#include <torch/extension.h>
#include <torch/library.h>

#include "common/build_info.h"

TORCH_LIBRARY(relconv, m) {
  m.def(
      "relational_conv(Tensor x, Tensor weight, Tensor in_index, Tensor out_index, "
      "Tensor rel_ptr, Tensor? scale, SymInt num_out, Tensor? neighbor_table=None) -> Tensor");
  m.def(
      "relational_conv_weight_grad(Tensor x, Tensor grad_out, Tensor in_index, "
      "Tensor out_index, Tensor rel_ptr, Tensor? scale, int groups) -> Tensor");
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "relconv C++/CUDA kernels; the ops live in torch.ops.relconv";
  m.def("cuda_version", &relconv::built_cuda_version,
        "CUDA version the extension was compiled with (major*1000 + minor*10), or -1 for a CPU build");
}
