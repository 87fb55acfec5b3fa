// Launchers of the relational-convolution kernels: pick a tile configuration from the channel
// counts and launch. Defined once here and instantiated per element type in conv_launch_<type>.cu, so
// that the heavy kernel templates compile as parallel translation units (one file held them all and
// took ~90 s of a serial nvcc run, most of every build); relational_conv.cu calls them through
// conv_launch.h.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/checks.h"
#include "cuda/conv_launch.h"
#include "cuda/kernel_launch.h"
#include "cuda/tile_schedule.cuh"

namespace relconv::launch {
namespace {

using cuda::acc_t;

// Device-side tile offsets (see tile_schedule.cuh) into `tile_ptr` ([R + 2]), and the block count
// that covers them. Fixed tiles (target_tiles == 0): ceil(P / pairs_per_tile) + R blocks, P being
// the pair arrays' length (an upper bound of rel_ptr[R]). Device-sized tiles: target_tiles + R.
// `zero` (optional, float or double): a buffer the same launch sets to zero.
int64_t schedule_tiles(const at::Tensor& rel_ptr, int64_t num_pairs, int64_t pairs_per_tile, int64_t target_tiles,
                       int64_t granule, at::Tensor& tile_ptr, cudaStream_t stream, at::Tensor* zero = nullptr) {
  const int64_t num_rel = rel_ptr.numel() - 1;
  tile_ptr = at::empty({num_rel + 2}, rel_ptr.options());
  const int64_t zero_words = zero != nullptr ? static_cast<int64_t>(zero->nbytes() / sizeof(uint32_t)) : 0;
  cuda::relation_tile_offsets<<<1 + cuda::zeroing_blocks(zero_words), cuda::kScheduleThreads, 0, stream>>>(
      rel_ptr.const_data_ptr<int64_t>(), num_rel, num_pairs, pairs_per_tile, target_tiles, granule,
      tile_ptr.mutable_data_ptr<int64_t>(),
      zero_words > 0 ? static_cast<uint32_t*>(zero->mutable_data_ptr()) : nullptr, zero_words);
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

// Exact fp32 at C_out >= 64 with 16-byte rows: 128-pair tiles, 8 x 8 float4 register tiles and float4
// atomics (conv_forward_simt_vec.cuh).
template <typename Idx, int BN>
void launch_forward_simt_vec(cuda::ConvForwardArgs<float, Idx> a, const at::Tensor& rel_ptr, cudaStream_t stream) {
  constexpr int BM = 128;
  at::Tensor tile_ptr;
  const int64_t tiles = schedule_tiles(rel_ptr, a.num_pairs, BM, 0, 1, tile_ptr, stream);
  a.tile_ptr = tile_ptr.const_data_ptr<int64_t>();
  a.n_tiles = (a.cout_g + BN - 1) / BN;
  const int64_t y = int64_t{a.n_tiles} * a.groups;
  check_grid_y(y);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(y));
  cuda::conv_forward_simt_vec<Idx, BM, BN><<<grid, cuda::SimtVecShape<BM, BN>::kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename Idx>
void forward_by_width(const cuda::ConvForwardArgs<T, Idx>& a, const at::Tensor& rel_ptr, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    const bool out16 = reinterpret_cast<uintptr_t>(a.out) % 16 == 0 && (int64_t{a.groups} * a.cout_g) % 4 == 0;
    if (a.cout_g >= 64 && a.vec_x && a.vec_w && out16) {
      if (a.cout_g >= 128) return launch_forward_simt_vec<Idx, 128>(a, rel_ptr, stream);
      return launch_forward_simt_vec<Idx, 64>(a, rel_ptr, stream);
    }
  }
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
bool launch_forward_table_simt(cuda::ConvTableArgs<T, Idx> a, cudaStream_t stream) {
  const dim3 grid = table_grid<Cfg>(a);
  constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN);
  cuda::conv_forward_table_simt<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN><<<grid, kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

template <typename T, typename Idx, typename Cfg, int kStages, bool kFull, bool kExact, bool kWeightT = false>
bool launch_forward_table_mma_kernel(const cuda::ConvTableArgs<T, Idx>& a, dim3 grid, cudaStream_t stream) {
  constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN) * 32;
  constexpr int kBytes = cuda::TableMmaSmem<T, Cfg::BM, Cfg::BN, Cfg::BK, kStages, kWeightT>::kBytes;
  constexpr auto kernel = cuda::conv_forward_table_mma<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN, kStages,
                                                       kFull, kExact, kWeightT>;
  allow_dynamic_smem<kernel>(kBytes);
  cuda::ConvTableArgs<T, Idx> args = a;
  args.split = relation_split(int64_t{grid.x} * grid.y, a.num_relations);
  launch_split(kernel, grid, kThreads, kBytes, stream, args);
  return true;
}

// The whole-tile kernel (kFull, see conv_forward_table_mma) runs when x and W allow 16-byte loads and
// the channels fill whole tiles (cached subm 3^3 C64 fp16 on the 64-beam scan: 80 -> 56 us). It is
// instantiated for int32 tables only (an int64 table means more than 2^31 outputs, rare enough for the
// general kernel), and needs x's row stride below 2^31 for its 32-bit row multiply. Only it reads a
// W^T in place (a.weight_t, 16-bit types): other shapes return false for the caller to copy W^T.
template <typename T, typename Idx, typename Cfg, int kStages, bool kExact>
bool launch_forward_table_mma(cuda::ConvTableArgs<T, Idx> a, cudaStream_t stream) {
  const dim3 grid = table_grid<Cfg>(a);
  if constexpr (std::is_same_v<Idx, int32_t>) {
    const int64_t ldx = int64_t{a.groups} * a.cin_g;
    if (a.vec_x && a.vec_w && a.vec_out2 && a.cin_g % Cfg::BK == 0 && a.cout_g % Cfg::BN == 0 &&
        ldx <= std::numeric_limits<int32_t>::max()) {
      if constexpr (sizeof(T) == 2 && !kExact) {
        if (a.weight_t) return launch_forward_table_mma_kernel<T, Idx, Cfg, kStages, true, kExact, true>(a, grid, stream);
      }
      if (!a.weight_t) return launch_forward_table_mma_kernel<T, Idx, Cfg, kStages, true, kExact>(a, grid, stream);
    }
  }
  return !a.weight_t && launch_forward_table_mma_kernel<T, Idx, Cfg, kStages, false, kExact>(a, grid, stream);
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
// smaller tiles keep more blocks per SM. Session 11 (same kernel, us): 3 stages 171k 92 -> 109, 3.5M
// 1797 -> 2110; 256 x 64 tiles (64 x 32 warp tiles) 159 / 3145. Not taken.
constexpr int64_t kTallTileRows = 100000;

template <typename T, typename Idx>
bool forward_table_mma_by_width(const cuda::ConvTableArgs<T, Idx>& a, cudaStream_t stream) {
  constexpr int kWideK = 128 / sizeof(T), kNarrowK = 64 / sizeof(T);
  if constexpr ((std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) && std::is_same_v<Idx, int32_t>) {
    if (a.cout_g >= 64 && forward_table_wgmma<T>(a, stream)) return true;
  }
  if (a.cin_g >= 64 && a.cout_g > 32) {
    if (a.cout_g <= 64 && a.num_out >= kTallTileRows) {
      return launch_forward_table_mma<T, Idx, Tiles<128, 64, kWideK, 32, 32>, 2, false>(a, stream);
    }
    if (a.cout_g <= 64) return launch_forward_table_mma<T, Idx, Tiles<64, 64, kWideK, 32, 32>, 2, false>(a, stream);
    if (a.cout_g <= 128) return launch_forward_table_mma<T, Idx, Tiles<128, 128, kWideK, 64, 32>, 2, false>(a, stream);
    return launch_forward_table_mma<T, Idx, Tiles<128, 128, kWideK, 32, 64>, 2, false>(a, stream);
  }
  constexpr int S = 4;
  if (a.cout_g <= 16) return launch_forward_table_mma<T, Idx, Tiles<64, 16, kNarrowK, 16, 16>, S, false>(a, stream);
  if (a.cout_g <= 32) return launch_forward_table_mma<T, Idx, Tiles<64, 32, kNarrowK, 32, 16>, S, false>(a, stream);
  if (a.cout_g <= 64) return launch_forward_table_mma<T, Idx, Tiles<64, 64, kNarrowK, 32, 32>, S, false>(a, stream);
  return launch_forward_table_mma<T, Idx, Tiles<64, 128, kNarrowK, 32, 64>, S, false>(a, stream);
}

// Output rows are owned by one block each, so there is no atomic traffic to amortise with tall
// tiles: 64-row tiles give more blocks and a finer grain for skipping relations. Tensor-core tiles
// keep 4 warps and 16-64 accumulators per thread.
template <typename T, typename Idx>
bool forward_table_by_width(const cuda::ConvTableArgs<T, Idx>& a, bool tf32, cudaStream_t stream) {
  if (a.weight_t && sizeof(T) != 2) return false;  // only 16-bit kernels read W^T in place
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return forward_table_mma_by_width<T, Idx>(a, stream);
  } else {
    if constexpr (std::is_same_v<T, float>) {
      if (tf32) return forward_table_mma_by_width<T, Idx>(a, stream);
      // Exact fp32 at C_out_g <= 32: the pipelined kernel with fmas on CUDA cores (SimtWarpTile; it
      // keeps input rows as int32). Measured on an H100 against fetch-on-demand (cached subm 3^3,
      // GPU / latency / queued us, 64-beam and real scan): C16 33 / 80 / 38 against 48 / 99 / 53 and
      // 22 / 64 / 37 against 20 / 81 / 60; C32 75 / 122 / 77 against 75 / 138 / 79 and 47 / 90 / 49
      // against 30 / 86 / 58. From C64 its per-thread tiles lose (C64 193 against 168 us, C256 2552
      // against 2133), so wider exact layers keep the SIMT kernel below (and AUTO fetch-on-demand).
      if (a.cout_g <= 32 && a.num_in <= std::numeric_limits<int32_t>::max()) {
        constexpr int K = 64 / sizeof(T);
        if (a.cout_g <= 16) return launch_forward_table_mma<T, Idx, Tiles<64, 16, K, 16, 16>, 4, true>(a, stream);
        return launch_forward_table_mma<T, Idx, Tiles<64, 32, K, 32, 16>, 4, true>(a, stream);
      }
    }
    if (a.cout_g <= 32) return launch_forward_table_simt<T, Idx, Tiles<64, 32, 16, 2, 4>>(a, stream);
    if (a.cout_g <= 64) return launch_forward_table_simt<T, Idx, Tiles<64, 64, 16, 4, 4>>(a, stream);
    return launch_forward_table_simt<T, Idx, Tiles<64, 128, 16, 4, 8>>(a, stream);
  }
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

// The largest target tile count whose per-tile partial sums (`per_relation` elements of
// `elem_bytes` each) fit kMaxWorkspaceBytes: the schedule makes up to target + R tiles.
int64_t workspace_target_tiles(int64_t per_relation, int64_t elem_bytes, int64_t num_relations) {
  return kMaxWorkspaceBytes / (per_relation * elem_bytes) - num_relations;
}

// The tensor-core weight gradient as one cooperative launch (conv_weight_grad_mma_fused), when a
// launch may be cooperative now and enough blocks fit the GPU at once: at least as many tiles as
// relations beside the relations' partial tiles, within the target block count and the workspace
// bound. An undefined tensor (nothing launched) otherwise.
// H100, 64-beam scan, C64 fp16 (2M pairs), one op call (in-process A/B, gpu_checks/session18_probes.txt):
// host 29-32 -> 13-15 us, GPU (queued) 46-47.5 -> 45-46 us. A first form, block 0 writing the schedule
// behind a second grid barrier and one lane per output quad in the reduction, took 54 us of GPU.
template <typename T, typename Idx, typename Cfg, int kStages>
at::Tensor launch_weight_grad_fused(cuda::WeightGradArgs<T, Idx> a, int64_t y, int64_t target_blocks,
                                    const at::TensorOptions& opts, at::ScalarType out, cudaStream_t stream) {
  constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN) * 32;
  constexpr int kBytes = cuda::WeightGradSmem<T, Cfg::BM, Cfg::BN, Cfg::BK, kStages>::kBytes;
  constexpr auto kernel = cuda::conv_weight_grad_mma_fused<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN, kStages>;
  if (!cooperative_ok()) return {};
  allow_dynamic_smem<kernel>(kBytes);
  const int64_t per_relation = int64_t{a.groups} * a.cin_g * a.cout_g;
  const int64_t blocks_per_tile = y * a.groups;
  const int64_t fit = resident_blocks<kernel>(kThreads, kBytes) / blocks_per_tile - a.num_relations;
  const int64_t room = workspace_target_tiles(per_relation, sizeof(float), a.num_relations);
  const int64_t target_tiles = std::min({target_blocks / blocks_per_tile, fit, room});
  if (target_tiles < a.num_relations) return {};
  const int64_t tiles = target_tiles + a.num_relations;  // the schedule's bound
  // One allocation: the tiles' partial sums, then the schedule (R + 2 int64 after 16-byte floats).
  at::Tensor work = at::empty({tiles * per_relation + 2 * (a.num_relations + 2)}, opts.dtype(at::kFloat));
  a.partial = work.mutable_data_ptr<float>();
  a.schedule = reinterpret_cast<int64_t*>(a.partial + tiles * per_relation);
  a.target_tiles = target_tiles;
  at::Tensor dw = at::empty({a.num_relations, a.groups, a.cin_g, a.cout_g}, opts.dtype(out));
  if (out == at::kFloat) {
    a.dw = dw.mutable_data_ptr<float>();
  } else {
    a.dw_out = reinterpret_cast<T*>(dw.mutable_data_ptr());
  }
  void* args[] = {&a};
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(y), static_cast<unsigned>(a.groups));
  C10_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), grid, dim3(kThreads), args,
                                             kBytes, stream));
  return dw;
}

// Launches one weight-gradient kernel over every relation and returns dW in `out` (x's dtype or the
// float32 accumulator's: then the atomic path returns its buffer as it is). Tensor cores: one
// cooperative launch where it can (launch_weight_grad_fused). Otherwise, deterministic mode:
// per-tile partial sums, then weight_grad_reduce (3 launches, no atomics); else atomics into an
// fp32/fp64 buffer zeroed by the schedule launch, and a cast unless `out` is that buffer's dtype
// (2 or 3 launches).
template <typename T, typename Idx, typename Cfg, int kStages, bool kTensorCores>
at::Tensor launch_weight_grad(cuda::WeightGradArgs<T, Idx> a, const at::Tensor& rel_ptr, bool deterministic,
                              const at::TensorOptions& opts, at::ScalarType out, cudaStream_t stream) {
  const int m_tiles = (a.cin_g + Cfg::BM - 1) / Cfg::BM;
  a.n_tiles = (a.cout_g + Cfg::BN - 1) / Cfg::BN;
  const int64_t y = int64_t{m_tiles} * a.n_tiles;
  check_grid_y(y, a.groups);
  const int64_t target_blocks =
      kTensorCores ? 4 * int64_t{at::cuda::getCurrentDeviceProperties()->multiProcessorCount} : 2048;
  if constexpr (kTensorCores) {
    at::Tensor dw = launch_weight_grad_fused<T, Idx, Cfg, kStages>(a, y, target_blocks, opts, out, stream);
    if (dw.defined()) return dw;
  }
  const auto acc = acc_dtype(opts.dtype().toScalarType());
  const int64_t per_relation = int64_t{a.groups} * a.cin_g * a.cout_g;
  const int64_t acc_bytes = static_cast<int64_t>(c10::elementSize(acc));
  const int64_t max_tiles = deterministic ? workspace_target_tiles(per_relation, acc_bytes, a.num_relations)
                                          : std::numeric_limits<int64_t>::max();
  const int64_t target_tiles = weight_grad_target_tiles(target_blocks, y * a.groups, max_tiles);
  // The atomic accumulator is zeroed by the schedule launch; the deterministic partials (sized by
  // the schedule's tile bound) are each written once.
  const std::vector<int64_t> sizes{a.num_relations, a.groups, a.cin_g, a.cout_g};
  at::Tensor tile_ptr, buffer;
  if (!deterministic) buffer = at::empty(sizes, opts.dtype(acc));
  const int64_t tiles = schedule_tiles(rel_ptr, a.num_pairs, 0, target_tiles, Cfg::BK, tile_ptr, stream,
                                       deterministic ? nullptr : &buffer);
  a.tile_ptr = tile_ptr.const_data_ptr<int64_t>();
  if (deterministic) {
    buffer = at::empty({tiles, per_relation}, opts.dtype(acc));
    a.partial = reinterpret_cast<acc_t<T>*>(buffer.mutable_data_ptr());
  } else {
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
  if (!deterministic && out == acc) return buffer;
  at::Tensor dw = at::empty(sizes, opts);
  const int64_t total = a.num_relations * per_relation;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
  if (!deterministic) {  // out is T here (weight_grad_dtype: x's dtype or float32)
    cuda::round_from_acc<T><<<blocks, 256, 0, stream>>>(reinterpret_cast<const acc_t<T>*>(buffer.const_data_ptr()),
                                                        total, reinterpret_cast<T*>(dw.mutable_data_ptr()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return dw;
  }
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

}  // namespace

template <typename T, typename Idx>
void forward_pairs(const cuda::ConvForwardArgs<T, Idx>& a, const at::Tensor& rel_ptr, cudaStream_t stream) {
  forward_by_width<T, Idx>(a, rel_ptr, stream);
}

template <typename T, typename Idx>
bool forward_table(const cuda::ConvTableArgs<T, Idx>& a, bool tf32, cudaStream_t stream) {
  return forward_table_by_width<T, Idx>(a, tf32, stream);
}

template <typename T, typename Idx>
at::Tensor weight_grad(const cuda::WeightGradArgs<T, Idx>& a, const at::Tensor& rel_ptr, bool deterministic,
                       const at::TensorOptions& opts, at::ScalarType out, cudaStream_t stream) {
  return weight_grad_by_width<T, Idx>(a, rel_ptr, deterministic, opts, out, stream);
}

}  // namespace relconv::launch

// The three launchers for element type T and both index types (one line per conv_launch_<type>.cu).
#define RELCONV_INSTANTIATE_LAUNCHERS(T)                                                                       \
  template void relconv::launch::forward_pairs<T, int32_t>(const relconv::cuda::ConvForwardArgs<T, int32_t>&, \
                                                           const at::Tensor&, cudaStream_t);                  \
  template void relconv::launch::forward_pairs<T, int64_t>(const relconv::cuda::ConvForwardArgs<T, int64_t>&, \
                                                           const at::Tensor&, cudaStream_t);                  \
  template bool relconv::launch::forward_table<T, int32_t>(const relconv::cuda::ConvTableArgs<T, int32_t>&,   \
                                                           bool, cudaStream_t);                               \
  template bool relconv::launch::forward_table<T, int64_t>(const relconv::cuda::ConvTableArgs<T, int64_t>&,   \
                                                           bool, cudaStream_t);                               \
  template at::Tensor relconv::launch::weight_grad<T, int32_t>(                                               \
      const relconv::cuda::WeightGradArgs<T, int32_t>&, const at::Tensor&, bool, const at::TensorOptions&,   \
      at::ScalarType, cudaStream_t);                                                                          \
  template at::Tensor relconv::launch::weight_grad<T, int64_t>(                                               \
      const relconv::cuda::WeightGradArgs<T, int64_t>&, const at::Tensor&, bool, const at::TensorOptions&,   \
      at::ScalarType, cudaStream_t)
