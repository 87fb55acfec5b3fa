"""Builds the extension `relconv._C` and, on request, the Python-free ops library.

CPU kernels are always compiled. CUDA kernels are added when torch sees a GPU or FORCE_CUDA=1 is set
(and a CUDA toolkit is found); TORCH_CUDA_ARCH_LIST and MAX_JOBS are honoured by torch's builder.

RELCONV_BUILD_OPS_LIB=1 also links relconv/lib/librelconv_ops.so: the op schemas and kernels without
the pybind11 module, for C++ programs that run exported relconv models (docs/deployment.md). It is
linked from the objects compiled for `relconv._C` (no second compile) and needs libtorch only.
"""

import glob
import importlib.util
import os
import warnings

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _sources(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def _with_cuda() -> bool:
    wanted = torch.cuda.is_available() or os.environ.get("FORCE_CUDA", "0") == "1"
    if wanted and CUDA_HOME is None:
        raise RuntimeError("relconv: CUDA build requested but no CUDA toolkit found; set CUDA_HOME")
    return wanted


def _hopper_arch_default() -> None:
    """Hopper's wgmma kernels exist only in sm_90a code. torch's builder compiles for the GPUs it sees
    when TORCH_CUDA_ARCH_LIST is unset, and names an H100 / H200 "9.0" (plain sm_90): such a build
    would run every layer those kernels serve on the slower mma.sync kernel. Unset, the list becomes
    the GPUs seen, with 9.0a for Hopper; a list that names 9.0 without 9.0a is kept, with a warning."""
    wanted = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if wanted:
        names = wanted.replace(",", ";").replace(" ", ";").split(";")
        if any(n.split("+")[0] == "9.0" for n in names) and not any(n.startswith("9.0a") for n in names):
            message = "TORCH_CUDA_ARCH_LIST names 9.0 without 9.0a: Hopper's wgmma kernels are not built"
            warnings.warn(message, stacklevel=2)
        return
    if not torch.cuda.is_available():
        return
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    if (9, 0) in caps:
        names = ("9.0a" if c == (9, 0) else f"{c[0]}.{c[1]}" for c in caps)
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(names)


def _cutlass_include() -> str:
    """CUTLASS/CuTe headers (the Hopper wgmma kernel is written in CuTe): $CUTLASS_INCLUDE_DIR (a
    CUTLASS checkout's include/), else those of the installed `nvidia-cutlass` wheel."""
    if os.environ.get("CUTLASS_INCLUDE_DIR"):
        return os.environ["CUTLASS_INCLUDE_DIR"]
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "relconv's CUDA build needs the CUTLASS/CuTe headers: pip install nvidia-cutlass==4.2.0.0 "
            "(or set CUTLASS_INCLUDE_DIR to a CUTLASS include/ directory)"
        )
    return os.path.join(os.path.dirname(spec.origin), "source", "include")


def _extension():
    sources = [
        "csrc/library.cpp",
        "csrc/python_module.cpp",
        *_sources("csrc/dispatch/*.cpp"),
        *_sources("csrc/cpu/*.cpp"),
    ]
    include_dirs = [os.path.join(ROOT, "csrc")]
    # at::parallel_for is an inline OpenMP loop: without -fopenmp every CPU parallel loop runs on one
    # thread. The OpenMP runtime that loads is torch's own libgomp, so torch.set_num_threads applies.
    # No -std flag: torch's builder passes the standard its own headers expect (C++20 since torch
    # 2.10); forcing an older one compiles torch's inline headers differently from libtorch.
    cxx = ["-O3", "-fopenmp"]
    link = ["-fopenmp"]
    if not _with_cuda():
        return CppExtension(
            "relconv._C",
            sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx},
            extra_link_args=link,
        )
    _hopper_arch_default()
    nvcc = ["-O3", "--expt-relaxed-constexpr", "-lineinfo", "-DRELCONV_WITH_CUDA"]
    return CUDAExtension(
        "relconv._C",
        sources + _sources("csrc/cuda/*.cu"),
        include_dirs=[*include_dirs, _cutlass_include()],
        define_macros=[("RELCONV_WITH_CUDA", None)],
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        extra_link_args=link,
    )


# Sources that bind to Python; every other source only registers ops with the dispatcher.
PYTHON_SOURCES = {
    "csrc/python_module.cpp",
    "csrc/dispatch/prepared_conv.cpp",
    "csrc/dispatch/kernel_choice_py.cpp",
}
OPS_LIBRARY = os.path.join("relconv", "lib", "librelconv_ops.so")


def _with_ops_library() -> bool:
    return os.environ.get("RELCONV_BUILD_OPS_LIB", "0") == "1"


class BuildWithOpsLibrary(BuildExtension):
    """torch's builder, plus the ops library linked from `relconv._C`'s objects when requested."""

    def build_extension(self, ext) -> None:
        super().build_extension(ext)
        if _with_ops_library():
            self._link_ops_library(ext)

    def run(self) -> None:
        super().run()
        # An in-place build links into build_lib, then copies the extensions to the source tree
        # (setuptools): the ops library follows them.
        if self.inplace and _with_ops_library():
            self.mkpath(os.path.join(ROOT, "relconv", "lib"))
            self.copy_file(os.path.join(self.build_lib, OPS_LIBRARY), os.path.join(ROOT, OPS_LIBRARY))

    def _link_ops_library(self, ext) -> None:
        sources = [s for s in ext.sources if s not in PYTHON_SOURCES]
        objects = self.compiler.object_filenames(sources, output_dir=self.build_temp)
        output = os.path.join(self.build_lib, OPS_LIBRARY)
        os.makedirs(os.path.dirname(output), exist_ok=True)
        # --no-undefined: a symbol left for libpython to provide fails the link here, not the loader.
        self.compiler.link_shared_object(
            objects,
            output,
            libraries=[lib for lib in ext.libraries if lib != "torch_python"],
            library_dirs=ext.library_dirs,
            extra_postargs=[*ext.extra_link_args, "-Wl,--no-undefined"],
            target_lang="c++",
        )


setup(
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildWithOpsLibrary.with_options(use_ninja=True)},
)
