// CUDA wrappers of the neighbour-table ops (kernels in relation_tables.cuh): layouts of any
// relational map with unique slots, derived on the device without a host sync. relconv.ops.map_views
// calls them and caches their results on the map.
#include "common/error_message.h"
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <limits>
#include <tuple>

#include "cuda/device_buffers.h"
#include "cuda/kernel_launch.h"
#include "cuda/relation_tables.cuh"

namespace relconv {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return launch::blocks_for(n, kThreads, "relconv table ops"); }

// [num_in, R] table of the transposed map from the [num_out, R] table of an injective map.
at::Tensor transpose_neighbor_table_cuda(const at::Tensor& table, int64_t num_in) {
  RELCONV_CHECK_VALUE(table.dim() == 2, "table must be 2-D [num_out, K], got shape ", table.sizes());
  RELCONV_CHECK_VALUE(table.scalar_type() == at::kInt || table.scalar_type() == at::kLong,
                    "table must be int32 or int64, got ", table.scalar_type());
  RELCONV_CHECK_VALUE(table.is_cuda(), "table must be a CUDA tensor, got ", table.device());
  RELCONV_CHECK_VALUE(num_in >= 0, "num_in must be non-negative, got ", num_in);
  RELCONV_CHECK_VALUE(table.size(1) <= std::numeric_limits<int32_t>::max(), "table has too many columns");
  const c10::cuda::CUDAGuard guard(table.device());
  const at::Tensor t = table.contiguous();
  const int64_t num_out = t.size(0), volume = t.size(1);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor out = memset_tensor({num_in, volume}, t.options(), kAllOnes, stream);
  if (num_out * volume == 0) return out;
  const unsigned blocks = blocks_for(num_out * volume);
  if (t.scalar_type() == at::kInt) {
    cuda::transpose_table_kernel<int32_t><<<blocks, kThreads, 0, stream>>>(
        t.const_data_ptr<int32_t>(), num_out, static_cast<int32_t>(volume), out.mutable_data_ptr<int32_t>());
  } else {
    cuda::transpose_table_kernel<int64_t><<<blocks, kThreads, 0, stream>>>(
        t.const_data_ptr<int64_t>(), num_out, static_cast<int32_t>(volume), out.mutable_data_ptr<int64_t>());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// The pairs of a neighbour table [num_out, R] for the pair kernels, without a host sync: in_index
// and out_index have num_out * R entries (the most a table can hold), the first rel_ptr[R] of them
// the pairs in (relation, out) order and the rest -1. Every relconv kernel reads pairs only through
// rel_ptr, so the padding is never touched; its length is all the host needs for launch bounds.
std::tuple<at::Tensor, at::Tensor, at::Tensor> table_pairs_cuda(const at::Tensor& table) {
  RELCONV_CHECK_VALUE(table.dim() == 2, "table must have shape [num_out, R], got ", table.sizes());
  RELCONV_CHECK_VALUE(table.scalar_type() == at::kInt || table.scalar_type() == at::kLong,
                    "table must be int32 or int64, got ", table.scalar_type());
  RELCONV_CHECK_VALUE(table.is_cuda(), "table must be a CUDA tensor, got ", table.device());
  const int64_t n = table.size(0), r = table.size(1), capacity = n * r;
  RELCONV_CHECK_VALUE(table.scalar_type() == at::kLong || capacity <= std::numeric_limits<int32_t>::max(),
                    "an int32 table holds at most 2^31 - 1 entries, got ", n, " x ", r);
  const c10::cuda::CUDAGuard guard(table.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor t = table.contiguous();
  // table_pairs_kernel writes every entry of all three (no memsets: three per map of a training step).
  at::Tensor in_index = at::empty({capacity}, t.options());
  at::Tensor out_index = at::empty({capacity}, t.options());
  if (capacity == 0) {
    return {in_index, out_index, memset_tensor({r + 1}, t.options().dtype(at::kLong), 0, stream)};
  }
  at::Tensor rel_ptr = at::empty({r + 1}, t.options().dtype(at::kLong));
  at::Tensor positions = at::empty({capacity}, t.options());
  AT_DISPATCH_INDEX_TYPES(t.scalar_type(), "table_pairs", [&] {
    const unsigned blocks = blocks_for(capacity);
    cuda::table_hit_flags_kernel<index_t><<<blocks, kThreads, 0, stream>>>(
        t.const_data_ptr<index_t>(), n, r, positions.mutable_data_ptr<index_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    size_t temp_bytes = 0;
    index_t* pos = positions.mutable_data_ptr<index_t>();
    C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, temp_bytes, pos, pos, capacity, stream));
    at::Tensor temp = at::empty({static_cast<int64_t>(temp_bytes)}, t.options().dtype(at::kByte));
    C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp.mutable_data_ptr(), temp_bytes, pos, pos, capacity, stream));
    cuda::table_pairs_kernel<index_t><<<blocks, kThreads, 0, stream>>>(
        t.const_data_ptr<index_t>(), pos, n, r, in_index.mutable_data_ptr<index_t>(),
        out_index.mutable_data_ptr<index_t>(), rel_ptr.mutable_data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {in_index, out_index, rel_ptr};
}

// Rows of a neighbour table sorted by their occupied relations: the table_order of the
// output-stationary kernel. Keys in two passes (occupancy_keys_kernel, then ranked_gray_keys_kernel:
// masks with the rarest relations in the high bits, in Gray order), then a stable radix sort over
// only the key bits in use (4 passes for 27 relations). Integer counts and a stable sort make the
// order a pure function of the table; no host sync.
at::Tensor neighbor_table_order_cuda(const at::Tensor& table) {
  RELCONV_CHECK_VALUE(table.dim() == 2, "table must have shape [num_out, R], got ", table.sizes());
  RELCONV_CHECK_VALUE(table.scalar_type() == at::kInt || table.scalar_type() == at::kLong,
                    "table must be int32 or int64, got ", table.scalar_type());
  RELCONV_CHECK_VALUE(table.is_cuda(), "table must be a CUDA tensor, got ", table.device());
  const int64_t n = table.size(0), r = table.size(1);
  RELCONV_CHECK_VALUE(n <= std::numeric_limits<int32_t>::max(), "table has ", n, " rows; at most 2^31 - 1");
  const c10::cuda::CUDAGuard guard(table.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor t = table.contiguous();
  at::Tensor order = at::empty({n}, t.options());
  if (n == 0) return order;
  const auto keys = at::empty({2, n}, t.options().dtype(at::kInt));
  const auto counts = memset_tensor({cuda::kOrderKeyBits}, t.options().dtype(at::kInt), 0, stream);
  at::Tensor rows = at::empty({n}, t.options());
  const auto keyed = static_cast<int32_t>(std::min<int64_t>(r, cuda::kOrderKeyBits));
  const int end_bit = std::max(1, static_cast<int>(keyed));
  AT_DISPATCH_INDEX_TYPES(t.scalar_type(), "neighbor_table_order", [&] {
    cuda::occupancy_keys_kernel<index_t><<<blocks_for(n), kThreads, 0, stream>>>(
        t.const_data_ptr<index_t>(), n, r, keyed, keys[0].mutable_data_ptr<int32_t>(),
        rows.mutable_data_ptr<index_t>(), counts.mutable_data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    cuda::ranked_gray_keys_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        keys[0].mutable_data_ptr<int32_t>(), n, keyed, counts.const_data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    size_t temp_bytes = 0;
    const auto sort = [&](void* temp) {
      C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
          temp, temp_bytes, keys[0].const_data_ptr<int32_t>(), keys[1].mutable_data_ptr<int32_t>(),
          rows.const_data_ptr<index_t>(), order.mutable_data_ptr<index_t>(), static_cast<int>(n), 0, end_bit,
          stream));
    };
    sort(nullptr);
    at::Tensor temp = at::empty({static_cast<int64_t>(temp_bytes)}, t.options().dtype(at::kByte));
    sort(temp.mutable_data_ptr());
  });
  return order;
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CUDA, m) {
  m.impl("transpose_neighbor_table", &transpose_neighbor_table_cuda);
  m.impl("neighbor_table_order", &neighbor_table_order_cuda);
  m.impl("table_pairs", &table_pairs_cuda);
}

}  // namespace relconv
