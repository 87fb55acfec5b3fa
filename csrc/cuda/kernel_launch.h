// Host-side launch helpers shared by the conv launchers (conv_launch.cuh, conv_launch_wgmma.cu) and
// the map builders: the grid of a one-item-a-thread kernel, the dynamic shared memory opt-in, and
// the cluster launch that groups the CTAs of a table kernel's relation split (relation_split_sum in
// conv_forward_table.cuh; common/kernel_choice.h sets it).
#pragma once

#include "common/error_message.h"
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

namespace relconv::launch {

// Blocks of `threads` threads covering `n` items, one item a thread; `op` names the caller in the
// error raised past a grid's 2^31 - 1 blocks.
inline unsigned blocks_for(int64_t n, int threads, const char* op) {
  const int64_t b = (n + threads - 1) / threads;
  RELCONV_CHECK(b <= std::numeric_limits<int32_t>::max(), op, ": ", n, " threads is too many");
  return static_cast<unsigned>(b);
}

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

// Blocks of `Kernel` (`threads` threads, `smem_bytes` of dynamic shared memory) resident on the
// current device at once: the most a cooperative launch may have. The occupancy query runs once per
// process and kernel.
template <auto Kernel>
int64_t resident_blocks(int threads, int smem_bytes) {
  static const int per_sm = [&] {
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Kernel, threads, smem_bytes));
    return blocks;
  }();
  return int64_t{per_sm} * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
}

// Whether a cooperative launch (grid-wide barriers) may run now: the device supports it and no CUDA
// graph is being captured (the split kernels are what a graph records).
inline bool cooperative_ok() {
  return at::cuda::getCurrentDeviceProperties()->cooperativeLaunch &&
         c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
}

// Launches a table kernel over `grid` row tiles (x) with a.split CTAs per tile, consecutive in x and
// one cluster each; a plain launch without a split.
template <typename Args>
void launch_split(void (*kernel)(Args), dim3 grid, int threads, int smem_bytes, cudaStream_t stream, const Args& a) {
  if (a.split == 1) {
    kernel<<<grid, threads, smem_bytes, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  RELCONV_CHECK(int64_t{grid.x} * a.split <= std::numeric_limits<int32_t>::max(), "relconv: too many row tiles");
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid.x * a.split, grid.y, grid.z);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = a.split;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a));
}

}  // namespace relconv::launch
