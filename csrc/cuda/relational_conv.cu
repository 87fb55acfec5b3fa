// CUDA launch wrappers of the relational-convolution ops: validate (metadata only), pick a tile
// configuration from the channel counts, launch the schedule kernel and ONE main kernel covering all
// relations. No host synchronisation: every launch size comes from tensor shapes, so a forward pass
// can be captured in a CUDA graph.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "common/checks.h"
#include "cuda/conv_forward.cuh"
#include "cuda/conv_forward_table.cuh"
#include "cuda/conv_weight_grad.cuh"
#include "cuda/device_buffers.h"
#include "cuda/tile_schedule.cuh"

namespace relconv {
namespace {

using cuda::acc_t;

// Calls f(T{}, Idx{}) with the CUDA element type of `dtype` and the index type of `index_dtype`.
template <typename F>
void dispatch_types(at::ScalarType dtype, at::ScalarType index_dtype, F&& f) {
  auto with_index = [&](auto t) {
    if (index_dtype == at::kInt) {
      f(t, int32_t{});
    } else {
      f(t, int64_t{});
    }
  };
  switch (dtype) {
    case at::kFloat: return with_index(float{});
    case at::kDouble: return with_index(double{});
    case at::kHalf: return with_index(__half{});
    case at::kBFloat16: return with_index(__nv_bfloat16{});
    default: TORCH_CHECK(false, "relconv CUDA kernels: unsupported dtype ", dtype);
  }
}

template <typename T>
const T* ptr(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.const_data_ptr());
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Past 48 KiB of dynamic shared memory a kernel must opt in (once per process and kernel; the
// attribute is per function, and every device of one process runs the same image).
template <auto Kernel>
void allow_dynamic_smem(int bytes) {
  static const bool opted_in = [&] {
    C10_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)opted_in;
}

// Device-side tile offsets (see tile_schedule.cuh) into `tile_ptr` ([R + 2]), and the block count
// that covers them. Fixed tiles (target_tiles == 0): ceil(P / pairs_per_tile) + R blocks, P being
// the pair arrays' length (an upper bound of rel_ptr[R]). Device-sized tiles: target_tiles + R.
int64_t schedule_tiles(const at::Tensor& rel_ptr, int64_t num_pairs, int64_t pairs_per_tile, int64_t target_tiles,
                       int64_t granule, at::Tensor& tile_ptr, cudaStream_t stream) {
  const int64_t num_rel = rel_ptr.numel() - 1;
  tile_ptr = at::empty({num_rel + 2}, rel_ptr.options());
  cuda::relation_tile_offsets<<<1, cuda::kScheduleThreads, 0, stream>>>(
      rel_ptr.const_data_ptr<int64_t>(), num_rel, num_pairs, pairs_per_tile, target_tiles, granule,
      tile_ptr.mutable_data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t bound =
      (target_tiles > 0 ? target_tiles : (num_pairs + pairs_per_tile - 1) / pairs_per_tile) + num_rel;
  TORCH_CHECK(bound <= std::numeric_limits<int32_t>::max(), "relconv: ", num_pairs, " pairs over ", num_rel,
              " relations need more than 2^31 - 1 thread blocks");
  return bound;
}

void check_grid_y(int64_t y, int64_t z = 1) {
  TORCH_CHECK(y <= 65535 && z <= 65535, "relconv CUDA kernels: too many channel tiles x groups (", y, ", ", z,
              "); at most 65535 each");
}

void check_int32_channels(const ConvShape& s) {
  TORCH_CHECK(s.cin_g <= std::numeric_limits<int32_t>::max() && s.cout_g <= std::numeric_limits<int32_t>::max() &&
                  s.groups <= std::numeric_limits<int32_t>::max(),
              "relconv CUDA kernels: channel counts must fit int32");
}

// The pair-list fields shared by the forward and weight-gradient argument structs.
template <typename T, typename Idx, typename Args>
void fill_pair_args(Args& a, const at::Tensor& in_index, const at::Tensor& out_index, const at::Tensor& rel_ptr,
                    const std::optional<at::Tensor>& scale, const ConvShape& s, int64_t num_in, int64_t num_out) {
  a.in_index = ptr<Idx>(in_index);
  a.out_index = ptr<Idx>(out_index);
  a.rel_ptr = rel_ptr.const_data_ptr<int64_t>();
  a.scale = scale ? ptr<acc_t<T>>(*scale) : nullptr;
  a.num_in = num_in;
  a.num_out = num_out;
  a.num_pairs = s.num_pairs;
  a.num_relations = s.num_relations;
  a.groups = static_cast<int>(s.groups);
  a.cin_g = static_cast<int>(s.cin_g);
  a.cout_g = static_cast<int>(s.cout_g);
}

// ---------------------------------------------------------------- forward

// Tile shapes by output channels per group: the block spans as much of C_out as fits so that each
// gathered A row is reused across many columns; narrow outputs get taller pair tiles instead.
template <int BM_, int BN_, int BK_, int WM_, int WN_>
struct Tiles {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_;
};

template <typename T, typename Idx, typename Cfg, bool kTensorCores>
void launch_forward(cuda::ConvForwardArgs<T, Idx> a, const at::Tensor& rel_ptr, cudaStream_t stream) {
  at::Tensor tile_ptr;
  const int64_t tiles = schedule_tiles(rel_ptr, a.num_pairs, Cfg::BM, 0, 1, tile_ptr, stream);
  a.tile_ptr = tile_ptr.const_data_ptr<int64_t>();
  a.n_tiles = (a.cout_g + Cfg::BN - 1) / Cfg::BN;
  const int64_t y = int64_t{a.n_tiles} * a.groups;
  check_grid_y(y);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(y));
  if constexpr (kTensorCores) {
    constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN) * 32;
    cuda::conv_forward_wmma<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN><<<grid, kThreads, 0, stream>>>(a);
  } else {
    // WM, WN are the per-thread TM, TN here.
    constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN);
    cuda::conv_forward_simt<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN><<<grid, kThreads, 0, stream>>>(a);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename Idx>
void forward_by_width(const cuda::ConvForwardArgs<T, Idx>& a, const at::Tensor& rel_ptr, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    // 4 warps each; warp tiles of 32x32 or 32x64 keep 4-8 accumulator fragments per warp.
    if (a.cout_g <= 32) return launch_forward<T, Idx, Tiles<128, 32, 32, 32, 32>, true>(a, rel_ptr, stream);
    if (a.cout_g <= 64) return launch_forward<T, Idx, Tiles<64, 64, 32, 32, 32>, true>(a, rel_ptr, stream);
    return launch_forward<T, Idx, Tiles<64, 128, 32, 32, 64>, true>(a, rel_ptr, stream);
  } else {
    // 256 threads each, 16 or 32 accumulators per thread.
    if (a.cout_g <= 32) return launch_forward<T, Idx, Tiles<128, 32, 16, 4, 4>, false>(a, rel_ptr, stream);
    if (a.cout_g <= 64) return launch_forward<T, Idx, Tiles<64, 64, 16, 4, 4>, false>(a, rel_ptr, stream);
    return launch_forward<T, Idx, Tiles<64, 128, 16, 4, 8>, false>(a, rel_ptr, stream);
  }
}

// ---------------------------------------------------------------- forward over a neighbour table

// Grid of a table kernel: x = BM-row output tiles, y = group * channel tiles (sets a.n_tiles).
template <typename Cfg, typename T, typename Idx>
dim3 table_grid(cuda::ConvTableArgs<T, Idx>& a) {
  const int64_t row_tiles = (a.num_out + Cfg::BM - 1) / Cfg::BM;
  TORCH_CHECK(row_tiles <= std::numeric_limits<int32_t>::max(), "relconv: ", a.num_out,
              " output rows need more than 2^31 - 1 thread blocks");
  a.n_tiles = (a.cout_g + Cfg::BN - 1) / Cfg::BN;
  const int64_t y = int64_t{a.n_tiles} * a.groups;
  check_grid_y(y);
  return dim3(static_cast<unsigned>(row_tiles), static_cast<unsigned>(y));
}

template <typename T, typename Idx, typename Cfg>
void launch_forward_table_simt(cuda::ConvTableArgs<T, Idx> a, cudaStream_t stream) {
  const dim3 grid = table_grid<Cfg>(a);
  constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN);
  cuda::conv_forward_table_simt<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN><<<grid, kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename Idx, typename Cfg, int kStages, bool kFull>
void launch_forward_table_mma_kernel(const cuda::ConvTableArgs<T, Idx>& a, dim3 grid, cudaStream_t stream) {
  constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN) * 32;
  constexpr int kBytes = cuda::TableMmaSmem<T, Cfg::BM, Cfg::BN, Cfg::BK, kStages>::kBytes;
  constexpr auto kernel =
      cuda::conv_forward_table_mma<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN, kStages, kFull>;
  allow_dynamic_smem<kernel>(kBytes);
  kernel<<<grid, kThreads, kBytes, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The whole-tile kernel (kFull, see conv_forward_table_mma) runs when x and W allow 16-byte loads and
// the channels fill whole tiles (cached subm 3^3 C64 fp16 on the 64-beam scan: 80 -> 56 us). It is
// instantiated for int32 tables only (an int64 table means more than 2^31 outputs, rare enough for the
// general kernel), and needs x's row stride below 2^31 for its 32-bit row multiply.
template <typename T, typename Idx, typename Cfg, int kStages>
void launch_forward_table_mma(cuda::ConvTableArgs<T, Idx> a, cudaStream_t stream) {
  const dim3 grid = table_grid<Cfg>(a);
  if constexpr (std::is_same_v<Idx, int32_t>) {
    const int64_t ldx = int64_t{a.groups} * a.cin_g;
    if (a.vec_x && a.vec_w && a.vec_out2 && a.cin_g % Cfg::BK == 0 && a.cout_g % Cfg::BN == 0 &&
        ldx <= std::numeric_limits<int32_t>::max()) {
      return launch_forward_table_mma_kernel<T, Idx, Cfg, kStages, true>(a, grid, stream);
    }
  }
  launch_forward_table_mma_kernel<T, Idx, Cfg, kStages, false>(a, grid, stream);
}

// Tensor-core configurations count K steps in bytes: 128 (64 halves, 32 floats) past C_in 64, else
// 64, so float in TF32 mode (torch.backends.cuda.matmul.allow_tf32) gets the 16-bit layouts' stage
// sizes and load mappings.
// Measured for half on an H100 (profiled kernel time, cached subm 3^3, 64-beam scan / real scan,
// whole-tile loads): with C_in >= 64 a 64-wide K step in 2 stages (C64 51 / 29 us, C128 139 / 75,
// C256 390 / 203) beat 3 stages (55 / 32, 147 / 74, 412 / 203), 32-wide steps in 3 or 4 stages
// (within 2% of 3 stages) and 128-row tiles (64 / 40, 161 / 85): the fewer the stages, the more
// blocks fit per SM, and at 64-wide steps two stages already cover the gather latency.
// Past C_out 64, 8-warp 128 x 128 tiles (each gathered row feeds twice the columns) beat the 4-warp
// 64 x 128 tile once the rank-and-Gray table order came in (same scans, us): at C128 with 64 x 32
// warp tiles 119 / 63 against 129 / 69 (32 x 64: 120 / 66); at C256 with 32 x 64 warp tiles 323 /
// 181 against 357 / 178 (64 x 32: 324 / 187; 64 x 256: 341 / 208; BK 32 in 3 or 4 stages: 355-365 /
// 190-204). The TF32 configurations have not been swept.
// At C_out 64 on large tables, 8-warp 128 x 64 tiles read each weight slab once per 128 rows instead
// of 64; the weight slabs are most of the kernel's L2 traffic there (ncu, 3.5M-voxel scene: 12.3 GB
// through L2 for 2.7 GB from DRAM). Kernel us, cached subm 3^3 C64 fp16, 64 x 64 -> 128 x 64: 75k
// rows 47.8 -> 48.3, 171k 112.7 -> 101.7, 3.5M 2194 -> 1792 (spconv 1930). Below kTallTileRows the
// smaller tiles keep more blocks per SM.
constexpr int64_t kTallTileRows = 100000;

template <typename T, typename Idx>
void forward_table_mma_by_width(const cuda::ConvTableArgs<T, Idx>& a, cudaStream_t stream) {
  constexpr int kWideK = 128 / sizeof(T), kNarrowK = 64 / sizeof(T);
  if (a.cin_g >= 64 && a.cout_g > 32) {
    if (a.cout_g <= 64 && a.num_out >= kTallTileRows) {
      return launch_forward_table_mma<T, Idx, Tiles<128, 64, kWideK, 32, 32>, 2>(a, stream);
    }
    if (a.cout_g <= 64) return launch_forward_table_mma<T, Idx, Tiles<64, 64, kWideK, 32, 32>, 2>(a, stream);
    if (a.cout_g <= 128) return launch_forward_table_mma<T, Idx, Tiles<128, 128, kWideK, 64, 32>, 2>(a, stream);
    return launch_forward_table_mma<T, Idx, Tiles<128, 128, kWideK, 32, 64>, 2>(a, stream);
  }
  constexpr int S = 4;
  if (a.cout_g <= 16) return launch_forward_table_mma<T, Idx, Tiles<64, 16, kNarrowK, 16, 16>, S>(a, stream);
  if (a.cout_g <= 32) return launch_forward_table_mma<T, Idx, Tiles<64, 32, kNarrowK, 32, 16>, S>(a, stream);
  if (a.cout_g <= 64) return launch_forward_table_mma<T, Idx, Tiles<64, 64, kNarrowK, 32, 32>, S>(a, stream);
  return launch_forward_table_mma<T, Idx, Tiles<64, 128, kNarrowK, 32, 64>, S>(a, stream);
}

// Output rows are owned by one block each, so there is no atomic traffic to amortise with tall
// tiles: 64-row tiles give more blocks and a finer grain for skipping relations. Tensor-core tiles
// keep 4 warps and 16-64 accumulators per thread.
template <typename T, typename Idx>
void forward_table_by_width(const cuda::ConvTableArgs<T, Idx>& a, bool tf32, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return forward_table_mma_by_width<T, Idx>(a, stream);
  } else {
    if constexpr (std::is_same_v<T, float>) {
      if (tf32) return forward_table_mma_by_width<T, Idx>(a, stream);
    }
    if (a.cout_g <= 32) return launch_forward_table_simt<T, Idx, Tiles<64, 32, 16, 2, 4>>(a, stream);
    if (a.cout_g <= 64) return launch_forward_table_simt<T, Idx, Tiles<64, 64, 16, 4, 4>>(a, stream);
    return launch_forward_table_simt<T, Idx, Tiles<64, 128, 16, 4, 8>>(a, stream);
  }
}

// The output-stationary path (see conv_forward_table.cuh); writes every output element itself.
// The epilogue (bias, then ReLU) runs inside the kernel; an output with no work still gets it.
at::Tensor relational_conv_table_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& table,
                                      const std::optional<at::Tensor>& order, const ConvShape& s,
                                      int64_t num_out, const std::optional<at::Tensor>& bias, bool relu) {
  const int64_t cout = s.groups * s.cout_g;
  if (num_out == 0 || s.cout_g == 0) return at::empty({num_out, cout}, x.options());
  // The pair count may be unknown here (s.num_pairs == -1): an all -1 table yields zeros anyway.
  if (s.num_pairs == 0 || s.cin_g == 0 || s.num_relations == 0 || x.size(0) == 0) {
    if (!bias.has_value()) return at::zeros({num_out, cout}, x.options());
    // A copy, never a view: the output must not alias the bias (expand of [C] to [1, C] is contiguous).
    at::Tensor out = bias->expand({num_out, cout}).clone(at::MemoryFormat::Contiguous);
    return relu ? out.relu_() : out;
  }
  check_int32_channels(s);
  const bool half = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
  // mma.sync and cp.async need sm_80+; the tensor-core kernel keeps input rows as int32 in shared memory.
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  const bool rows_fit = x.size(0) <= std::numeric_limits<int32_t>::max();
  if (half) {
    TORCH_CHECK(prop->major >= 8, "relconv's fp16/bf16 output-stationary kernel needs compute capability 8.0+, got ",
                prop->major, ".", prop->minor, "; use dataflow=Dataflow.FETCH_ON_DEMAND");
    TORCH_CHECK(rows_fit, "relconv: the fp16/bf16 output-stationary kernel takes at most 2^31 - 1 input rows, got ",
                x.size(0));
  }
  // fp32 runs on TF32 tensor cores when torch allows TF32 matmuls, like torch's own matmul; otherwise
  // (and where the tensor-core kernel cannot run) it stays exact on the SIMT kernel.
  const bool tf32 =
      x.scalar_type() == at::kFloat && at::globalContext().allowTF32CuBLAS() && prop->major >= 8 && rows_fit;
  at::Tensor out = at::empty({num_out, s.groups * s.cout_g}, x.options());
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous(), tc = table.contiguous();
  const std::optional<at::Tensor> oc = order.has_value() ? std::optional(order->contiguous()) : std::nullopt;
  const std::optional<at::Tensor> bc = bias.has_value() ? std::optional(bias->contiguous()) : std::nullopt;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_types(x.scalar_type(), table.scalar_type(), [&](auto t, auto i) {
    using T = decltype(t);
    using Idx = decltype(i);
    constexpr int V = cuda::kVecElems<T>;
    cuda::ConvTableArgs<T, Idx> a{};
    a.x = ptr<T>(xc);
    a.weight = ptr<T>(wc);
    a.table = ptr<Idx>(tc);
    a.order = oc ? ptr<Idx>(*oc) : nullptr;
    a.bias = bc ? ptr<T>(*bc) : nullptr;
    a.relu = relu;
    a.out = reinterpret_cast<T*>(out.mutable_data_ptr());
    a.num_in = x.size(0);
    a.num_out = num_out;
    a.num_relations = s.num_relations;
    a.groups = static_cast<int>(s.groups);
    a.cin_g = static_cast<int>(s.cin_g);
    a.cout_g = static_cast<int>(s.cout_g);
    a.vec_x = s.cin_g % V == 0 && aligned16(a.x);
    a.vec_w = s.cout_g % V == 0 && aligned16(a.weight);
    a.vec_out2 = s.cout_g % 2 == 0 && reinterpret_cast<uintptr_t>(a.out) % (2 * sizeof(T)) == 0;
    forward_table_by_width<T, Idx>(a, tf32, stream);
  });
  return out;
}

at::Tensor relational_conv_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& in_index,
                                const at::Tensor& out_index, const at::Tensor& rel_ptr,
                                const std::optional<at::Tensor>& scale, int64_t num_out,
                                const std::optional<at::Tensor>& neighbor_table,
                                const std::optional<at::Tensor>& table_order, const std::optional<at::Tensor>& bias,
                                bool relu, const std::optional<at::Tensor>& transposed_table,
                                const std::optional<at::Tensor>& transposed_order) {
  // A map built as a neighbour table passes no pairs to an inference forward (pairs_absent).
  const bool table_only = pairs_absent(neighbor_table, in_index, out_index, rel_ptr);
  const ConvShape s = check_conv_args(x, weight, in_index, out_index, rel_ptr, scale, table_only);
  TORCH_CHECK_VALUE(num_out >= 0, "num_out must be non-negative, got ", num_out);
  TORCH_CHECK_VALUE(x.is_cuda(), "x must be a CUDA tensor, got ", x.device());
  check_neighbor_table(neighbor_table, table_order, in_index, scale, num_out, s.num_relations);
  check_transposed_table(transposed_table, transposed_order, neighbor_table, x.size(0), s.num_relations);
  check_bias(bias, x, s.groups * s.cout_g);
  const c10::cuda::CUDAGuard guard(x.device());
  if (neighbor_table.has_value()) {
    return relational_conv_table_cuda(x, weight, *neighbor_table, table_order, s, num_out, bias, relu);
  }
  const auto acc = acc_dtype(x.scalar_type());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // float32/float64 accumulate straight into the output; half/bfloat16 into an fp32 buffer, cast at the end.
  at::Tensor out = memset_tensor({num_out, s.groups * s.cout_g}, x.options().dtype(acc), 0, stream);
  // The atomics kernel has no epilogue (an output is complete only when every block is done): bias and
  // ReLU are two passes over the accumulator, before its one rounding to x's dtype.
  const auto finish = [&] {
    if (bias.has_value()) out.add_(*bias);
    if (relu) out.relu_();
    return out.scalar_type() == x.scalar_type() ? out : out.to(x.scalar_type());
  };
  if (s.num_pairs == 0 || num_out == 0 || s.cin_g == 0 || s.cout_g == 0 || s.num_relations == 0) {
    return finish();
  }
  check_int32_channels(s);
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  const at::Tensor ii = in_index.contiguous(), oi = out_index.contiguous(), rp = rel_ptr.contiguous();
  const std::optional<at::Tensor> sc = scale.has_value() ? std::optional(scale->contiguous()) : std::nullopt;

  dispatch_types(x.scalar_type(), in_index.scalar_type(), [&](auto t, auto i) {
    using T = decltype(t);
    using Idx = decltype(i);
    constexpr int V = cuda::kVecElems<T>;
    cuda::ConvForwardArgs<T, Idx> a{};
    a.x = ptr<T>(xc);
    a.weight = ptr<T>(wc);
    fill_pair_args<T, Idx>(a, ii, oi, rp, sc, s, x.size(0), num_out);
    a.out = reinterpret_cast<acc_t<T>*>(out.mutable_data_ptr());
    // Row offsets are multiples of cin_g (x) / cout_g (W), so those decide vector loads.
    a.vec_x = s.cin_g % V == 0 && aligned16(a.x);
    a.vec_w = s.cout_g % V == 0 && aligned16(a.weight);
    forward_by_width<T, Idx>(a, rp, stream);
  });
  return finish();
}

// ---------------------------------------------------------------- weight gradient

// Tiles per launch, from a target block count: tiles are equal-sized, so for the pipelined tensor-core
// kernel one wave of about four resident blocks per SM is balanced, and fewer, longer tiles amortise
// its pipeline fill and epilogue; the SIMT kernel keeps its measured 2048 blocks. The deterministic
// mode also caps its per-tile workspace at kMaxWorkspaceBytes. The tile size itself is set on the
// device from the pair count (relation_tile_offsets), which the host does not know for padded pairs.
constexpr int64_t kMaxWorkspaceBytes = int64_t{32} << 20;

int64_t weight_grad_target_tiles(int64_t target_blocks, int64_t blocks_per_tile, int64_t max_tiles) {
  return std::clamp<int64_t>(target_blocks / std::max<int64_t>(1, blocks_per_tile), 1, std::max<int64_t>(1, max_tiles));
}

// Launches one weight-gradient kernel over every relation and returns dW in `out` (x's dtype or the
// float32 accumulator's: then the atomic path returns its buffer as it is). Deterministic
// mode: per-tile partial sums, then weight_grad_reduce (3 launches, no atomics); otherwise atomics
// into a zeroed fp32/fp64 buffer and a cast (4 launches).
template <typename T, typename Idx, typename Cfg, int kStages, bool kTensorCores>
at::Tensor launch_weight_grad(cuda::WeightGradArgs<T, Idx> a, const at::Tensor& rel_ptr, bool deterministic,
                              const at::TensorOptions& opts, at::ScalarType out, cudaStream_t stream) {
  const int m_tiles = (a.cin_g + Cfg::BM - 1) / Cfg::BM;
  a.n_tiles = (a.cout_g + Cfg::BN - 1) / Cfg::BN;
  const int64_t y = int64_t{m_tiles} * a.n_tiles;
  check_grid_y(y, a.groups);
  const auto acc = acc_dtype(opts.dtype().toScalarType());
  const int64_t per_relation = int64_t{a.groups} * a.cin_g * a.cout_g;
  const int64_t acc_bytes = static_cast<int64_t>(c10::elementSize(acc));
  const int64_t max_tiles = deterministic ? kMaxWorkspaceBytes / (per_relation * acc_bytes) - a.num_relations
                                          : std::numeric_limits<int64_t>::max();
  const int64_t target_blocks =
      kTensorCores ? 4 * int64_t{at::cuda::getCurrentDeviceProperties()->multiProcessorCount} : 2048;
  const int64_t target_tiles = weight_grad_target_tiles(target_blocks, y * a.groups, max_tiles);
  at::Tensor tile_ptr;
  const int64_t tiles = schedule_tiles(rel_ptr, a.num_pairs, 0, target_tiles, Cfg::BK, tile_ptr, stream);
  a.tile_ptr = tile_ptr.const_data_ptr<int64_t>();
  at::Tensor buffer;
  if (deterministic) {
    buffer = at::empty({tiles, per_relation}, opts.dtype(acc));
    a.partial = reinterpret_cast<acc_t<T>*>(buffer.mutable_data_ptr());
  } else {
    buffer = memset_tensor({a.num_relations, per_relation}, opts.dtype(acc), 0, stream);
    a.dw = reinterpret_cast<acc_t<T>*>(buffer.mutable_data_ptr());
  }
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(y), static_cast<unsigned>(a.groups));
  if constexpr (kTensorCores) {
    constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN) * 32;
    constexpr int kBytes = cuda::WeightGradSmem<T, Cfg::BM, Cfg::BN, Cfg::BK, kStages>::kBytes;
    constexpr auto kernel = cuda::conv_weight_grad_mma<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN, kStages>;
    allow_dynamic_smem<kernel>(kBytes);
    kernel<<<grid, kThreads, kBytes, stream>>>(a);
  } else {
    constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN);
    cuda::conv_weight_grad_simt<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN><<<grid, kThreads, 0, stream>>>(a);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const std::vector<int64_t> sizes{a.num_relations, a.groups, a.cin_g, a.cout_g};
  if (!deterministic) return buffer.view(sizes).to(out);
  at::Tensor dw = at::empty(sizes, opts);
  const int64_t total = a.num_relations * per_relation;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
  cuda::weight_grad_reduce<T><<<blocks, 256, 0, stream>>>(reinterpret_cast<const acc_t<T>*>(buffer.const_data_ptr()),
                                                          a.tile_ptr, a.num_relations, per_relation,
                                                          reinterpret_cast<T*>(dw.mutable_data_ptr()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return dw.to(out);
}

// Tensor cores (16-byte rows, sm_80+: mma.sync and cp.async): square tiles as wide as the channels,
// 4 warps (8 at C >= 128, whose 128 x 128 tile gathers each pair's rows once instead of twice), K
// steps of 64 bytes (32 pairs of half rows, 16 of float rows: float runs there in TF32 mode, when
// torch.backends.cuda.matmul.allow_tf32 allows it). Other rows, exact float, double and older GPUs
// take the SIMT kernel.
template <typename T, typename Idx>
at::Tensor weight_grad_by_width(const cuda::WeightGradArgs<T, Idx>& a, const at::Tensor& rel_ptr, bool deterministic,
                                const at::TensorOptions& opts, at::ScalarType out, cudaStream_t stream) {
  constexpr bool k16Bit = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
  if constexpr (k16Bit || std::is_same_v<T, float>) {
    constexpr int BK = 64 / sizeof(T);
    const bool tensor_cores = a.vec_x && a.vec_g && (k16Bit || at::globalContext().allowTF32CuBLAS()) &&
                              at::cuda::getCurrentDeviceProperties()->major >= 8;
    if (tensor_cores) {
      if (a.cin_g <= 32 && a.cout_g <= 32) {
        return launch_weight_grad<T, Idx, Tiles<32, 32, BK, 16, 16>, 4, true>(a, rel_ptr, deterministic, opts, out,
                                                                             stream);
      }
      if (a.cin_g >= 128 && a.cout_g >= 128) {
        return launch_weight_grad<T, Idx, Tiles<128, 128, BK, 64, 32>, 3, true>(a, rel_ptr, deterministic, opts,
                                                                               out, stream);
      }
      return launch_weight_grad<T, Idx, Tiles<64, 64, BK, 32, 32>, 4, true>(a, rel_ptr, deterministic, opts, out,
                                                                           stream);
    }
  }
  if (a.cin_g <= 32 && a.cout_g <= 32) {
    return launch_weight_grad<T, Idx, Tiles<32, 32, 16, 2, 2>, 1, false>(a, rel_ptr, deterministic, opts, out, stream);
  }
  return launch_weight_grad<T, Idx, Tiles<64, 64, 16, 4, 4>, 1, false>(a, rel_ptr, deterministic, opts, out, stream);
}

// Deterministic (bitwise reproducible, no atomics) under torch.use_deterministic_algorithms(True).
at::Tensor relational_conv_weight_grad_cuda(const at::Tensor& x, const at::Tensor& grad_out,
                                            const at::Tensor& in_index, const at::Tensor& out_index,
                                            const at::Tensor& rel_ptr, const std::optional<at::Tensor>& scale,
                                            int64_t groups, std::optional<at::ScalarType> out_dtype) {
  const ConvShape s = check_weight_grad_args(x, grad_out, in_index, out_index, rel_ptr, scale, groups);
  const at::ScalarType out = weight_grad_dtype(x, out_dtype);
  TORCH_CHECK_VALUE(x.is_cuda(), "x must be a CUDA tensor, got ", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  if (s.num_pairs == 0 || s.cin_g == 0 || s.cout_g == 0 || s.num_relations == 0 || x.size(0) == 0 ||
      grad_out.size(0) == 0) {
    return at::zeros({s.num_relations, s.groups, s.cin_g, s.cout_g}, x.options().dtype(out));
  }
  check_int32_channels(s);
  const at::Tensor xc = x.contiguous(), gc = grad_out.contiguous();
  const at::Tensor ii = in_index.contiguous(), oi = out_index.contiguous(), rp = rel_ptr.contiguous();
  const std::optional<at::Tensor> sc = scale.has_value() ? std::optional(scale->contiguous()) : std::nullopt;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  at::Tensor dw;
  dispatch_types(x.scalar_type(), in_index.scalar_type(), [&](auto t, auto i) {
    using T = decltype(t);
    using Idx = decltype(i);
    constexpr int V = cuda::kVecElems<T>;
    cuda::WeightGradArgs<T, Idx> a{};
    a.x = ptr<T>(xc);
    a.grad = ptr<T>(gc);
    fill_pair_args<T, Idx>(a, ii, oi, rp, sc, s, x.size(0), grad_out.size(0));
    a.vec_x = s.cin_g % V == 0 && aligned16(a.x);
    a.vec_g = s.cout_g % V == 0 && aligned16(a.grad);
    dw = weight_grad_by_width<T, Idx>(a, rp, deterministic, x.options(), out, stream);
  });
  return dw;
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CUDA, m) {
  m.impl("relational_conv", &relational_conv_cuda);
  m.impl("relational_conv_weight_grad", &relational_conv_weight_grad_cuda);
}

}  // namespace relconv
