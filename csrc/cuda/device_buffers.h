// Device buffers whose every byte starts at one value (0 or 0xFF), set by one cudaMemsetAsync, and
// the host's read of a few device words. at::zeros / at::full launch a TensorIterator fill whose host
// cost is several times a memset's, and the map builders and the conv launchers allocate such
// buffers on every call of a network.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <deque>

namespace relconv {

// byte 0: zeros (integers and IEEE floats alike); 0xFF (kAllOnes): -1 in every two's-complement entry.
inline at::Tensor memset_tensor(at::IntArrayRef sizes, const at::TensorOptions& options, int byte,
                                cudaStream_t stream) {
  at::Tensor t = at::empty(sizes, options);
  if (t.numel() > 0) C10_CUDA_CHECK(cudaMemsetAsync(t.mutable_data_ptr(), byte, t.nbytes(), stream));
  return t;
}
constexpr int kAllOnes = 0xFF;  // the empty hash slot / no-neighbour mark

// Words at `device`, after the work queued on `stream`: one copy into a pinned buffer of this host
// thread and one stream sync. Tensor::to(kCPU) does the same behind a CPU allocation and a
// TensorIterator copy, about 25 us more host time per read on the H100 host. The buffer lives as
// long as the thread (8 bytes, free again once the sync returns).
constexpr int kPinnedWords = 2;
inline const int32_t* read_device_words(const int32_t* device, int count, cudaStream_t stream) {
  TORCH_INTERNAL_ASSERT(count <= kPinnedWords, "relconv: the pinned read buffer holds ", kPinnedWords, " words");
  thread_local int32_t* pinned = [] {
    void* p = nullptr;
    C10_CUDA_CHECK(cudaMallocHost(&p, kPinnedWords * sizeof(int32_t)));
    return static_cast<int32_t*>(p);
  }();
  C10_CUDA_CHECK(cudaMemcpyAsync(pinned, device, count * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  return pinned;
}

// A read of one device word that the host waits for later: the copy is queued behind the work
// already on `stream`, and wait() blocks only until it has landed, not until the work queued after
// it has run (a builder queues its remaining kernels between the two). One pinned word and one
// event per host thread and device (an event records only on its own device's streams), so a
// thread holds at most one such read per device at a time. `stream` is on the current device.
class DeferredWordRead {
 public:
  DeferredWordRead(const int32_t* device, cudaStream_t stream) : slot_(&current_slot()) {
    C10_CUDA_CHECK(cudaMemcpyAsync(slot_->word, device, sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    C10_CUDA_CHECK(cudaEventRecord(slot_->landed, stream));
  }
  const int32_t* wait() const {
    C10_CUDA_CHECK(cudaEventSynchronize(slot_->landed));
    return slot_->word;
  }

 private:
  struct Slot {
    int32_t* word = nullptr;
    cudaEvent_t landed = nullptr;
  };
  static Slot& current_slot() {
    thread_local std::deque<Slot> slots;  // growing keeps the slots in place
    int device = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    if (slots.size() <= static_cast<size_t>(device)) slots.resize(device + 1);
    Slot& s = slots[device];
    if (s.word == nullptr) {
      void* p = nullptr;
      C10_CUDA_CHECK(cudaMallocHost(&p, sizeof(int32_t)));
      s.word = static_cast<int32_t*>(p);
      C10_CUDA_CHECK(cudaEventCreateWithFlags(&s.landed, cudaEventDisableTiming));
    }
    return s;
  }
  Slot* slot_;
};

}  // namespace relconv
