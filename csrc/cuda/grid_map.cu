// The grid conv map op (kernels in grid_map.cuh): output sites and neighbour table of a regular or
// transposed convolution on a bounded grid, as spconv's SparseConv / SparseConvTranspose layers
// place them (relconv.spconv). Built in torch ops, the map and the table the conv reads took about
// 90 launches per layer, a sort of every (input, kernel index) candidate and two host reads
// (OpenPCDet's VoxelBackBone8x, fp32 inference on an H200: 470 launches and 21 host waits against
// 98 and 9 with this op); here the candidates are deduplicated as bits over the output grid, which a
// scan ranks in order, or, where the grid is too large for its bits, in a hash set whose distinct
// sites are sorted; the one host read fetches their count together with the coordinate checks.
#include "common/error_message.h"
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <limits>
#include <thrust/iterator/transform_iterator.h>
#include <tuple>

#include "cuda/device_buffers.h"
#include "cuda/grid_map.cuh"
#include "cuda/kernel_launch.h"

namespace relconv {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

unsigned blocks_for(int64_t n) { return launch::blocks_for(n, cuda::kMapThreads, "relconv grid_conv_map"); }

// The key set's slots: a power of two above the candidate count, so that an empty slot always ends
// a probe.
int64_t power_of_two_above(int64_t n) {
  int64_t cap = 32;
  while (cap <= n) cap *= 2;
  return cap;
}

void check_axes(at::IntArrayRef values, const char* name, int64_t low) {
  RELCONV_CHECK_VALUE(values.size() == 3, name, " must have 3 entries, got ", values.size());
  for (const int64_t v : values) {
    RELCONV_CHECK_VALUE(v >= low && v <= kInt32Max, name, " entries must lie in [", low, ", 2^31), got ", values);
  }
}

// The most kernel indices along one axis by which one point reaches the other grid: the indices r
// with (c * scale + base + r * step) divisible by div depend only on c mod div.
int64_t reach_bound(const cuda::GridAxis& a, int64_t size) {
  if (a.div > 4096) return size;  // a coarse bound; such strides are not worth the loop
  int64_t most = 0;
  for (int64_t rho = 0; rho < a.div; ++rho) {
    int64_t hits = 0;
    for (int64_t r = 0; r < size; ++r) hits += ((rho * a.scale + a.base + r * a.step) % a.div + a.div) % a.div == 0;
    most = std::max(most, hits);
  }
  return std::min(most, a.limit);
}

void raise_grid_errors(int32_t bits, int64_t batch_size, at::IntArrayRef in_shape) {
  RELCONV_CHECK_VALUE(!(bits & (cuda::kErrOutsideGrid | cuda::kErrNegativeBatch)),
                      "coords: indices must lie inside spatial_shape ", in_shape, " with batch indices in [0, ",
                      batch_size, "); some row does not");
  RELCONV_CHECK_VALUE(!(bits & cuda::kErrDuplicate),
                      "coords contain duplicate (batch, index) rows; a sparse tensor holds each site once");
}

// What both ways of finding the output sites share: the input rows, their grid and the step to the
// output grid.
struct SiteSearch {
  const at::Tensor& c;
  int64_t n;
  cuda::GridBounds bounds;
  cuda::GridStep forward;
  cuda::SiteKeys keys;
  int64_t in_capacity, batch_size;
  at::IntArrayRef in_shape;
  cudaStream_t stream;
};

// The output sites (out [M, 4] sorted by key) and the input hash the table kernel reads (`slots`,
// inside `scratch`).
struct Sites {
  at::Tensor out, scratch;
  const int32_t* slots;
};

// The sites' count M and the inverted error word, adjacent at `words` (the one host read): raises for
// bad rows and for a table past int32 entries, returns M.
int64_t site_count(const int32_t* words, const SiteSearch& s) {
  const int32_t* host = read_device_words(words, 2, s.stream);
  raise_grid_errors(~host[1], s.batch_size, s.in_shape);
  const int64_t m = host[0];
  RELCONV_CHECK_VALUE(m * s.forward.volume <= kInt32Max, "the map has ", m, " output sites x ", s.forward.volume,
                      " kernel indices, more than an int32 table holds");
  return m;
}

// The sites as keys in a hash set, selected (CUB) and sorted (CUB radix sort over the key bits in use).
Sites sites_by_key_set(const SiteSearch& s, int64_t key_capacity, int64_t candidates, int64_t key_space) {
  // Bytes: words [count, inverted error word, 2 pad] | input hash slots | site key set | selected keys
  // | CUB's scratch. One 0xFF memset sets the words, the slots and the set.
  const int64_t at_slots = 16, at_set = at_slots + 4 * s.in_capacity, at_selected = at_set + 8 * key_capacity;
  const int64_t at_temp = (at_selected + 8 * candidates + 255) / 256 * 256;
  size_t temp_bytes = 0;
  const auto select = [&](void* temp, const unsigned long long* set, unsigned long long* out, int* count) {
    C10_CUDA_CHECK(cub::DeviceSelect::If(temp, temp_bytes, set, out, count, static_cast<int>(key_capacity),
                                         cuda::IsSiteKey{}, s.stream));
  };
  select(nullptr, nullptr, nullptr, nullptr);
  at::Tensor scratch = at::empty({at_temp + static_cast<int64_t>(temp_bytes)}, s.c.options().dtype(at::kByte));
  auto* base = scratch.mutable_data_ptr<uint8_t>();
  C10_CUDA_CHECK(cudaMemsetAsync(base, kAllOnes, at_selected, s.stream));
  auto* words = reinterpret_cast<int32_t*>(base);
  auto* slots = reinterpret_cast<int32_t*>(base + at_slots);
  auto* set = reinterpret_cast<unsigned long long*>(base + at_set);
  auto* selected = reinterpret_cast<unsigned long long*>(base + at_selected);
  cuda::grid_sites_kernel<<<blocks_for(s.n * s.forward.volume), cuda::kMapThreads, 0, s.stream>>>(
      s.c.const_data_ptr<int32_t>(), s.n, s.bounds, s.forward, slots, cuda::SlotLayout::of_capacity(s.in_capacity),
      s.keys, cuda::SiteKeySet{set, static_cast<uint32_t>(key_capacity - 1)}, words + 1);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  select(base + at_temp, set, selected, words);
  const int64_t m = site_count(words, s);
  at::Tensor out = at::empty({m, 4}, s.c.options());
  if (m == 0) return {out, scratch, slots};
  int end_bit = 1;
  while (end_bit < 63 && (int64_t{1} << end_bit) < key_space) ++end_bit;
  // Bytes: CUB's scratch | the sorted keys.
  size_t sort_bytes = 0;
  const auto sort = [&](void* temp, unsigned long long* sorted) {
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp, sort_bytes, selected, sorted, static_cast<int>(m), 0, end_bit,
                                                  s.stream));
  };
  sort(nullptr, nullptr);
  const int64_t at_sorted = (static_cast<int64_t>(sort_bytes) + 255) / 256 * 256;
  const at::Tensor sorting = at::empty({at_sorted + 8 * m}, s.c.options().dtype(at::kByte));
  auto* sorted = reinterpret_cast<unsigned long long*>(sorting.mutable_data_ptr<uint8_t>() + at_sorted);
  sort(sorting.mutable_data_ptr(), sorted);
  cuda::site_coords_kernel<<<blocks_for(m), cuda::kMapThreads, 0, s.stream>>>(sorted, m, s.keys,
                                                                              out.mutable_data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, scratch, slots};
}

// The sites as cleared bits over the key space (cuda::SiteBits), ranked by an inclusive scan of the
// words' site counts (CUB): the keys come out in order with no select and no sort, three launches and
// one memset where the key set takes two CUB calls of several launches and seven memsets each.
Sites sites_by_bits(const SiteSearch& s, int64_t key_space) {
  const int64_t words = (key_space + 31) / 32;
  RELCONV_CHECK(words <= kInt32Max, "relconv grid_conv_map: ", key_space, " grid keys is too many for a bitmap");
  // Bytes: ranks [words] | inverted error word | pad | input hash slots | site bits | CUB's scratch. The
  // last rank (the count) and the error word are adjacent for one read; one 0xFF memset sets the
  // error word, the slots and the bits.
  const int64_t at_error = 4 * words, at_slots = (at_error + 4 + 15) / 16 * 16, at_bits = at_slots + 4 * s.in_capacity;
  const int64_t at_temp = (at_bits + 4 * words + 255) / 256 * 256;
  const auto counts = thrust::make_transform_iterator(static_cast<const uint32_t*>(nullptr), cuda::SitesInWord{});
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, temp_bytes, counts, static_cast<int32_t*>(nullptr),
                                               static_cast<int>(words), s.stream));
  at::Tensor scratch = at::empty({at_temp + static_cast<int64_t>(temp_bytes)}, s.c.options().dtype(at::kByte));
  auto* base = scratch.mutable_data_ptr<uint8_t>();
  C10_CUDA_CHECK(cudaMemsetAsync(base + at_error, kAllOnes, at_temp - at_error, s.stream));
  auto* ranks = reinterpret_cast<int32_t*>(base);
  auto* slots = reinterpret_cast<int32_t*>(base + at_slots);
  auto* bits = reinterpret_cast<uint32_t*>(base + at_bits);
  cuda::grid_sites_kernel<<<blocks_for(s.n * s.forward.volume), cuda::kMapThreads, 0, s.stream>>>(
      s.c.const_data_ptr<int32_t>(), s.n, s.bounds, s.forward, slots, cuda::SlotLayout::of_capacity(s.in_capacity),
      s.keys, cuda::SiteBits{bits}, reinterpret_cast<int32_t*>(base + at_error));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(base + at_temp, temp_bytes,
                                               thrust::make_transform_iterator(static_cast<const uint32_t*>(bits),
                                                                               cuda::SitesInWord{}),
                                               ranks, static_cast<int>(words), s.stream));
  const int64_t m = site_count(ranks + words - 1, s);
  at::Tensor out = at::empty({m, 4}, s.c.options());
  if (m == 0) return {out, scratch, slots};
  cuda::site_coords_from_bits_kernel<<<blocks_for(words), cuda::kMapThreads, 0, s.stream>>>(
      bits, ranks, words, s.keys, out.mutable_data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, scratch, slots};
}

// (out_coords [M, 4] int32 sorted by (batch, d0, d1, d2), table [M, K] int32: the input row each
// output site reads through kernel index r, -1 none). One host sync.
std::tuple<at::Tensor, at::Tensor> grid_conv_map_cuda(const at::Tensor& coords, int64_t batch_size,
                                                      at::IntArrayRef in_shape, at::IntArrayRef out_shape,
                                                      at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                                      at::IntArrayRef padding, at::IntArrayRef dilation,
                                                      bool transposed) {
  RELCONV_CHECK_VALUE(coords.dim() == 2 && coords.size(1) == 4,
                      "coords must have shape [N, 4] = (batch, d0, d1, d2), got ", coords.sizes());
  RELCONV_CHECK_VALUE(coords.scalar_type() == at::kInt, "coords must be int32, got ", coords.scalar_type());
  RELCONV_CHECK_VALUE(coords.is_cuda(), "coords must be a CUDA tensor, got ", coords.device());
  RELCONV_CHECK_VALUE(batch_size >= 1 && batch_size <= kInt32Max, "batch_size must lie in [1, 2^31), got ",
                      batch_size);
  check_axes(in_shape, "in_shape", 1);
  check_axes(out_shape, "out_shape", 1);
  check_axes(kernel_size, "kernel_size", 1);
  check_axes(stride, "stride", 1);
  check_axes(padding, "padding", 0);
  check_axes(dilation, "dilation", 1);
  int64_t volume = 1, key_space = batch_size;
  cuda::GridStep forward{}, back{};
  cuda::SiteKeys keys{};
  for (int a = 0; a < 3; ++a) {
    const int64_t s = stride[a], p = padding[a], d = dilation[a];
    volume *= kernel_size[a];
    RELCONV_CHECK_VALUE(volume <= 4096, "kernel_size ", kernel_size, " has more than 4096 indices");
    key_space *= out_shape[a];
    RELCONV_CHECK_VALUE(key_space < (int64_t{1} << 62), "batch_size * prod(out_shape) must stay below 2^62, got ",
                        batch_size, " x ", out_shape);
    forward.axis[a] = transposed ? cuda::GridAxis{s, -p, d, 1, out_shape[a]} : cuda::GridAxis{1, p, -d, s, out_shape[a]};
    back.axis[a] = transposed ? cuda::GridAxis{1, p, -d, s, in_shape[a]} : cuda::GridAxis{s, -p, d, 1, in_shape[a]};
    forward.size[a] = back.size[a] = static_cast<int32_t>(kernel_size[a]);
    keys.extent[a] = out_shape[a];
  }
  forward.volume = back.volume = static_cast<int32_t>(volume);
  cuda::GridBounds bounds{batch_size, {in_shape[0], in_shape[1], in_shape[2]}};

  at::Tensor c = coords.contiguous();
  if (reinterpret_cast<uintptr_t>(c.const_data_ptr()) % 16 != 0) c = c.clone();
  const int64_t n = c.size(0);
  RELCONV_CHECK_VALUE(n * volume <= kInt32Max, "coords has ", n, " rows; with ", volume,
                      " kernel indices the map needs more than 2^31 - 1 entries");
  const c10::cuda::CUDAGuard guard(c.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (n == 0) return {at::empty({0, 4}, c.options()), at::empty({0, volume}, c.options())};

  int64_t per_input = 1;
  for (int a = 0; a < 3; ++a) per_input *= reach_bound(forward.axis[a], kernel_size[a]);
  const int64_t candidates = std::max<int64_t>(1, n * per_input);
  const int64_t in_capacity = cuda::SlotLayout::capacity_for(n), key_capacity = power_of_two_above(candidates);
  RELCONV_CHECK(key_capacity <= kInt32Max, "relconv grid_conv_map: ", candidates, " candidate sites is too many");
  const SiteSearch search{c, n, bounds, forward, keys, in_capacity, batch_size, in_shape, stream};
  // Bits over the output grid where they and their ranks (key_space / 4 bytes) take no more memory
  // than the key set (8 bytes a slot): most strided layers' grids.
  const Sites sites = key_space <= 32 * key_capacity ? sites_by_bits(search, key_space)
                                                     : sites_by_key_set(search, key_capacity, candidates, key_space);
  const int64_t m = sites.out.size(0);
  at::Tensor table = at::empty({m, volume}, c.options());
  if (m == 0) return {sites.out, table};
  cuda::grid_table_kernel<<<blocks_for(m * volume), cuda::kMapThreads, 0, stream>>>(
      cuda::HashView{c.const_data_ptr<int32_t>(), sites.slots, cuda::SlotLayout::of_capacity(in_capacity), n},
      sites.out.const_data_ptr<int32_t>(), m, back, table.mutable_data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {sites.out, table};
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CUDA, m) { m.impl("grid_conv_map", &grid_conv_map_cuda); }

}  // namespace relconv
