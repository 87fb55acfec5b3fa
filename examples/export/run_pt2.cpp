// Runs an AOTInductor package (.pt2) of a relconv model without Python, checks it against the
// outputs eager PyTorch gave for the same inputs, and times it.
//
//   run_pt2 <librelconv_ops.so> <model.pt2> <io.pt> <cpu|cuda> [iterations]
//
// io.pt is the list [input_0, ..., input_k, expected_output] that export_models.py saved with
// torch.save. relconv's ops are registered by loading its ops library (RTLD_GLOBAL, before the
// package): the package calls them through the dispatcher by name.
#include <dlfcn.h>

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::vector<torch::Tensor> load_tensors(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<torch::Tensor> out;
  for (const auto& v : torch::pickle_load(bytes).toList()) out.push_back(v.get().toTensor());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s <librelconv_ops.so> <model.pt2> <io.pt> <cpu|cuda> [iterations]\n", argv[0]);
    return 2;
  }
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr, "cannot load relconv's ops library: %s\n", dlerror());
    return 2;
  }
  const torch::Device device(argv[4]);
  const int iterations = argc > 5 ? std::stoi(argv[5]) : 20;

  std::vector<torch::Tensor> inputs = load_tensors(argv[3]);
  torch::Tensor expected = inputs.back();
  inputs.pop_back();
  for (auto& t : inputs) t = t.to(device);

  torch::NoGradGuard no_grad;
  torch::inductor::AOTIModelPackageLoader loader(argv[2]);
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };

  torch::Tensor out = loader.run(inputs)[0].to(torch::kCPU);
  const bool equal = out.sizes() == expected.sizes() && torch::allclose(out, expected, 1e-5, 1e-5);
  const double max_diff = out.sizes() == expected.sizes() ? (out - expected).abs().max().item<double>() : -1.0;

  std::vector<double> ms;
  for (int i = 0; i < iterations + 3; ++i) {  // 3 warm-up runs
    sync();
    const auto start = std::chrono::steady_clock::now();
    loader.run(inputs);
    sync();
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    if (i >= 3) ms.push_back(took.count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%s: output %s, max |C++ - eager| = %.3g, equal (rtol = atol = 1e-5): %s, C++ median %.3f ms (%d runs)\n",
              argv[2], c10::str(out.sizes()).c_str(), max_diff, equal ? "yes" : "NO", ms[ms.size() / 2], iterations);
  return equal ? 0 : 1;
}
