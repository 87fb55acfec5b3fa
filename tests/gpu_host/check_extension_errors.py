"""Does a C++ extension built on this machine survive a TORCH_CHECK whose message formats a number?

On the GPU host (torch 2.11.0+cu130, gcc 13.3) it does not: a five-line extension with no relconv
code, built by torch.utils.cpp_extension.load_inline with default flags, segfaults when the check
fails, while a message without numbers raises a clean ValueError. relconv's own argument checks (all
of them, CPU and CUDA) therefore crash there, not on other machines (CI, torch 2.13: clean
ValueErrors, tests/ops/test_bad_input.py). Run: `python tests/gpu_host/check_extension_errors.py`.
"""

import subprocess
import sys
import tempfile

SOURCE = r"""
#include <ATen/ATen.h>
#include <torch/library.h>
at::Tensor with_number(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.numel() < 0, "numel was ", t.numel());
  return t;
}
at::Tensor without_number(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.numel() < 0, "numel was not negative");
  return t;
}
TORCH_LIBRARY(errprobe, m) {
  m.def("with_number(Tensor t) -> Tensor");
  m.def("without_number(Tensor t) -> Tensor");
}
TORCH_LIBRARY_IMPL(errprobe, CPU, m) {
  m.impl("with_number", &with_number);
  m.impl("without_number", &without_number);
}
"""

CALL = """
import sys, torch
from torch.utils.cpp_extension import load_inline
load_inline("errprobe", [open(sys.argv[1]).read()], is_python_module=False, build_directory=sys.argv[2])
try:
    getattr(torch.ops.errprobe, sys.argv[3])(torch.zeros(3))
except ValueError as err:
    print("ValueError:", err.args[0].splitlines()[0])
"""


def main() -> None:
    build = tempfile.mkdtemp()
    src = f"{build}/errprobe.cpp"
    with open(src, "w") as f:
        f.write(SOURCE)
    for fn in ("without_number", "with_number"):
        r = subprocess.run([sys.executable, "-c", CALL, src, build, fn], capture_output=True, text=True)
        crash = " (segfault)" if r.returncode == -11 else ""
        outcome = r.stdout.strip() or f"exit code {r.returncode}{crash}"
        print(f"{fn}: {outcome}")


if __name__ == "__main__":
    main()
