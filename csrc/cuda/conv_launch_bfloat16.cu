// The bfloat16 launchers (see conv_launch.cuh for why each element type has its own file).
#include "cuda/conv_launch.cuh"

RELCONV_INSTANTIATE_LAUNCHERS(__nv_bfloat16);
