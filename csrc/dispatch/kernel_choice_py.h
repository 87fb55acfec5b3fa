// relconv._C.kernel_choice (see kernel_choice_py.cpp).
#pragma once

#include <torch/extension.h>

namespace relconv {

void def_kernel_choice(pybind11::module_& m);

}  // namespace relconv
