// Every relconv op schema (the pybind11 module that makes `relconv._C` importable is
// python_module.cpp: this file and the kernels stay free of Python, so that they also link into
// the Python-free ops library, see setup.py).
//
// Shapes (G = groups, R = relations, P = pairs):
//   x        [N_in, G * C_in_g]
//   weight   [R, G, C_in_g, C_out_g], or [R, C_in, C_out] when G = 1 (the same memory as the 4-D
//            view; callers pass their parameter as it is instead of recording a view per call)
//   in_index, out_index  [P], int32 or int64 (same dtype), pairs sorted by relation
//   rel_ptr  [R + 1] int64, CSR offsets of each relation's pairs
//   scale    [P] in the accumulation dtype (float64 for float64 inputs, float32 otherwise)
//   neighbor_table  optional [num_out, R] (same dtype as the indices, -1 = no input): the
//            output-stationary view of the same pairs, given only for maps with at most one input
//            per (output, relation) and no scale; lets the CUDA kernel avoid atomics. It must
//            describe exactly the pairs in in_index/out_index (RelationalMap guarantees that).
//            On CUDA the pairs may be left out when a table is given: empty in_index, out_index
//            AND rel_ptr mean "pairs not materialised"; the forward reads only the table and the
//            backward rebuilds the pairs from it.
//   table_order  optional [num_out] permutation of the output rows (table dtype), a schedule only:
//            the CUDA table kernel processes outputs in this order (relconv sorts them by their
//            neighbour pattern so that a tile's rows share relations, see neighbor_table_order);
//            every output is still computed alone, so the result does not depend on it. It must be
//            a permutation (relconv's builder makes one); entries out of range are skipped.
//   bias     optional [G * C_out_g] in x's dtype, added to every output row (rows without pairs too);
//   relu     max(0, .) after the bias. Both belong to the op so that the CUDA table kernel applies
//            them in its epilogue (a folded Conv-BN-ReLU layer is one kernel); the other paths apply
//            them to the accumulator before the cast to x's dtype.
//   transposed_table  optional [num_in, R] (neighbor_table's dtype and device): the neighbour table
//            of the transposed map, the same pairs seen from the inputs (input row -> output row or
//            -1 per relation). Given only for maps injective per relation both ways (at most one
//            input per (output, relation) AND at most one output per (input, relation): voxel kernel
//            maps, q = p - offset), so that the transposed map is a table too; a map that repeats
//            an input within a relation (graph maps with unique slots) has no such table. Needs
//            neighbor_table. Used only by the backward: the input gradient then runs the table
//            kernel over it with W[r]^T (no atomics) instead of the pair kernel. The forward only
//            checks its metadata; like neighbor_table it must describe exactly the op's pairs.
//   transposed_order  optional [num_in] (table dtype): transposed_table's schedule order, as
//            table_order is neighbor_table's (a permutation; needs transposed_table).
//   sorted_tables  the tables given with an order hold their rows in that order: row m of
//            neighbor_table is output table_order[m]'s, row m of transposed_table input
//            transposed_order[m]'s (relconv's prepared calls pass such copies of a map's tables,
//            so that the CUDA kernels read a tile's entries as one block). The CPU kernel reads
//            the pairs, and a gradient that reads pairs needs them passed.
//   relational_conv_add_(out, x, weight, in_index, out_index, rel_ptr, scale) -> (): adds the
//            pairs' sum into out [num_out, G * C_out_g] (x's dtype, no overlap with x or weight) in
//            place, num_out = out.size(0). The pair path only, not differentiable: for an
//            inference layer whose output already holds another term (R-GCN's root transform and
//            bias), so that the sum lands on it with no accumulator of its own and no extra pass.
//   neighbor_table_order(table) -> [num_out] permutation sorting rows by their occupied slots.
//   table_pairs(table) -> (in_index, out_index, rel_ptr): CUDA only, no host sync; the table's pairs
//            in (relation, out) order padded with -1 to num_out * R entries (rel_ptr[R] of them are
//            pairs; the host never learns how many). Every op above takes pairs padded this way:
//            the kernels read pairs only through rel_ptr.
//
// Kernel-map builders (CUDA only; the CPU path builds maps in torch, relconv/voxel/kernel_map.py).
// Coordinates are [N, 4] int32 (batch, x, y, z) rows.
//   coord_hash(coords) -> (slots, error): open-addressing table of row indices (-1 empty) and an
//            int32 [1] error word (1 = duplicate rows, 2 = negative batch); no host sync.
//   kernel_map_table(in_coords, slots, out_coords, kernel_size, step, dtype) -> [M, K] table of
//            the input row at out_coords[m] + offset_k * step, -1 = none (offsets as
//            relconv.voxel.kernel_map.kernel_offsets); no host sync.
//   transpose_neighbor_table(table, num_in) -> [num_in, K] table of the transposed map.
//   strided_coords(coords, step, input_error) -> [M, 4] unique floor(p / step) * step sites in
//            order of first occurrence; one host sync (the count, read together with the error
//            words), raises ValueError on bad coordinates.
//   hashed_strided_table(in_coords, kernel_size, step, out_step, check) -> (slots, out_coords,
//            table): coord_hash, strided_coords (its one sync reads the new hash's error word when
//            check) and kernel_map_table in one call; the table int32 while sizes allow.
//   hashed_submanifold_table(coords, kernel_size, step, check, one_buffer, early_read=False) ->
//            (slots, table, error, ticket): coord_hash and kernel_map_table of the coordinates
//            against themselves in one call (with one_buffer, all three in one allocation; a
//            small set's map then is one cooperative kernel); with check, the host waits for the
//            new hash's error word, published to pinned memory once the hash is built, and raises
//            ValueError on bad coordinates; without, the caller checks the returned word later
//            (check_coords), and early_read has the word published too (ticket; -1 none).
//   check_coords(error, ticket=-1) -> (): reads a coord_hash error word (with a ticket, waits
//            until that word is published; else one host sync) and raises ValueError for the
//            problems it records.
//   grid_conv_map(coords, batch_size, in_shape, out_shape, kernel_size, stride, padding, dilation,
//            transposed) -> (out_coords, table): a regular or transposed conv on a bounded grid
//            (coords are (batch, d0, d1, d2) grid indices inside in_shape): the output sites every
//            input reaches, [M, 4] int32 sorted by (batch, d0, d1, d2), and the [M, K] int32 table
//            of the input at o * stride - padding + r * dilation (transposed: o = i * stride -
//            padding + r * dilation), kernel index r with the first axis slowest. One host sync
//            (the site count, with the coordinate checks); raises ValueError for rows outside the
//            grid and duplicate rows.
//
// Graph-map builder (CPU and CUDA; relconv/graph/graph_map.py calls it).
//   typed_edge_map(src, dst, edge_type, num_src, num_dst, num_relations, mean, index_dtype) ->
//            (in_index, out_index, rel_ptr, scale, perm, error): the edges (src[e], dst[e],
//            edge_type[e]) sorted stably by (relation, target): in_index / out_index [E] in
//            index_dtype, rel_ptr [R + 1] int64, scale [E] float32 1 / (pairs in the pair's
//            (target, relation) slot) when mean (else empty), perm [E] (int32 below 2^31 edges, else
//            int64) the edge of each pair. src and dst share an int32 or int64 dtype, edge_type is
//            int32 or int64. One host wait: error is a bit mask of the arguments holding values out
//            of range (1 edge_type, 2 src, 4 dst); the maps of such a call are meaningless and the
//            caller raises.
//
// The search of the CPU kernel maps (CPU only; relconv/voxel/kernel_map.py).
//   sorted_key_pairs(keys, perm, out_keys, out_perm, deltas) -> (in_index, out_index, rel_ptr), int64:
//            the pairs (perm[i], out_perm[j], k) with keys[i] == out_keys[j] + deltas[k], grouped by
//            relation k, each relation's outputs in ascending row order. keys and out_keys are
//            sorted ascending (keys unique); perm / out_perm give each key's row.
//
// Sparse row sums (CPU and CUDA).
//   csr_row_sum(row_ptr, col, values, x) -> out [rows, C] in x's dtype: out[r] = sum over e in
//            [row_ptr[r], row_ptr[r + 1]) of values[e] * x[col[e]], accumulated in x's accumulation
//            dtype, each row written once (no zero fill). row_ptr [rows + 1] and col share int32 or
//            int64; values has x's dtype. The indices are trusted as relconv builds them (read on
//            the device only): entries outside [0, col.numel()) and columns outside x are skipped.
//            R-GCN's sum of each (target, relation) slot's inputs and that sum's input gradient.
//
// BatchNorm over voxel features (csrc/cuda/batch_norm.cuh), x [N, C], statistics per channel over
// the N rows; weight, bias, running_mean, running_var [C] in one dtype: x's, or float32 for
// float16 / bfloat16 x.
//   batch_norm_act(...) -> (out, save_mean, save_invstd): out = relu?((x - mean) * invstd * weight
//            + bias) in x's dtype. training: batch mean and biased variance, saved [C] in the
//            accumulation dtype, and the running statistics (when given) blended in place with
//            momentum, the variance unbiased (torch's semantics); otherwise the running statistics
//            (required) and empty saved tensors. num_batches_tracked (int64, one element): torch's
//            BatchNorm counter, incremented in place when training (on CUDA by the statistics
//            kernel: no launch of its own). No host sync.
//   batch_norm_act_backward(...) -> (grad_x, grad_weight, grad_bias): the outputs left out by
//            output_mask are empty; grad_weight / grad_bias are in the parameter dtype. Not itself
//            differentiable (the autograd node makes a double backward raise).
#include <torch/library.h>

TORCH_LIBRARY(relconv, m) {
  m.def(
      "relational_conv(Tensor x, Tensor weight, Tensor in_index, Tensor out_index, "
      "Tensor rel_ptr, Tensor? scale, SymInt num_out, Tensor? neighbor_table=None, "
      "Tensor? table_order=None, Tensor? bias=None, bool relu=False, Tensor? transposed_table=None, "
      "Tensor? transposed_order=None, bool sorted_tables=False) -> Tensor");
  m.def(
      "relational_conv_add_(Tensor(a!) out, Tensor x, Tensor weight, Tensor in_index, Tensor out_index, "
      "Tensor rel_ptr, Tensor? scale) -> ()");
  m.def(
      "relational_conv_weight_grad(Tensor x, Tensor grad_out, Tensor in_index, "
      "Tensor out_index, Tensor rel_ptr, Tensor? scale, int groups, ScalarType? out_dtype=None) -> Tensor");
  m.def("coord_hash(Tensor coords) -> (Tensor, Tensor)");
  m.def(
      "kernel_map_table(Tensor in_coords, Tensor slots, Tensor out_coords, int[3] kernel_size, "
      "int[3] step, ScalarType dtype) -> Tensor");
  m.def("transpose_neighbor_table(Tensor table, int num_in) -> Tensor");
  m.def("neighbor_table_order(Tensor table) -> Tensor");
  m.def("table_pairs(Tensor table) -> (Tensor, Tensor, Tensor)");
  m.def("strided_coords(Tensor coords, int[3] step, Tensor? input_error=None) -> Tensor");
  m.def(
      "hashed_strided_table(Tensor in_coords, int[3] kernel_size, int[3] step, int[3] out_step, "
      "bool check) -> (Tensor, Tensor, Tensor)");
  m.def(
      "hashed_submanifold_table(Tensor coords, int[3] kernel_size, int[3] step, bool check, "
      "bool one_buffer, bool early_read=False) -> (Tensor, Tensor, Tensor, int)");
  m.def("check_coords(Tensor error, int ticket=-1) -> ()");
  m.def(
      "grid_conv_map(Tensor coords, int batch_size, int[3] in_shape, int[3] out_shape, int[3] kernel_size, "
      "int[3] stride, int[3] padding, int[3] dilation, bool transposed) -> (Tensor, Tensor)");
  m.def(
      "typed_edge_map(Tensor src, Tensor dst, Tensor edge_type, int num_src, int num_dst, int num_relations, "
      "bool mean, ScalarType index_dtype) -> (Tensor, Tensor, Tensor, Tensor, Tensor, int)");
  m.def("csr_row_sum(Tensor row_ptr, Tensor col, Tensor values, Tensor x) -> Tensor");
  m.def(
      "sorted_key_pairs(Tensor keys, Tensor perm, Tensor out_keys, Tensor out_perm, Tensor deltas) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "batch_norm_act(Tensor x, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
      "Tensor(b!)? running_var, bool training, float momentum, float eps, bool relu=False, "
      "Tensor(c!)? num_batches_tracked=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "batch_norm_act_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor? bias, "
      "Tensor? running_mean, Tensor? running_var, Tensor save_mean, Tensor save_invstd, bool training, "
      "float eps, bool relu, bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
}
