// relconv._C.PreparedConv: one layer's call of relational_conv with every argument but its operands
// bound (see prepared_conv.cpp).
#pragma once

#include <torch/extension.h>

namespace relconv {

void def_prepared_conv(pybind11::module_& m);

}  // namespace relconv
