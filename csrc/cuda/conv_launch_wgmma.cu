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

template <typename T, int BM, int BN, int kStages, bool kWeightT>
void launch(const cuda::ConvTableArgs<T, int32_t>& a, int split, cudaStream_t stream) {
  using Cfg = cuda::WgmmaTableConfig<T, BM, BN, kStages, kWeightT>;
  constexpr auto kernel = cuda::conv_forward_table_wgmma<T, BM, BN, kStages, kWeightT>;
  allow_dynamic_smem<kernel>(Cfg::kBytes);
  cuda::ConvTableArgs<T, int32_t> args = a;
  const int64_t row_tiles = (a.num_out + BM - 1) / BM;
  args.n_tiles = a.cout_g / BN;
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(int64_t{args.n_tiles} * a.groups));
  args.split = split;
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

template <typename T, int BN, int kStages, bool kWeightT, bool kByPosition>
void launch_ws_kernel(const cuda::ConvTableArgs<T, int32_t>& a, cudaStream_t stream) {
  using Cfg = cuda::WsTableConfig<T, 128, BN, kStages, kWeightT>;
  constexpr auto kernel = cuda::conv_forward_table_ws<T, 128, BN, kStages, kWeightT, kByPosition>;
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

template <typename T, int BN, int kStages, bool kWeightT>
void launch_ws(const cuda::ConvTableArgs<T, int32_t>& a, cudaStream_t stream) {
  if (a.rows_sorted && a.order != nullptr) {
    launch_ws_kernel<T, BN, kStages, kWeightT, true>(a, stream);
  } else {
    launch_ws_kernel<T, BN, kStages, kWeightT, false>(a, stream);
  }
}

template <typename T, bool kWeightT>
bool launch_config(const cuda::ConvTableArgs<T, int32_t>& a, const choice::TableChoice& c, cudaStream_t stream) {
  using C = choice::Config;
  constexpr auto t = [](C k) { return choice::tiles(k, sizeof(T)); };
  switch (c.config) {
    case C::kWgmmaPersistent256:
      launch_ws<T, t(C::kWgmmaPersistent256).bn, t(C::kWgmmaPersistent256).stages, kWeightT>(a, stream);
      return true;
    case C::kWgmmaPersistent128:
      launch_ws<T, t(C::kWgmmaPersistent128).bn, t(C::kWgmmaPersistent128).stages, kWeightT>(a, stream);
      return true;
    case C::kWgmma256:
      launch<T, t(C::kWgmma256).bm, t(C::kWgmma256).bn, t(C::kWgmma256).stages, kWeightT>(a, c.split, stream);
      return true;
    case C::kWgmma128:
      launch<T, t(C::kWgmma128).bm, t(C::kWgmma128).bn, t(C::kWgmma128).stages, kWeightT>(a, c.split, stream);
      return true;
    case C::kWgmma64:
      launch<T, t(C::kWgmma64).bm, t(C::kWgmma64).bn, t(C::kWgmma64).stages, kWeightT>(a, c.split, stream);
      return true;
    default: return false;
  }
}

}  // namespace

// Whether this device runs the sm_90a code of this build: an sm_90 GPU and a build that compiled
// sm_90a (a build for other architectures would JIT the kernel from PTX without wgmma, leaving its
// body empty). A probe kernel answers once per process, its read the one host sync the choice ever
// costs; while a CUDA graph is being captured (no syncs allowed) before that, the answer is no.
bool wgmma_built() {
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

template <typename T>
bool forward_table_wgmma(const cuda::ConvTableArgs<T, int32_t>& a, const choice::TableChoice& c, cudaStream_t stream) {
  return c.reads_weight_t ? launch_config<T, true>(a, c, stream) : launch_config<T, false>(a, c, stream);
}

template bool forward_table_wgmma<__half>(const cuda::ConvTableArgs<__half, int32_t>&, const choice::TableChoice&,
                                           cudaStream_t);
template bool forward_table_wgmma<__nv_bfloat16>(const cuda::ConvTableArgs<__nv_bfloat16, int32_t>&,
                                                  const choice::TableChoice&, cudaStream_t);

}  // namespace relconv::launch
