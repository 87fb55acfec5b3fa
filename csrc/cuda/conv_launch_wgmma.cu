// Launcher of the Hopper wgmma table kernel (conv_forward_table_wgmma.cuh), in its own translation
// unit: only it includes CuTe.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/conv_forward_table_ws.cuh"
#include "cuda/conv_launch.h"
#include "cuda/kernel_launch.h"

namespace relconv::launch {
namespace {

__global__ void sm90a_build_probe(int* built) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *built = 1;
#else
  *built = 0;
#endif
}

// Whether this device runs the sm_90a code of this build: an sm_90 GPU and a build that compiled
// sm_90a (a build for other architectures would JIT the kernel from PTX without wgmma, leaving its
// body empty). A probe kernel answers once per process, its read the one host sync the choice ever
// costs; while a CUDA graph is being captured (no syncs allowed) before that, the answer is no.
bool wgmma_available() {
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  if (prop->major != 9 || prop->minor != 0) return false;
  static std::atomic<int> built{-1};  // unknown
  if (built.load() < 0) {
    if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) return false;
    at::Tensor flag = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA));
    sm90a_build_probe<<<1, 1, 0, c10::cuda::getCurrentCUDAStream()>>>(flag.mutable_data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    built.store(flag.item<int>());
  }
  return built.load() == 1;
}

template <typename T, int BM, int BN, int kStages, bool kWeightT>
void launch(const cuda::ConvTableArgs<T, int32_t>& a, cudaStream_t stream) {
  using Cfg = cuda::WgmmaTableConfig<T, BM, BN, kStages, kWeightT>;
  constexpr auto kernel = cuda::conv_forward_table_wgmma<T, BM, BN, kStages, kWeightT>;
  allow_dynamic_smem<kernel>(Cfg::kBytes);
  cuda::ConvTableArgs<T, int32_t> args = a;
  const int64_t row_tiles = (a.num_out + BM - 1) / BM;
  args.n_tiles = a.cout_g / BN;
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(int64_t{args.n_tiles} * a.groups));
  args.split = relation_split(int64_t{grid.x} * grid.y, a.num_relations);
  launch_split(kernel, grid, Cfg::kThreads, Cfg::kBytes, stream, args);
}

// The persistent kernel's work counters (draws, CTAs done drawing): a zeroed pair per (device,
// stream), which every launch leaves zeroed again (its last CTA resets them), so launches on a stream
// need no memset. Kernels on one stream run in order, so they never share the pair at once. While a
// CUDA graph is being captured the pair is made per launch instead (a captured fill zeroes it at
// each replay): a pair first made in a capture would be zeroed only when the graph replays.
// The caller holds the returned tensor until the kernel is queued (a per-launch pair is then freed
// stream-ordered, after the kernel).
at::Tensor work_counters(cudaStream_t stream) {
  const auto options = at::TensorOptions().dtype(at::kInt).device(at::kCUDA, c10::cuda::current_device());
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    return at::zeros({2}, options);
  }
  static std::mutex mutex;
  static auto* pairs = new std::map<std::pair<int, cudaStream_t>, at::Tensor>();  // never freed: no teardown order
  const std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& pair = (*pairs)[{c10::cuda::current_device(), stream}];
  if (!pair.defined()) pair = at::zeros({2}, options);  // on this stream, before the first launch
  return pair;
}

template <typename T, int BN, int kStages, bool kWeightT>
void launch_ws(const cuda::ConvTableArgs<T, int32_t>& a, cudaStream_t stream) {
  using Cfg = cuda::WsTableConfig<T, 128, BN, kStages, kWeightT>;
  constexpr auto kernel = cuda::conv_forward_table_ws<T, 128, BN, kStages, kWeightT>;
  allow_dynamic_smem<kernel>(Cfg::kBytes);
  cuda::ConvTableArgs<T, int32_t> args = a;
  args.n_tiles = a.cout_g / BN;
  args.split = 1;
  const int64_t work = (a.num_out + 127) / 128 * args.n_tiles * a.groups;
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto grid = static_cast<unsigned>(std::min(work, sms));
  const at::Tensor counters = work_counters(stream);
  kernel<<<grid, Cfg::kThreads, Cfg::kBytes, stream>>>(args, work, counters.mutable_data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

// Measured on an H100 (kernel us, cached subm 3^3 fp16, rank-and-Gray order; mma.sync 128 x 128
// kernel -> this one; .dev probes of session 4 in benchmarks/results/h100-2026-11-23/gpu_checks):
//   C256, 128 x 256 tiles, 3 stages: 64-beam scan (75k rows) 346 -> 286, real scan (28k) 194 -> 161;
//   C128, 128 x 128 tiles, 4 stages: 64-beam 131 -> 127, real 67 -> 60, but the 3-sweep scene (171k
//   rows) 228 -> 265, where the mma.sync kernel's two blocks per SM hide DRAM latency better.
// Both keep one wgmma in flight. Without that, with 2 stages at two blocks per SM, and with 256-row
// tiles (half the weight-slab traffic, one block per SM) the kernel was slower (129-157 us at C128).
// Tables from kTallTileRows rows keep the mma.sync kernel: the one measurement there lost.
// Deeper pipelines (session 9, us per call on 20k-75k rows; benchmarks/results/h100-2026-11-23/
// gpu_checks/session9_probes.txt): 32-wide C_in stages with 6 or 8 (C256) / 8 or 12 (C128) stages
// were 2-12% slower, 4 (C256) / 6 (C128) stages of 64 within noise of these. ncu at C256 (64-beam):
// tensor pipe 34% busy at 8 warps per SM and 0.43 eligible warps per scheduler: something other
// than the depth holds it back (not yet measured: the gathers' issue cost, the per-step barrier).
// Session 10 (same gpu_checks folder, session10_probes.txt), kernel us per call:
//   C64, 128 x 64 tiles, 3 stages, two CTAs per SM, against the mma.sync kernel: 64-beam 46.0 -> 42.5,
//   real scan 30.0 -> 28.7, 32-beam (21k rows) 28.4 -> 28.6; but 171k rows 94 -> 112 and 3.5M rows
//   1798 -> 2327 (there the mma.sync kernel's 128 x 64 tiles at two blocks per SM stay). 256-row
//   C64 tiles (2 or 4 warpgroups) lost everywhere but the 32-beam scan.
//   192-row tiles over three warpgroups: C128 64-beam 108 -> 95 but real scan 46 -> 64 (148 tiles,
//   about one wave) and 171k rows 198 -> 215; at C256 the 128-float accumulator spills (168
//   registers a thread at 384 threads): 214 -> 252. Not taken.
// Session 13 (gpu_checks/session13_probes.txt; queued us per cached subm 3^3 fp16 layer call, the
// single-role kernel -> the warp-specialized persistent one of conv_forward_table_ws.cuh, H200):
//   C128: 64-beam 104.3 -> 84.4, real scan 44.8 -> 45.5, 171k rows 192.9 -> 189.6;
//   C256: 64-beam 213.3 -> 203.3, real scan 128.3 -> 115.9;
//   C64 (128 x 64 tiles, 8 stages): 64-beam 40.3 -> 51.8, real scan 27.6 -> 27.3, 171k rows 87.9 ->
//   117, 3.5M rows 1686 -> 2279: at C64 two single-role CTAs per SM keep their place.
// Session 14 (gpu_checks/session14_probes.txt; same measure, H100): the persistent kernel draws its
// tiles from a counter instead of striding the grid, and gathers x rows by lane pairs that read whole
// sectors. Against the single-role kernel (under 100k rows) or the mma.sync one (above):
//   C128: 64-beam 105.8 -> 65.6, real scan 44.6 -> 43.6, 171k rows 198.0 -> 152.4, 3.5M 4099 -> 3251
//         (before the sector fix 5250: the persistent kernel had lost there);
//   C256: 64-beam 209.8 -> 151.8, real scan 127.6 -> 111.2, 171k rows 658.4 -> 355.1.
//   C64 with 8 stages now ties the single-role kernel (64-beam 39.9 / 40.0, real 27.7 / 27.6, 171k
//   91.9 / 91.3, 3.5M 1800 / 1801): not taken.
// Session 15 (gpu_checks/session15_probes.txt; same measure, H100): with its weight slabs read through
// L1 the mma.sync kernel (64 x 64 tiles) beats the single-role kernel at C_in = C_out = 64: 32-beam
// 25.4 -> 19.2, real scan 27.0 -> 25.4, 64-beam 38.8 -> 36.9, so C_out_g 64 leaves this file. A
// transposed weight view (the input gradient) leaves too, at the cost of a transpose launch: the two
// kernels round differently, and a result must not depend on the weight's memory layout.
// Session 16 (session16_probes.txt C; table entries by cp.async in all three), C64 mma.sync /
// single-role / persistent with BN 64: 32-beam 20.7 / 25.1 / 20.4, real scan 26.6 / 26.3 / 25.1,
// 64-beam 36.7 / 37.0 / 41.2, 171k 77.8 / 77.6 / 97.5, 3.5M 1580 / 1621 / 1966.
// So the persistent kernel takes C_out_g multiples of 128 wherever the split kernel would not split,
// at any table size; the single-role kernel the rest of the tables under kWgmmaMaxRows but C_out_g 64
// (above, the mma.sync kernel's CTAs per SM measured faster, see session 10).
constexpr int64_t kWgmmaMaxRows = 100000;

template <typename T, bool kWeightT>
bool launch_by_width(const cuda::ConvTableArgs<T, int32_t>& a, cudaStream_t stream) {
  if (a.cout_g % 128 == 0) {
    const int bn = a.cout_g % 256 == 0 ? 256 : 128;
    if (relation_split((a.num_out + 127) / 128 * (a.cout_g / bn) * a.groups, a.num_relations) == 1) {
      bn == 256 ? launch_ws<T, 256, 4, kWeightT>(a, stream) : launch_ws<T, 128, 6, kWeightT>(a, stream);
      return true;
    }
  }
  if (a.num_out >= kWgmmaMaxRows) return false;
  if (a.cout_g % 256 == 0) {
    launch<T, 128, 256, 3, kWeightT>(a, stream);
  } else if (a.cout_g % 128 == 0) {
    launch<T, 128, 128, 4, kWeightT>(a, stream);
  } else {
    launch<T, 128, 64, 3, kWeightT>(a, stream);
  }
  return true;
}

template <typename T>
bool forward_table_wgmma(const cuda::ConvTableArgs<T, int32_t>& a, cudaStream_t stream) {
  const int64_t ldx = int64_t{a.groups} * a.cin_g;
  if (a.cin_g % 64 != 0 || a.cout_g % 64 != 0 || !a.vec_x || !a.vec_w || !a.vec_out2 ||
      ldx > std::numeric_limits<int32_t>::max() || int64_t{a.cout_g / 64} * a.groups > 65535 || !wgmma_available()) {
    return false;
  }
  if (a.cout_g == 64) return false;  // the mma.sync kernel is faster (session 15 above)
  return a.weight_t ? launch_by_width<T, true>(a, stream) : launch_by_width<T, false>(a, stream);
}

template bool forward_table_wgmma<__half>(const cuda::ConvTableArgs<__half, int32_t>&, cudaStream_t);
template bool forward_table_wgmma<__nv_bfloat16>(const cuda::ConvTableArgs<__nv_bfloat16, int32_t>&, cudaStream_t);

}  // namespace relconv::launch
