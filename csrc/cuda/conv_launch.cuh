// Launchers of the relational-convolution kernels: pick a tile configuration from the channel
// counts and launch. Defined once here and instantiated per element type in conv_launch_<type>.cu, so
// that the heavy kernel templates compile as parallel translation units (one file held them all and
// took ~90 s of a serial nvcc run, most of every build); relational_conv.cu calls them through
// conv_launch.h.
#pragma once

#include "common/error_message.h"
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/checks.h"
#include "common/kernel_choice.h"
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
  RELCONV_CHECK(bound <= std::numeric_limits<int32_t>::max(), "relconv: ", num_pairs, " pairs over ", num_rel,
              " relations need more than 2^31 - 1 thread blocks");
  return bound;
}

void check_grid_y(int64_t y, int64_t z = 1) {
  RELCONV_CHECK(y <= 65535 && z <= 65535, "relconv CUDA kernels: too many channel tiles x groups (", y, ", ", z,
              "); at most 65535 each");
}

// ---------------------------------------------------------------- forward

// Tile shapes by output channels per group: the block spans as much of C_out as fits so that each
// gathered A row is reused across many columns; narrow outputs get taller pair tiles instead.
template <int BM_, int BN_, int BK_, int WM_, int WN_, int WK_ = 1>
struct Tiles {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, WK = WK_;
};

// The tiles that common/kernel_choice.h gives configuration C for element type T.
template <choice::Config C, typename T>
using TilesOf = Tiles<choice::tiles(C, sizeof(T)).bm, choice::tiles(C, sizeof(T)).bn, choice::tiles(C, sizeof(T)).bk,
                      choice::tiles(C, sizeof(T)).wm, choice::tiles(C, sizeof(T)).wn,
                      choice::tiles(C, sizeof(T)).warps_k>;
template <choice::Config C, typename T>
inline constexpr int kStagesOf = choice::tiles(C, sizeof(T)).stages;

template <typename T>
inline constexpr bool k16Bit = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

template <typename T>
constexpr choice::Dtype dtype_of() {
  if constexpr (std::is_same_v<T, __half>) return choice::Dtype::kHalf;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return choice::Dtype::kBFloat16;
  if constexpr (std::is_same_v<T, float>) return choice::Dtype::kFloat;
  return choice::Dtype::kDouble;
}

inline choice::Device current_device() {
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  return {prop->major, prop->minor, prop->multiProcessorCount};
}

[[noreturn]] inline void no_launcher(choice::Config c, const char* type) {
  RELCONV_CHECK(false, "relconv: kernel ", choice::config_name(c), " has no launcher for ", type, " elements");
}

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
  using C = choice::Config;
  const bool out16 = reinterpret_cast<uintptr_t>(a.out) % 16 == 0 && (int64_t{a.groups} * a.cout_g) % 4 == 0;
  const C config = choice::pairs_kernel({dtype_of<T>(), a.groups, a.cin_g, a.cout_g, a.vec_x, a.vec_w, out16});
  switch (config) {
    case C::kPairsSimtVec128:
      if constexpr (std::is_same_v<T, float>) return launch_forward_simt_vec<Idx, 128>(a, rel_ptr, stream);
      break;
    case C::kPairsSimtVec64:
      if constexpr (std::is_same_v<T, float>) return launch_forward_simt_vec<Idx, 64>(a, rel_ptr, stream);
      break;
    case C::kPairsWmma32:
      if constexpr (k16Bit<T>) return launch_forward<T, Idx, TilesOf<C::kPairsWmma32, T>, true>(a, rel_ptr, stream);
      break;
    case C::kPairsWmma64:
      if constexpr (k16Bit<T>) return launch_forward<T, Idx, TilesOf<C::kPairsWmma64, T>, true>(a, rel_ptr, stream);
      break;
    case C::kPairsWmma128:
      if constexpr (k16Bit<T>) return launch_forward<T, Idx, TilesOf<C::kPairsWmma128, T>, true>(a, rel_ptr, stream);
      break;
    case C::kPairsSimt32:
      if constexpr (!k16Bit<T>) return launch_forward<T, Idx, TilesOf<C::kPairsSimt32, T>, false>(a, rel_ptr, stream);
      break;
    case C::kPairsSimt64:
      if constexpr (!k16Bit<T>) return launch_forward<T, Idx, TilesOf<C::kPairsSimt64, T>, false>(a, rel_ptr, stream);
      break;
    case C::kPairsSimt128:
      if constexpr (!k16Bit<T>) return launch_forward<T, Idx, TilesOf<C::kPairsSimt128, T>, false>(a, rel_ptr, stream);
      break;
    default: break;
  }
  no_launcher(config, "these");
}

// ---------------------------------------------------------------- forward over a neighbour table

// Grid of a table kernel: x = BM-row output tiles, y = group * channel tiles (sets a.n_tiles).
template <typename Cfg, typename T, typename Idx>
dim3 table_grid(cuda::ConvTableArgs<T, Idx>& a) {
  const int64_t row_tiles = (a.num_out + Cfg::BM - 1) / Cfg::BM;
  RELCONV_CHECK(row_tiles <= std::numeric_limits<int32_t>::max(), "relconv: ", a.num_out,
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
  launch_split(kernel, grid, kThreads, kBytes, stream, a);
  return true;
}

// The mma.sync table kernel of configuration K, whole-tile or general and reading W^T in place or
// not as the choice says (the whole-tile kernel exists for int32 tables only, its W^T form for
// 16-bit tensor-core runs only).
template <typename T, typename Idx, choice::Config K, bool kExact>
bool launch_forward_table_mma(cuda::ConvTableArgs<T, Idx> a, const choice::TableChoice& c, cudaStream_t stream) {
  using Cfg = TilesOf<K, T>;
  constexpr int kStages = kStagesOf<K, T>;
  const dim3 grid = table_grid<Cfg>(a);
  a.split = c.split;
  a.pack = c.pack;
  if constexpr (std::is_same_v<Idx, int32_t>) {
    if (c.whole_tiles) {
      if constexpr (sizeof(T) == 2 && !kExact) {
        if (c.reads_weight_t) {
          return launch_forward_table_mma_kernel<T, Idx, Cfg, kStages, true, kExact, true>(a, grid, stream);
        }
      }
      return launch_forward_table_mma_kernel<T, Idx, Cfg, kStages, true, kExact>(a, grid, stream);
    }
  }
  return launch_forward_table_mma_kernel<T, Idx, Cfg, kStages, false, kExact>(a, grid, stream);
}

// Launches the table kernel that choice::table_kernel names; false, launching nothing, for kNone (a
// W^T view no kernel reads in place: the caller copies it).
template <typename T, typename Idx>
bool forward_table_by_width(const cuda::ConvTableArgs<T, Idx>& a, bool allow_tf32, cudaStream_t stream) {
  using C = choice::Config;
  choice::TableProblem p;
  p.dtype = dtype_of<T>();
  p.allow_tf32 = allow_tf32;
  p.index32 = std::is_same_v<Idx, int32_t>;
  p.num_in = a.num_in;
  p.num_out = a.num_out;
  p.num_relations = a.num_relations;
  p.groups = a.groups;
  p.cin_g = a.cin_g;
  p.cout_g = a.cout_g;
  p.vec_x = a.vec_x;
  p.vec_w = a.vec_w;
  p.vec_out2 = a.vec_out2;
  p.weight_t = a.weight_t;
  p.x_chunks = a.x_chunks;
  const choice::TableChoice c = choice::table_kernel(p, current_device(), [] { return wgmma_built(); });
  constexpr bool kTensorCores = k16Bit<T> || std::is_same_v<T, float>;
  switch (c.config) {
    case C::kNone: return false;
    case C::kWgmmaPersistent256:
    case C::kWgmmaPersistent128:
    case C::kWgmma256:
    case C::kWgmma128:
    case C::kWgmma64:
      if constexpr (k16Bit<T> && std::is_same_v<Idx, int32_t>) return forward_table_wgmma<T>(a, c, stream);
      break;
#define RELCONV_TABLE_MMA(K)                                                                  \
  case C::K:                                                                                  \
    if constexpr (kTensorCores) return launch_forward_table_mma<T, Idx, C::K, false>(a, c, stream); \
    break;
      RELCONV_TABLE_MMA(kTableMmaTall64)
      RELCONV_TABLE_MMA(kTableMmaWide64)
      RELCONV_TABLE_MMA(kTableMmaTall96)
      RELCONV_TABLE_MMA(kTableMmaWide96)
      RELCONV_TABLE_MMA(kTableMmaWide128)
      RELCONV_TABLE_MMA(kTableMmaWide256)
      RELCONV_TABLE_MMA(kTableMma16)
      RELCONV_TABLE_MMA(kTableMmaPacked16)
      RELCONV_TABLE_MMA(kTableMmaPacked16Tall)
      RELCONV_TABLE_MMA(kTableMma32)
      RELCONV_TABLE_MMA(kTableMma64)
      RELCONV_TABLE_MMA(kTableMma128)
#undef RELCONV_TABLE_MMA
    case C::kTableExact16:
      if constexpr (std::is_same_v<T, float>) return launch_forward_table_mma<T, Idx, C::kTableExact16, true>(a, c, stream);
      break;
    case C::kTableExact32:
      if constexpr (std::is_same_v<T, float>) return launch_forward_table_mma<T, Idx, C::kTableExact32, true>(a, c, stream);
      break;
    case C::kTableSimt32:
      if constexpr (!k16Bit<T>) return launch_forward_table_simt<T, Idx, TilesOf<C::kTableSimt32, T>>(a, stream);
      break;
    case C::kTableSimt64:
      if constexpr (!k16Bit<T>) return launch_forward_table_simt<T, Idx, TilesOf<C::kTableSimt64, T>>(a, stream);
      break;
    case C::kTableSimt128:
      if constexpr (!k16Bit<T>) return launch_forward_table_simt<T, Idx, TilesOf<C::kTableSimt128, T>>(a, stream);
      break;
    default: break;
  }
  no_launcher(c.config, "these");
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
// launch may be cooperative now and enough blocks fit the GPU at once: at least two tiles per
// relation beside the relations' partial tiles, within the target block count and the workspace
// bound. An undefined tensor (nothing launched) otherwise. Fewer tiles leave the launch unbalanced:
// H100, subm 3^3 C256 (four blocks a tile), kernel us, 64-beam scan / four scans / room-3cm, 39
// tiles for 27 relations against the split form: fp16 521 / 1823 / 5313 against 372 / 1432 / 4254,
// exact fp32 2147 / 7815 / 23459 against 1953 / 7218 / 22233.
// H100, 64-beam scan, C64 fp16 (2M pairs), one op call against the three-launch form: host 29-32 ->
// 13-15 us, GPU (queued) 46-47.5 -> 45-46 us (python -m benchmarks.run --suite voxel, fwd+bwd rows).
template <typename T, typename Idx, typename Cfg, int kStages, bool kExact>
at::Tensor launch_weight_grad_fused(cuda::WeightGradArgs<T, Idx> a, int64_t y, int64_t target_blocks,
                                    const at::TensorOptions& opts, at::ScalarType out, cudaStream_t stream) {
  constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN) * Cfg::WK * 32;
  constexpr int kBytes = cuda::WeightGradSmem<T, Cfg::BM, Cfg::BN, Cfg::BK, kStages>::kBytes;
  constexpr auto kernel =
      cuda::conv_weight_grad_mma_fused<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN, Cfg::WK, kStages, kExact>;
  if (!cooperative_ok()) return {};
  allow_dynamic_smem<kernel>(kBytes);
  const int64_t per_relation = int64_t{a.groups} * a.cin_g * a.cout_g;
  const int64_t blocks_per_tile = y * a.groups;
  const int64_t fit = resident_blocks<kernel>(kThreads, kBytes) / blocks_per_tile - a.num_relations;
  const int64_t room = workspace_target_tiles(per_relation, sizeof(float), a.num_relations);
  const int64_t target_tiles = std::min({target_blocks / blocks_per_tile, fit, room});
  if (target_tiles < 2 * a.num_relations) return {};
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
// float32 accumulator's: then the atomic path returns its buffer as it is). The pipelined kernel
// (tensor cores, or exact fp32 with kExact): one cooperative launch where it can
// (launch_weight_grad_fused). Otherwise, deterministic mode:
// per-tile partial sums, then weight_grad_reduce (3 launches, no atomics); else atomics into an
// fp32/fp64 buffer zeroed by the schedule launch, and a cast unless `out` is that buffer's dtype
// (2 or 3 launches).
template <typename T, typename Idx, typename Cfg, int kStages, bool kPipelined, bool kExact>
at::Tensor launch_weight_grad(cuda::WeightGradArgs<T, Idx> a, const at::Tensor& rel_ptr, bool deterministic,
                              const at::TensorOptions& opts, at::ScalarType out, cudaStream_t stream) {
  const int m_tiles = (a.cin_g + Cfg::BM - 1) / Cfg::BM;
  a.n_tiles = (a.cout_g + Cfg::BN - 1) / Cfg::BN;
  const int64_t y = int64_t{m_tiles} * a.n_tiles;
  check_grid_y(y, a.groups);
  // Pipelined: 4 blocks per SM; 8 for the 16 x 16 tiles and for the exact fp32 32 x 32 tile, whose
  // blocks are small (16 x 16: 25 KB of shared memory, 64 registers, or 76 in exact fp32, where 6
  // fit; exact 32 x 32: 21 KB, 105 registers, 9 fit) and wait on their gathers. The launch takes
  // what fits (resident_blocks). H200, kernel us of a training step (subm 3^3,
  // batch4-64beam / room-3cm / aggregate-1m): C16 fp16 240 / 399 / 1072 with 4 against 234 / 376 /
  // 1018; C32 fp32 621 / 1632 / 4237 against 529 / 1331 / 3395, C16 fp32 413 / 1051 / 2791 against
  // 322 / 770 / 1977. The exact 64 x 64 tile takes 5 (96 registers, no spill; 123 and 4 before):
  // C64 fp32 443 / 1281 / 3345 against 397 / 1148 / 2971, and 306 / 447 / 1485 against 270 / 394 /
  // 1304 at stride 2.
  const int per_sm = (Cfg::BM == 16 || (kExact && Cfg::BM == 32)) ? 8 : (kExact && Cfg::BM == 64) ? 5 : 4;
  const int64_t target_blocks =
      kPipelined ? per_sm * int64_t{at::cuda::getCurrentDeviceProperties()->multiProcessorCount} : 2048;
  if constexpr (kPipelined) {
    at::Tensor dw = launch_weight_grad_fused<T, Idx, Cfg, kStages, kExact>(a, y, target_blocks, opts, out, stream);
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
  if constexpr (kPipelined) {
    constexpr int kThreads = (Cfg::BM / Cfg::WM) * (Cfg::BN / Cfg::WN) * Cfg::WK * 32;
    constexpr int kBytes = cuda::WeightGradSmem<T, Cfg::BM, Cfg::BN, Cfg::BK, kStages>::kBytes;
    constexpr auto kernel =
        cuda::conv_weight_grad_mma<T, Idx, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::WM, Cfg::WN, Cfg::WK, kStages, kExact>;
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

// The weight-gradient kernel that choice::weight_grad_kernel names.
template <typename T, typename Idx>
at::Tensor weight_grad_by_width(const cuda::WeightGradArgs<T, Idx>& a, const at::Tensor& rel_ptr, bool deterministic,
                                const at::TensorOptions& opts, at::ScalarType out, cudaStream_t stream) {
  using C = choice::Config;
  choice::WeightGradProblem p;
  p.dtype = dtype_of<T>();
  p.allow_tf32 = at::globalContext().allowTF32CuBLAS();
  p.cin_g = a.cin_g;
  p.cout_g = a.cout_g;
  p.vec_x = a.vec_x;
  p.vec_g = a.vec_g;
  p.x_chunks = a.x_chunks;
  const C config = choice::weight_grad_kernel(p, current_device());
  switch (config) {
#define RELCONV_WEIGHT_GRAD(K, kPipelined, kExact)                                                             \
  case C::K:                                                                                                    \
    if constexpr (!kPipelined || (kExact ? std::is_same_v<T, float> : k16Bit<T> || std::is_same_v<T, float>)) { \
      return launch_weight_grad<T, Idx, TilesOf<C::K, T>, kStagesOf<C::K, T>, kPipelined, kExact>(               \
          a, rel_ptr, deterministic, opts, out, stream);                                                         \
    }                                                                                                           \
    break;
    RELCONV_WEIGHT_GRAD(kWeightGradMma16, true, false)
    RELCONV_WEIGHT_GRAD(kWeightGradMma32, true, false)
    RELCONV_WEIGHT_GRAD(kWeightGradMma64, true, false)
    RELCONV_WEIGHT_GRAD(kWeightGradMma128, true, false)
    RELCONV_WEIGHT_GRAD(kWeightGradExact16, true, true)
    RELCONV_WEIGHT_GRAD(kWeightGradExact32, true, true)
    RELCONV_WEIGHT_GRAD(kWeightGradExact64, true, true)
    RELCONV_WEIGHT_GRAD(kWeightGradExact128, true, true)
    RELCONV_WEIGHT_GRAD(kWeightGradSimt32, false, false)
    RELCONV_WEIGHT_GRAD(kWeightGradSimt64, false, false)
#undef RELCONV_WEIGHT_GRAD
    default: break;
  }
  no_launcher(config, "these");
}

}  // namespace

template <typename T, typename Idx>
void forward_pairs(const cuda::ConvForwardArgs<T, Idx>& a, const at::Tensor& rel_ptr, cudaStream_t stream) {
  forward_by_width<T, Idx>(a, rel_ptr, stream);
}

template <typename T, typename Idx>
bool forward_table(const cuda::ConvTableArgs<T, Idx>& a, bool allow_tf32, cudaStream_t stream) {
  return forward_table_by_width<T, Idx>(a, allow_tf32, stream);
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
