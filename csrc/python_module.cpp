// The pybind11 module `relconv._C`: importing it loads the op registrations (library.cpp and the
// kernels' TORCH_LIBRARY_IMPL blocks) and adds the direct entries relconv.ops calls from Python.
#include <torch/extension.h>

#include "common/build_info.h"
#include "dispatch/kernel_choice_py.h"
#include "dispatch/prepared_conv.h"
#include "dispatch/ops.h"

namespace {

template <typename R, typename... Args>
void def_direct(pybind11::module_& m, const char* name, const c10::TypedOperatorHandle<R(Args...)>& op) {
  m.def(name, [&op](Args... args) -> R { return op.call(std::forward<Args>(args)...); });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "relconv C++/CUDA kernels; the ops live in torch.ops.relconv";
  m.def("cuda_version", &relconv::built_cuda_version,
        "CUDA version the extension was compiled with (major*1000 + minor*10), or -1 for a CPU build");
  // The per-layer ops called straight from Python (relconv.ops uses them outside torch.compile and
  // without __torch_function__ overrides): a typed dispatcher call, the same kernels at every dispatch
  // key, without torch.ops' boxed argument parsing, which cost ~1.7 us of the ~2.6 us of an empty
  // relational_conv call on a CPU host (13 arguments).
  def_direct(m, "relational_conv", relconv::conv_op());
  def_direct(m, "batch_norm_act", relconv::batch_norm_op());
  relconv::def_prepared_conv(m);
  relconv::def_kernel_choice(m);
}
