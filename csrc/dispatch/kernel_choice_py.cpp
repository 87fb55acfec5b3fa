// relconv._C.kernel_choice: common/kernel_choice.h's decision, asked from Python for any device, so
// that relconv.ops.plan can say which CUDA kernel a call runs (or would run on a given GPU) in a
// CPU build too. The CUDA launchers call the same functions.
#include "dispatch/kernel_choice_py.h"

#include <pybind11/stl.h>

#include <string>
#include <tuple>

#include "common/kernel_choice.h"

namespace relconv {
namespace {

namespace py = pybind11;

choice::Dtype parse_dtype(const std::string& name) {
  if (name == "float16") return choice::Dtype::kHalf;
  if (name == "bfloat16") return choice::Dtype::kBFloat16;
  if (name == "float32") return choice::Dtype::kFloat;
  if (name == "float64") return choice::Dtype::kDouble;
  throw py::value_error("kernel_choice: dtype must be float16, bfloat16, float32 or float64, got '" + name + "'");
}

py::dict describe(choice::Config c, int bytes) {
  const choice::TileShape t = choice::tiles(c, bytes);
  py::dict d;
  d["config"] = choice::config_name(c);
  d["family"] = choice::family_name(c);
  d["tiles"] = std::make_tuple(t.bm, t.bn, t.bk, t.wm, t.wn, t.stages);
  return d;
}

// kind: "table" (forward over a neighbour table), "pairs" (forward over pair lists) or
// "weight_grad". The flags say what the launcher reads from its operands: 16-byte rows of x, of the
// weight (vec_w) or of the gradient (vec_g), 2-element output stores, a 16-byte fp32 accumulator.
py::dict kernel_choice(const std::string& kind, const std::string& dtype, std::tuple<int, int> arch, int64_t sms,
                       bool sm90a_built, int64_t groups, int64_t cin_g, int64_t cout_g, int64_t num_in,
                       int64_t num_out, int64_t num_relations, bool index32, bool allow_tf32, bool vec_x,
                       bool vec_w, bool vec_out2, bool out16, bool weight_t, bool x_chunks) {
  const choice::Device dev{std::get<0>(arch), std::get<1>(arch), sms};
  const choice::Dtype dt = parse_dtype(dtype);
  const int bytes = choice::element_bytes(dt);
  if (kind == "table") {
    choice::TableProblem p;
    p.dtype = dt;
    p.allow_tf32 = allow_tf32;
    p.index32 = index32;
    p.num_in = num_in;
    p.num_out = num_out;
    p.num_relations = num_relations;
    p.groups = groups;
    p.cin_g = cin_g;
    p.cout_g = cout_g;
    p.vec_x = vec_x;
    p.vec_w = vec_w;
    p.vec_out2 = vec_out2;
    p.weight_t = weight_t;
    p.x_chunks = x_chunks;
    const choice::TableChoice c = choice::table_kernel(p, dev, [sm90a_built] { return sm90a_built; });
    py::dict d = describe(c.config, bytes);
    d["tf32"] = c.tf32;
    d["whole_tiles"] = c.whole_tiles;
    d["reads_weight_t"] = c.reads_weight_t;
    d["split"] = c.split;
    d["pack"] = c.pack;
    return d;
  }
  if (kind == "pairs") {
    return describe(choice::pairs_kernel({dt, groups, cin_g, cout_g, vec_x, vec_w, out16}), bytes);
  }
  if (kind == "weight_grad") {
    choice::WeightGradProblem p;
    p.dtype = dt;
    p.allow_tf32 = allow_tf32;
    p.cin_g = cin_g;
    p.cout_g = cout_g;
    p.vec_x = vec_x;
    p.vec_g = vec_w;
    p.x_chunks = x_chunks;
    return describe(choice::weight_grad_kernel(p, dev), bytes);
  }
  throw py::value_error("kernel_choice: kind must be 'table', 'pairs' or 'weight_grad', got '" + kind + "'");
}

}  // namespace

void def_kernel_choice(pybind11::module_& m) {
  m.def("kernel_choice", &kernel_choice,
        "The CUDA kernel configuration common/kernel_choice.h picks; a dict of config, family, tiles "
        "(BM, BN, BK, WM, WN, stages) and, for kind='table', tf32, whole_tiles, reads_weight_t, split, pack",
        py::arg("kind"), py::arg("dtype"), py::arg("arch"), py::arg("sms"), py::arg("sm90a_built") = true,
        py::arg("groups") = 1, py::arg("cin_g"), py::arg("cout_g"), py::arg("num_in") = 0, py::arg("num_out") = 0,
        py::arg("num_relations") = 1, py::arg("index32") = true, py::arg("allow_tf32") = false,
        py::arg("vec_x") = true, py::arg("vec_w") = true, py::arg("vec_out2") = true, py::arg("out16") = true,
        py::arg("weight_t") = false, py::arg("x_chunks") = true);
}

}  // namespace relconv
