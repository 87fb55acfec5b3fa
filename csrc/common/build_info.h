#pragma once

#ifdef RELCONV_WITH_CUDA
#include <cuda.h>
#endif

namespace relconv {

// Compared at import against torch.version.cuda: an extension compiled for one CUDA release and
// loaded under another fails later with obscure launch errors, so the mismatch is caught early.
// Encoded as CUDA_VERSION is (major * 1000 + minor * 10); -1 for a CPU-only build.
inline int built_cuda_version() {
#ifdef RELCONV_WITH_CUDA
  return CUDA_VERSION;
#else
  return -1;
#endif
}

}  // namespace relconv
