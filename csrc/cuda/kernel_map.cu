// CUDA launch wrappers of the kernel-map builders (kernels in kernel_map_hash.cuh and
// kernel_map_query.cuh). Only relconv_strided_coords reads device memory on the host: the number of
// coarse sites sizes its output, and the error words of the same call ride along in that one copy.
#include "common/error_message.h"
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/record_function.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cub/device/device_select.cuh>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/device_buffers.h"
#include "cuda/kernel_launch.h"
#include "cuda/kernel_map_fused.cuh"
#include "cuda/kernel_map_hash.cuh"
#include "cuda/kernel_map_query.cuh"

namespace relconv {
namespace {

// The hash table's slots are int32 row indices at most half full.
constexpr int64_t kMaxHashRows = int64_t{1} << 30;

unsigned blocks_for(int64_t n) { return launch::blocks_for(n, cuda::kMapThreads, "relconv kernel maps"); }

// Coordinates as the kernels read them: [N, 4] int32, contiguous, rows 16-byte aligned.
at::Tensor row_major_coords(const at::Tensor& coords, const char* name) {
  RELCONV_CHECK_VALUE(coords.dim() == 2 && coords.size(1) == 4, name,
                    " must have shape [N, 4] = (batch, x, y, z), got ", coords.sizes());
  RELCONV_CHECK_VALUE(coords.scalar_type() == at::kInt, name, " must be int32, got ", coords.scalar_type());
  RELCONV_CHECK_VALUE(coords.is_cuda(), name, " must be a CUDA tensor, got ", coords.device());
  RELCONV_CHECK_VALUE(coords.size(0) <= kMaxHashRows, name, " has ", coords.size(0),
                    " rows; CUDA kernel maps support at most 2^30");
  at::Tensor c = coords.contiguous();
  if (reinterpret_cast<uintptr_t>(c.const_data_ptr()) % 16 != 0) c = c.clone();
  return c;
}

cuda::HashView view(const at::Tensor& coords, const at::Tensor& slots) {
  return cuda::HashView{coords.const_data_ptr<int32_t>(), slots.const_data_ptr<int32_t>(),
                        cuda::SlotLayout::of_capacity(slots.numel()), coords.size(0)};
}

at::Tensor check_slots(const at::Tensor& slots, const at::Tensor& coords) {
  RELCONV_CHECK_VALUE(slots.dim() == 1 && slots.scalar_type() == at::kInt && slots.numel() >= 2 &&
                        (slots.numel() & (slots.numel() - 1)) == 0,
                    "slots must be the int32 power-of-two table from relconv::coord_hash, got ",
                    slots.scalar_type(), " of shape ", slots.sizes());
  RELCONV_CHECK_VALUE(slots.device() == coords.device(), "slots is on ", slots.device(), " but coords on ",
                    coords.device());
  RELCONV_CHECK_VALUE(slots.numel() > coords.size(0), "slots has ", slots.numel(), " entries for ",
                    coords.size(0), " coordinate rows; it was built for other coordinates");
  return slots.contiguous();
}

// bits: kErr* flags (the inverse of a device error word).
void raise_coord_errors(int32_t bits) {
  RELCONV_CHECK_VALUE(!(bits & cuda::kErrNegativeBatch), "coords batch indices (column 0) must be non-negative");
  RELCONV_CHECK_VALUE(!(bits & cuda::kErrDuplicate),
                    "coords contain duplicate (batch, x, y, z) rows; merge them first with "
                    "VoxelTensor.coalesce() or voxelize()");
  RELCONV_CHECK_VALUE(!(bits & cuda::kErrOverflow),
                    "coords: a strided output coordinate (rounded down to the stride) leaves the int32 range");
}

void check_error_word(const at::Tensor& error, const at::Tensor& coords) {
  RELCONV_CHECK_VALUE(error.numel() == 1 && error.scalar_type() == at::kInt && error.device() == coords.device(),
                    "input_error must be the int32 [1] error word of relconv::coord_hash on ", coords.device());
}

struct HostWords {
  int32_t count, error;
};

// A count and an inverted error word (adjacent at `device`).
HostWords read_words(const int32_t* device, cudaStream_t stream) {
  const int32_t* words = read_device_words(device, 2, stream);
  return HostWords{words[0], words[1]};
}

// Error words published by the kernels for the host (WordSlot, kernel_map_fused.cuh): a check
// waits for the hash insert alone, by polling pinned memory, with no copy, event or stream sync of
// its own; the map's table kernels keep the GPU busy meanwhile. Waiting for the whole stream left
// the GPU idle while the host queued the conv after the sync (H100, fresh subm 3^3 C64 fp16 on 3.5M
// voxels: about 95 us per call); a copy and an event per map cost two host API calls of their own. Tickets take the slots of a ring per device in turn. A slot is handed
// to a new ticket only once its previous ticket's word has landed, so a slot holds one pending
// kernel at a time; a ticket whose slot a newer one has taken falls back to reading the device word.
class PublishedWords {
 public:
  // The slot of a new ticket on the current device; {nullptr, -1} while a graph is captured. The
  // caller launches the publishing kernel on `stream`, or calls abandon(ticket) if it cannot.
  std::pair<cuda::WordSlot, int64_t> reserve(cudaStream_t stream) {
    if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
      return {cuda::WordSlot{nullptr, 0}, -1};
    }
    const std::lock_guard<std::mutex> lock(mutex_);
    Ring& ring = ring_of(c10::cuda::current_device());
    const int64_t ticket = ring.next++;
    const auto slot = static_cast<int>(ticket % kSlots);
    if (ring.pending[slot] >= 0) await(ring, slot);  // the ring came round to a word nobody read
    ring.pending[slot] = ticket;
    ring.streams[slot] = stream;
    return {cuda::WordSlot{ring.words + slot, static_cast<uint32_t>(ticket)}, ticket};
  }

  // A reserved ticket whose kernel was never queued.
  void abandon(int64_t ticket) {
    if (ticket < 0) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    Ring& ring = ring_of(c10::cuda::current_device());
    const auto slot = static_cast<int>(ticket % kSlots);
    if (ring.pending[slot] == ticket) ring.pending[slot] = -1;
  }

  // The word of `ticket` once published (the current device's ring); nullopt for -1, a ticket
  // already read, or one whose slot went to a newer ticket. The lock stays held through the wait,
  // which ends with the hash insert the word follows.
  std::optional<int32_t> wait(int64_t ticket) {
    if (ticket < 0) return std::nullopt;
    const std::lock_guard<std::mutex> lock(mutex_);
    Ring& ring = ring_of(c10::cuda::current_device());
    const auto slot = static_cast<int>(ticket % kSlots);
    if (ring.pending[slot] != ticket) return std::nullopt;
    return await(ring, slot);
  }

 private:
  static constexpr int kSlots = 64;
  struct Ring {
    unsigned long long* words = nullptr;  // [kSlots] pinned, mapped: (ticket << 32 | word)
    int64_t pending[kSlots];              // the ticket whose kernel writes each slot, -1 none
    cudaStream_t streams[kSlots];         // the stream it was queued on
    int64_t next = 1;                     // the slots start at 0: no ticket 0 to mistake for a word
  };

  // Polls the slot until its pending ticket's word lands; releases the slot. A failed kernel never
  // publishes: every few thousand polls the ticket's stream is asked for errors, and a stream that
  // drained without the word (impossible unless the kernel did not run) raises instead of hanging.
  static int32_t await(Ring& ring, int slot) {
    // Named for profilers: the harness counts it as the host synchronisation it is
    // (benchmarks/harness/instrument.py), though it makes no CUDA synchronisation call.
    RECORD_FUNCTION("relconv::wait_published_word", std::vector<c10::IValue>());
    const auto want = static_cast<uint32_t>(ring.pending[slot]);
    const volatile unsigned long long* word = ring.words + slot;
    for (uint64_t polls = 1;; ++polls) {
      const unsigned long long v = *word;
      if (static_cast<uint32_t>(v >> 32) == want) {
        ring.pending[slot] = -1;
        return static_cast<int32_t>(static_cast<uint32_t>(v));
      }
      if (polls % 4096 == 0) {
        const cudaError_t state = cudaStreamQuery(ring.streams[slot]);
        if (state == cudaErrorNotReady) {
          (void)cudaGetLastError();  // not an error: clear it, as aten's CUDAEvent::query does
        } else {
          C10_CUDA_CHECK(state);
          RELCONV_CHECK(static_cast<uint32_t>(*word >> 32) == want,
                      "relconv: a coordinate check's error word was never published");
        }
      }
    }
  }

  Ring& ring_of(int device) {
    Ring& ring = rings_[device];
    if (ring.words == nullptr) {  // set last: a failed setup is retried whole
      for (int i = 0; i < kSlots; ++i) ring.pending[i] = -1;
      void* p = nullptr;
      C10_CUDA_CHECK(cudaHostAlloc(&p, kSlots * sizeof(unsigned long long), cudaHostAllocMapped | cudaHostAllocPortable));
      std::memset(p, 0, kSlots * sizeof(unsigned long long));
      void* device_view = nullptr;
      C10_CUDA_CHECK(cudaHostGetDevicePointer(&device_view, p, 0));
      RELCONV_CHECK(device_view == p, "relconv: pinned host memory needs unified addressing");
      ring.words = static_cast<unsigned long long*>(p);
    }
    return ring;
  }
  std::mutex mutex_;
  std::map<int, Ring> rings_;
};

PublishedWords& published_words() {
  static auto* words = new PublishedWords();  // never freed: no teardown order against the CUDA context
  return *words;
}

// Raises for the problems a coordinate hash's error word records: the word published for `ticket`
// when that is still held (PublishedWords), else the device word read through the pinned buffer
// (one host sync; aten's item() costs several ops more of host time).
void raise_word_errors(const at::Tensor& error, int64_t ticket, cudaStream_t stream) {
  if (const std::optional<int32_t> word = published_words().wait(ticket)) return raise_coord_errors(~*word);
  raise_coord_errors(~read_device_words(error.const_data_ptr<int32_t>(), 1, stream)[0]);
}

// Inserts the rows of `c` into `capacity` slots and the error word, both preset to all ones.
void insert_rows(const at::Tensor& c, int32_t* slots, int64_t capacity, int32_t* error, cudaStream_t stream) {
  static_assert(cuda::kEmptySlot == -1, "empty slots are set bytewise to 0xFF");
  const int64_t n = c.size(0);
  if (n == 0) return;
  cuda::hash_insert_rows<<<blocks_for(n), cuda::kMapThreads, 0, stream>>>(
      c.const_data_ptr<int32_t>(), n, slots, cuda::SlotLayout::of_capacity(capacity), error);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Hash table over the rows of `c` (as row_major_coords returns them) plus an int32 [1] error word
// (kErr* bits, inverted: see kernel_map_hash.cuh); no host synchronisation. Both live in one buffer
// set by one memset.
std::tuple<at::Tensor, at::Tensor> hash_rows(const at::Tensor& c, cudaStream_t stream) {
  const int64_t capacity = cuda::SlotLayout::capacity_for(c.size(0));
  const at::Tensor buffer = memset_tensor({capacity + 1}, c.options(), kAllOnes, stream);
  at::Tensor slots = buffer.narrow(0, 0, capacity);
  at::Tensor error = buffer.narrow(0, capacity, 1);
  insert_rows(c, slots.mutable_data_ptr<int32_t>(), capacity, error.mutable_data_ptr<int32_t>(), stream);
  return {slots, error};
}

std::tuple<at::Tensor, at::Tensor> coord_hash_cuda(const at::Tensor& coords) {
  const at::Tensor c = row_major_coords(coords, "coords");
  const c10::cuda::CUDAGuard guard(c.device());
  return hash_rows(c, c10::cuda::getCurrentCUDAStream());
}

cuda::KernelGeometry geometry(at::IntArrayRef kernel_size, at::IntArrayRef step) {
  RELCONV_CHECK_VALUE(kernel_size.size() == 3, "kernel_size must have 3 entries, got ", kernel_size.size());
  RELCONV_CHECK_VALUE(step.size() == 3, "step must have 3 entries, got ", step.size());
  cuda::KernelGeometry g{};
  int64_t volume = 1;
  for (int a = 0; a < 3; ++a) {
    RELCONV_CHECK_VALUE(kernel_size[a] >= 1 && kernel_size[a] <= 1024, "kernel_size must lie in [1, 1024], got ",
                      kernel_size);
    RELCONV_CHECK_VALUE(step[a] >= 1 && step[a] <= std::numeric_limits<int32_t>::max(),
                      "step (dilation * tensor stride) must lie in [1, 2^31), got ", step);
    g.size[a] = static_cast<int32_t>(kernel_size[a]);
    g.step[a] = step[a];
    volume *= kernel_size[a];
  }
  RELCONV_CHECK_VALUE(volume <= std::numeric_limits<int32_t>::max(), "kernel volume ", volume, " is too large");
  g.volume = static_cast<int32_t>(volume);
  return g;
}

// The 3^3 kernel, whose table kernels are specialised (kCube = 3 in kernel_map_query.cuh).
bool is_cube3(const cuda::KernelGeometry& g) { return g.size[0] == 3 && g.size[1] == 3 && g.size[2] == 3; }

// A submanifold map (the same coordinates on both sides) of an odd kernel is symmetric: half the
// queries fill the table (submanifold_table_kernel), over a -1 fill.
bool symmetric_table(bool same_coords, const cuda::KernelGeometry& g) {
  return same_coords && (g.size[0] & g.size[1] & g.size[2] & 1);
}

// Launches the neighbour table's kernel into `table` [M, K], preset to -1 when `symmetric`.
void fill_table(const at::Tensor& ci, const at::Tensor& s, const at::Tensor& co, bool symmetric,
                const cuda::KernelGeometry& g, at::Tensor& table, cudaStream_t stream) {
  const int64_t m = co.size(0);
  if (m == 0) return;
  AT_DISPATCH_INDEX_TYPES(table.scalar_type(), "kernel_map_table", [&] {
    if (symmetric) {
      const int64_t threads = m * (g.volume / 2 + 1);
      const bool cube3 = is_cube3(g) && threads <= INT32_MAX;
      const auto kernel = cube3 ? cuda::submanifold_table_kernel<index_t, 3> : cuda::submanifold_table_kernel<index_t, 0>;
      kernel<<<blocks_for(threads), cuda::kMapThreads, 0, stream>>>(view(ci, s), m, g, table.mutable_data_ptr<index_t>());
    } else {
      cuda::neighbor_table_kernel<index_t><<<blocks_for(m * g.volume), cuda::kMapThreads, 0, stream>>>(
          view(ci, s), co.const_data_ptr<int32_t>(), m, g, table.mutable_data_ptr<index_t>());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// An [m, K] table of `dtype` for fill_table, preset to -1 when `symmetric`.
at::Tensor new_table(const at::Tensor& ci, int64_t m, const cuda::KernelGeometry& g, bool symmetric,
                     at::ScalarType dtype, cudaStream_t stream) {
  const auto options = ci.options().dtype(dtype);
  return symmetric ? memset_tensor({m, g.volume}, options, kAllOnes, stream) : at::empty({m, g.volume}, options);
}

// The neighbour table (the arguments checked by kernel_map_table_cuda).
at::Tensor table_kernel(const at::Tensor& ci, const at::Tensor& s, const at::Tensor& co, bool same_coords,
                        const cuda::KernelGeometry& g, at::ScalarType dtype) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool symmetric = symmetric_table(same_coords, g);
  at::Tensor table = new_table(ci, co.size(0), g, symmetric, dtype, stream);
  fill_table(ci, s, co, symmetric, g, table, stream);
  return table;
}

// [M, K] table: input row (of `in_coords`, through its hash `slots`) at out_coords[m] + offset_k * step.
at::Tensor kernel_map_table_cuda(const at::Tensor& in_coords, const at::Tensor& slots, const at::Tensor& out_coords,
                                 at::IntArrayRef kernel_size, at::IntArrayRef step, at::ScalarType dtype) {
  const at::Tensor ci = row_major_coords(in_coords, "in_coords");
  const at::Tensor co = row_major_coords(out_coords, "out_coords");
  RELCONV_CHECK_VALUE(co.device() == ci.device(), "out_coords is on ", co.device(), " but in_coords on ",
                    ci.device());
  const at::Tensor s = check_slots(slots, ci);
  RELCONV_CHECK_VALUE(dtype == at::kInt || dtype == at::kLong, "dtype must be int32 or int64, got ", dtype);
  const cuda::KernelGeometry g = geometry(kernel_size, step);
  const c10::cuda::CUDAGuard guard(ci.device());
  return table_kernel(ci, s, co, in_coords.is_same(out_coords), g, dtype);
}

void check_out_step(at::IntArrayRef step) {
  RELCONV_CHECK_VALUE(step.size() == 3, "step must have 3 entries, got ", step.size());
  for (int a = 0; a < 3; ++a) {
    RELCONV_CHECK_VALUE(step[a] >= 1 && step[a] <= std::numeric_limits<int32_t>::max(),
                      "step (stride * tensor stride) must lie in [1, 2^31), got ", step);
  }
}

// Unique coarse sites floor(p / step) * step of `c` (as row_major_coords returns them), in order of
// first occurrence. The one host read fetches the site count together with the error word: the
// coarse overflow bit and, when given, the error word of the input's own hash (`input_error`), so
// validating a new input costs nothing more; raises on bad coordinates. Every scratch array lives in
// one allocation, and only the status words and the hash slots are set (one memset): on the H100
// host an allocation, a memset or a launch costs 4 to 10 us of host time, several times the GPU work
// of a scan's coarsening.
at::Tensor coarse_sites(const at::Tensor& c, at::IntArrayRef step, const int32_t* input_error, cudaStream_t stream) {
  const int64_t n = c.size(0);
  // int32 layout: status [count, inverted error word, 2 pad] | slots | coarse [n, 4] | representative
  // [n] | selected rows [n] | CUB's scratch (256-byte aligned). Offsets keep the rows 16-byte aligned.
  const int64_t capacity = cuda::SlotLayout::capacity_for(n);
  const int64_t at_slots = 4, at_coarse = at_slots + capacity, at_rep = at_coarse + 4 * n, at_rows = at_rep + n;
  const int64_t at_temp = (at_rows + n + 63) / 64 * 64;
  size_t temp_bytes = 0;
  const auto select = [&](void* temp, const int32_t* in, int32_t* selected, int32_t* count) {
    C10_CUDA_CHECK(cub::DeviceSelect::If(temp, temp_bytes, in, selected, count, static_cast<int>(n),
                                         cuda::IsNonNegative{}, stream));
  };
  if (n > 0) select(nullptr, nullptr, nullptr, nullptr);
  const at::Tensor scratch = at::empty({at_temp + static_cast<int64_t>((temp_bytes + 3) / 4)}, c.options());
  int32_t* base = scratch.mutable_data_ptr<int32_t>();
  C10_CUDA_CHECK(cudaMemsetAsync(base, kAllOnes, at_coarse * sizeof(int32_t), stream));
  if (n > 0) {
    const unsigned blocks = blocks_for(n);
    cuda::coarse_coords_kernel<<<blocks, cuda::kMapThreads, 0, stream>>>(
        c.const_data_ptr<int32_t>(), n, step[0], step[1], step[2], base + at_coarse, base + 1, input_error);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const cuda::SlotLayout layout = cuda::SlotLayout::of_capacity(capacity);
    cuda::hash_insert_min_rows<<<blocks, cuda::kMapThreads, 0, stream>>>(base + at_coarse, n, base + at_slots,
                                                                         layout);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    cuda::site_representatives_kernel<<<blocks, cuda::kMapThreads, 0, stream>>>(
        cuda::HashView{base + at_coarse, base + at_slots, layout, n}, n, base + at_rep);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // Stable select: kept rows stay in increasing order, i.e. sites in order of first occurrence.
    select(base + at_temp, base + at_rep, base + at_rows, base);
  }
  const HostWords h = read_words(base, stream);
  raise_coord_errors(~h.error);
  const int64_t m = n > 0 ? h.count : 0;
  at::Tensor out = at::empty({m, 4}, c.options());
  if (m > 0) {
    cuda::gather_rows_kernel<<<blocks_for(m), cuda::kMapThreads, 0, stream>>>(base + at_coarse, base + at_rows, m,
                                                                              out.mutable_data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

at::Tensor strided_coords_cuda(const at::Tensor& coords, at::IntArrayRef step,
                               const std::optional<at::Tensor>& input_error) {
  const at::Tensor c = row_major_coords(coords, "coords");
  check_out_step(step);
  if (input_error.has_value()) check_error_word(*input_error, c);
  const c10::cuda::CUDAGuard guard(c.device());
  return coarse_sites(c, step, input_error.has_value() ? input_error->const_data_ptr<int32_t>() : nullptr,
                      c10::cuda::getCurrentCUDAStream());
}

// A strided map onto new coarse sites from a coordinate set with no hash yet, in one call instead of
// three (coord_hash, strided_coords, kernel_map_table): an op call costs host time of its own, and a
// fresh down 2^3 C64 fp16 layer on an H100 queues in 104 instead of 119 us per map (kitti-real,
// python -m benchmarks.run --suite voxel). Hashes `in_coords`, coarsens them to `out_step` (as strided_coords; with
// `check` its one sync also reads the new hash's error word; without, the caller vouches for the rows)
// and builds the sites' table, in int32 while the sizes allow (relconv.core.index_dtype_for's rule),
// else int64. Returns (slots, out_coords, table).
std::tuple<at::Tensor, at::Tensor, at::Tensor> hashed_strided_table_cuda(
    const at::Tensor& in_coords, at::IntArrayRef kernel_size, at::IntArrayRef step, at::IntArrayRef out_step,
    bool check) {
  const at::Tensor ci = row_major_coords(in_coords, "in_coords");
  const cuda::KernelGeometry g = geometry(kernel_size, step);
  check_out_step(out_step);
  const c10::cuda::CUDAGuard guard(ci.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto [slots, error] = hash_rows(ci, stream);
  at::Tensor co = coarse_sites(ci, out_step, check ? error.const_data_ptr<int32_t>() : nullptr, stream);
  const int64_t n = ci.size(0), m = co.size(0);
  const bool narrow = std::max({n, m, m * g.volume}) <= std::numeric_limits<int32_t>::max();
  at::Tensor table = table_kernel(ci, slots, co, /*same_coords=*/false, g, narrow ? at::kInt : at::kLong);
  return {slots, co, table};
}

// Rows up to which a one-buffer submanifold map of a symmetric kernel is one cooperative launch
// (fused_submanifold_map) instead of a memset and two kernels. Past it the split kernels' own
// parallelism and memset bandwidth matter more than the launches they cost.
constexpr int64_t kFusedMapRows = int64_t{1} << 18;

// Whether fused_submanifold_map builds a map of n rows: a one-buffer int32 table of a symmetric
// kernel, small, and a cooperative launch possible now (launch::cooperative_ok).
bool fused_map(int64_t n, const cuda::KernelGeometry& g, bool one_buffer_int32) {
  return one_buffer_int32 && n > 0 && n <= kFusedMapRows && symmetric_table(true, g) && launch::cooperative_ok();
}

void launch_fused_map(cuda::FusedMapArgs a, cudaStream_t stream) {
  const bool cube3 = is_cube3(a.g);
  const int64_t work = std::max(a.n * cuda::submanifold_queries(a.g.volume), a.fill_words / 4);
  const int64_t resident = cube3 ? launch::resident_blocks<cuda::fused_submanifold_map<3>>(cuda::kMapThreads, 0)
                                 : launch::resident_blocks<cuda::fused_submanifold_map<0>>(cuda::kMapThreads, 0);
  const int64_t blocks = std::min<int64_t>((work + cuda::kMapThreads - 1) / cuda::kMapThreads, resident);
  const void* kernel = reinterpret_cast<const void*>(cube3 ? cuda::fused_submanifold_map<3> : cuda::fused_submanifold_map<0>);
  void* args[] = {&a};
  C10_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(cuda::kMapThreads),
                                             args, 0, stream));
}

// A submanifold map from a coordinate set with no hash yet, in one call instead of two op calls and
// a Python read of the error word (coord_hash, kernel_map_table, .item()): as hashed_strided_table,
// because each op call and each read costs host time of its own on the fresh map of every scan. The
// new hash's error word is published to the host once the insert is done (PublishedWords): with
// `check` the op waits for it (not for the table) and raises on bad coordinates; with `early_read`
// it returns the word's ticket and the caller checks before any result over the map escapes
// (check_coords; a voxel conv does so once it is queued); with neither the caller reads the device
// word. The table is int32 while the sizes allow (relconv.core.index_dtype_for's rule), else
// int64. `one_buffer` (a set that keeps its hash: CoordIndex.RELEASE_ROWS) puts table, slots and
// error word in one int32 allocation: on the H100 host an allocation or a memset costs 4 to 10 us
// of host time, and a set that keeps its hash frees it together with its maps anyway. Such a map of
// a symmetric kernel on up to kFusedMapRows rows is one cooperative launch (kernel_map_fused.cuh).
// Returns (slots, table, error word, the word's ticket or -1).
std::tuple<at::Tensor, at::Tensor, at::Tensor, int64_t> hashed_submanifold_table_cuda(const at::Tensor& coords,
                                                                                      at::IntArrayRef kernel_size,
                                                                                      at::IntArrayRef step, bool check,
                                                                                      bool one_buffer, bool early_read) {
  const at::Tensor c = row_major_coords(coords, "coords");
  const cuda::KernelGeometry g = geometry(kernel_size, step);
  const c10::cuda::CUDAGuard guard(c.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t n = c.size(0), entries = n * g.volume;
  const bool narrow = entries <= std::numeric_limits<int32_t>::max();
  const bool fused = fused_map(n, g, one_buffer && narrow);
  auto [slot, ticket] = check || early_read ? published_words().reserve(stream)
                                            : std::pair<cuda::WordSlot, int64_t>{cuda::WordSlot{nullptr, 0}, -1};
  at::Tensor slots, table, error;
  try {
    if (one_buffer && narrow) {
      // int32 layout: table [n, K] | slots | error word, all ones (-1: no neighbour, empty slot),
      // set by a memset or by the fused kernel's first phase.
      const int64_t capacity = cuda::SlotLayout::capacity_for(n), words = entries + capacity + 1;
      const at::Tensor buffer =
          fused ? at::empty({words}, c.options()) : memset_tensor({words}, c.options(), kAllOnes, stream);
      table = buffer.as_strided({n, g.volume}, {g.volume, 1}, 0);
      slots = buffer.as_strided({capacity}, {1}, entries);
      error = buffer.as_strided({1}, {1}, entries + capacity);
      int32_t* base = buffer.mutable_data_ptr<int32_t>();
      if (fused) {
        launch_fused_map(cuda::FusedMapArgs{c.const_data_ptr<int32_t>(), n, base, words, base + entries,
                                            cuda::SlotLayout::of_capacity(capacity), base + entries + capacity, g,
                                            slot},
                         stream);
      } else {
        insert_rows(c, base + entries, capacity, base + entries + capacity, stream);
      }
    } else {
      std::tie(slots, error) = hash_rows(c, stream);
    }
    if (!fused) {
      if (slot.host != nullptr) {  // before the table's fill and kernel: the check waits for the insert alone
        cuda::publish_word_kernel<<<1, 1, 0, stream>>>(slot, error.const_data_ptr<int32_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      const bool symmetric = symmetric_table(true, g);
      if (!table.defined()) table = new_table(c, n, g, symmetric, narrow ? at::kInt : at::kLong, stream);
      fill_table(c, slots, c, symmetric, g, table, stream);
    }
  } catch (...) {
    published_words().abandon(ticket);
    throw;
  }
  if (check) {
    raise_word_errors(error, ticket, stream);
    ticket = -1;
  }
  return {slots, table, error, ticket};
}

// A coordinate set's deferred check (CoordIndex.ensure_valid).
void check_coords_cuda(const at::Tensor& error, int64_t ticket) {
  RELCONV_CHECK_VALUE(error.numel() == 1 && error.scalar_type() == at::kInt && error.is_cuda(),
                    "error must be the int32 [1] CUDA error word of relconv::coord_hash");
  const c10::cuda::CUDAGuard guard(error.device());
  raise_word_errors(error, ticket, c10::cuda::getCurrentCUDAStream());
}

}  // namespace

TORCH_LIBRARY_IMPL(relconv, CUDA, m) {
  m.impl("coord_hash", &coord_hash_cuda);
  m.impl("kernel_map_table", &kernel_map_table_cuda);
  m.impl("strided_coords", &strided_coords_cuda);
  m.impl("hashed_strided_table", &hashed_strided_table_cuda);
  m.impl("hashed_submanifold_table", &hashed_submanifold_table_cuda);
  m.impl("check_coords", &check_coords_cuda);
}

}  // namespace relconv
