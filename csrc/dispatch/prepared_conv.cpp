// A layer's relational_conv call with the map-side arguments bound, for a layer that runs over the
// same cached map call after call (relconv.voxel.Conv3d). Preparing those arguments in Python (map
// lookup, execution plan, table schedule, pair lists, argument checks) costs about as much host time
// as the op's own dispatch and launch: on an H100 host a cached C64 fp16 Conv3d takes 28-31 us to
// enqueue that way, the op alone 12.7. A prepared call records the state its arguments were
// prepared under: grad mode and which operands require grad (pairs and transposed tables for the
// backward), autocast and TF32 / determinism switches (the dataflow), operand dtypes, shapes and
// device. `run` calls the op through the dispatcher (autograd and autocast as usual) when that state
// still holds and returns None otherwise, for the caller to prepare the call again.
#include "common/error_message.h"
#include "dispatch/prepared_conv.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/util/SmallVector.h>
#include <pybind11/stl.h>

#include <optional>

#include "dispatch/conv_call.h"
#include "dispatch/ops.h"

namespace relconv {
namespace {

struct CallState {
  c10::Device device{c10::kCPU};
  c10::ScalarType x_dtype{}, w_dtype{}, autocast_dtype{};
  std::optional<c10::ScalarType> bias_dtype;
  int64_t x_rows = 0, x_cols = 0;
  c10::SmallVector<int64_t, 4> w_sizes;
  bool grad = false, x_grad = false, w_grad = false, autocast = false, tf32 = false, deterministic = false;

  static CallState of(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
    CallState s;
    s.device = x.device();
    s.x_dtype = x.scalar_type();
    s.w_dtype = w.scalar_type();
    s.bias_dtype = bias.has_value() ? std::optional(bias->scalar_type()) : std::nullopt;
    s.x_rows = x.dim() == 2 ? x.size(0) : -1;
    s.x_cols = x.dim() == 2 ? x.size(1) : -1;
    s.w_sizes.assign(w.sizes().begin(), w.sizes().end());
    s.grad = at::GradMode::is_enabled();
    s.x_grad = s.grad && x.requires_grad();
    s.w_grad = s.grad && w.requires_grad();
    s.autocast = at::autocast::is_autocast_enabled(s.device.type());
    s.autocast_dtype = at::autocast::get_autocast_dtype(s.device.type());
    s.tf32 = at::globalContext().allowTF32CuBLAS();
    s.deterministic = at::globalContext().deterministicAlgorithms();
    return s;
  }

  bool operator==(const CallState& o) const {
    return device == o.device && x_dtype == o.x_dtype && w_dtype == o.w_dtype && autocast_dtype == o.autocast_dtype &&
           bias_dtype == o.bias_dtype && x_rows == o.x_rows && x_cols == o.x_cols && w_sizes == o.w_sizes &&
           grad == o.grad && x_grad == o.x_grad && w_grad == o.w_grad && autocast == o.autocast && tf32 == o.tf32 &&
           deterministic == o.deterministic;
  }
};

class PreparedConv {
 public:
  // The op's arguments as prepared for operands x, weight and bias (relconv.ops.conv_call).
  PreparedConv(const at::Tensor& x, const at::Tensor& weight, at::Tensor in_index, at::Tensor out_index,
           at::Tensor rel_ptr, std::optional<at::Tensor> scale, int64_t num_out,
           std::optional<at::Tensor> table, std::optional<at::Tensor> table_order,
           const std::optional<at::Tensor>& bias, bool relu, std::optional<at::Tensor> transposed_table,
           std::optional<at::Tensor> transposed_order, bool sorted_tables)
      : state_(CallState::of(x, weight, bias)),
        call_{.in_index = std::move(in_index),
              .out_index = std::move(out_index),
              .rel_ptr = std::move(rel_ptr),
              .scale = std::move(scale),
              .num_out = num_out,
              .neighbor_table = std::move(table),
              .table_order = std::move(table_order),
              .relu = relu,
              .transposed_table = std::move(transposed_table),
              .transposed_order = std::move(transposed_order),
              .sorted_tables = sorted_tables} {
    RELCONV_CHECK_VALUE(state_.x_rows >= 0, "PreparedConv: x must be 2-D, got ", x.dim(), " dimensions");
  }

  std::optional<at::Tensor> run(const at::Tensor& x, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias) const {
    if (!(CallState::of(x, weight, bias) == state_)) return std::nullopt;
    // The stored fields go to the op as they are: a copy of call_ with the operands filled in would
    // cost a reference count per tensor on every call.
    return conv_op().call(x, weight, call_.in_index, call_.out_index, call_.rel_ptr, call_.scale, call_.num_out,
                          call_.neighbor_table, call_.table_order, bias, call_.relu, call_.transposed_table,
                          call_.transposed_order, call_.sorted_tables);
  }

 private:
  CallState state_;
  ConvCall call_;  // every argument but the operands x, weight and bias
};

}  // namespace

void def_prepared_conv(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<PreparedConv>(m, "PreparedConv",
                       "relational_conv with its map-side arguments bound; run(x, weight, bias) -> Tensor, or "
                       "None when the call state it was prepared under no longer holds")
      .def(py::init<const at::Tensor&, const at::Tensor&, at::Tensor, at::Tensor, at::Tensor,
                    std::optional<at::Tensor>, int64_t, std::optional<at::Tensor>, std::optional<at::Tensor>,
                    const std::optional<at::Tensor>&, bool, std::optional<at::Tensor>, std::optional<at::Tensor>,
                    bool>())
      .def("run", &PreparedConv::run, py::arg("x"), py::arg("weight"), py::arg("bias"));
}

}  // namespace relconv
