// relconv._C.ConvPlan: one layer's call of relational_conv with every argument but its operands
// bound (see conv_plan.cpp).
#pragma once

#include <torch/extension.h>

namespace relconv {

void def_conv_plan(pybind11::module_& m);

}  // namespace relconv
