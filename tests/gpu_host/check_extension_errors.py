"""Does a C++ extension built on this machine raise a clean error when a TORCH_CHECK message is
assembled from several pieces (a number, or two strings)? And if not, why?

On one GPU host (torch 2.11.0+cu130, gcc 13.3) a five-line extension with no relconv code segfaults
when a check whose message formats a number fails, while a one-piece message raises a clean
ValueError; relconv's own argument checks crashed there too before they built their messages from
strings. A one-piece message never reaches a std::ostringstream (c10::str returns it as it is); any
other is assembled in one. libc10 exports
copies of some libstdc++ members (among them std::ostringstream's default constructor and its
C++20 `str() const&`, newer than the base libstdc++ of the toolchain torch is built with, which
links them in statically), and an extension linked the default way (torch's libraries ahead of
libstdc++ in DT_NEEDED) binds those to libc10 and `operator<<(long)` to libstdc++: one stream, two
runtimes. On CPU hosts the two agree (CI); where they do not, the first number written crashes.

    python tests/gpu_host/check_extension_errors.py

builds a probe extension in several variants (compile and link flags), calls each of its checks in
a fresh process, and prints the environment, which loaded libraries export libstdc++ stream
symbols, where the probe's references to the C++ runtime bind (LD_DEBUG), the outcome of every
variant and call, a native backtrace if the default build crashes (gdb), and relconv's own
extension with a bad argument and its DT_NEEDED order. On the H100 host `default` and `c++17`
crash at `number` and `format_only` only, and `to_string` raises. Linking libstdc++ first in
DT_NEEDED does not help relconv there (libc10 is loaded into the global scope before it), while
LD_PRELOAD of libstdc++ does; relconv therefore builds every check message from strings
(csrc/common/error_message.h). Exit code 0 when every default call raised its ValueError.
"""

import concurrent.futures
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

SOURCE = r"""
#include <sstream>
#include <string>
#include <ATen/ATen.h>
#include <torch/library.h>
// One failing check per way a message can be assembled.
at::Tensor one_piece(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.numel() < 0, "numel was not negative");
  return t;
}
at::Tensor two_strings(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.numel() < 0, "numel was ", "not negative");
  return t;
}
at::Tensor number(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.numel() < 0, "numel was ", t.numel());
  return t;
}
at::Tensor to_string(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.numel() < 0, std::string("numel was ") + std::to_string(t.numel()));
  return t;
}
// Formatting alone, no exception: the string's length as a tensor.
at::Tensor format_only(const at::Tensor& t) {
  std::ostringstream ss;
  ss << "numel was " << t.numel();
  return at::full({1}, static_cast<double>(ss.str().size()));
}
TORCH_LIBRARY(errprobe, m) {
  m.def("one_piece(Tensor t) -> Tensor");
  m.def("two_strings(Tensor t) -> Tensor");
  m.def("number(Tensor t) -> Tensor");
  m.def("to_string(Tensor t) -> Tensor");
  m.def("format_only(Tensor t) -> Tensor");
}
TORCH_LIBRARY_IMPL(errprobe, CPU, m) {
  m.impl("one_piece", &one_piece);
  m.impl("two_strings", &two_strings);
  m.impl("number", &number);
  m.impl("to_string", &to_string);
  m.impl("format_only", &format_only);
}
"""
CALLS = ("one_piece", "two_strings", "number", "to_string", "format_only")

# name -> (extra compile flags, extra link flags, extra environment of the calls)
VARIANTS = {
    "default": ([], [], {}),
    "c++17": (["-std=c++17"], [], {}),
    "cxx11-abi-0": (["-D_GLIBCXX_USE_CXX11_ABI=0"], [], {}),
    "no-gnu-unique": (["-fno-gnu-unique"], [], {}),
    "libstdc++-first": ([], ["-lstdc++"], {}),
    "static-libstdc++": ([], ["-static-libstdc++"], {}),
    "LD_PRELOAD libstdc++": ([], [], {"LD_PRELOAD": "@libstdc++@"}),
}

BUILD = """
import sys, torch
from torch.utils.cpp_extension import load_inline
name, src, build, cflags, ldflags = sys.argv[1:6]
load_inline(name, [open(src).read()], is_python_module=False, build_directory=build,
            extra_cflags=cflags.split(), extra_ldflags=ldflags.split())
"""

CALL = """
import sys, torch
torch.ops.load_library(sys.argv[1])
try:
    out = getattr(torch.ops.errprobe, sys.argv[2])(torch.zeros(3))
    print("returned", out.tolist())
except ValueError as err:
    print("ValueError:", err.args[0].splitlines()[0])
"""

RELCONV = """
import torch, relconv
i = torch.zeros(2, 2, dtype=torch.int32)
try:
    torch.ops.relconv.relational_conv.default(torch.zeros(3, 4), torch.zeros(1, 4, 4), i, i,
                                              torch.zeros(2, dtype=torch.long), None, 3)
except ValueError as err:
    print("ValueError:", err.args[0].splitlines()[0])
"""

# Stream and locale entry points of libstdc++ (mangled prefixes): a library other than libstdc++
# that defines one can take an extension's call to it.
STREAM_SYMBOLS = re.compile(
    r"^_ZN[KR]*St7__cxx11(19basic_ostringstream|15basic_stringbuf|18basic_stringstream)|^_ZNSo|"
    r"^_ZNSt6locale|^_ZNSt8ios_base|^_ZNSt9basic_ios"
)


def run(cmd, env=None, timeout=600):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)


def first_line(cmd) -> str:
    try:
        r = run(cmd, timeout=60)
        return (r.stdout or r.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired) as err:
        return f"unavailable ({type(err).__name__})"


def outcome(r: subprocess.CompletedProcess) -> str:
    if r.returncode < 0:
        return f"CRASH (signal {-r.returncode})"
    text = r.stdout.strip().splitlines()
    if r.returncode == 0 and text:
        return text[-1]
    tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
    return f"exit {r.returncode}: {tail[:160]}"


def environment(libstdcxx: str) -> None:
    import torch

    cxx = os.environ.get("CXX", "c++")
    print("== environment")
    print("python:", sys.version.split()[0], platform.platform())
    print("torch:", torch.__version__, "cuda", torch.version.cuda, "git", torch.version.git_version[:12])
    print("torch._C._GLIBCXX_USE_CXX11_ABI:", torch._C._GLIBCXX_USE_CXX11_ABI)
    config = torch.__config__.show()
    for line in config.splitlines():
        if re.search(r"GCC|C\+\+ Version|CUDA Runtime|NVCC", line):
            print("torch built with:", line.strip())
    for key in ("CXX_COMPILER", "CXX_FLAGS"):
        m = re.search(rf"{key}=([^,]*)", config)
        print(f"torch {key}:", m.group(1).strip() if m else "?")
    print(f"extension compiler ({cxx}):", first_line([cxx, "--version"]))
    print("nvcc:", first_line(["nvcc", "--version"]) if shutil.which("nvcc") else "not on PATH")
    nvcc = shutil.which("nvcc")
    if nvcc:
        print("nvcc release:", [ln for ln in run([nvcc, "--version"]).stdout.splitlines() if "release" in ln])
    print("compiler's libstdc++:", libstdcxx)
    print("glibc:", platform.libc_ver())
    print()


def exporters() -> None:
    import torch  # noqa: F401  (maps torch's libraries)

    print("== loaded libraries that define libstdc++ stream/locale symbols (after import torch)")
    libs = sorted({ln.split()[-1] for ln in open("/proc/self/maps") if ".so" in ln.split()[-1]})
    for lib in libs:
        r = run(["nm", "-D", "--defined-only", lib]) if shutil.which("nm") else None
        if r is None:
            print("nm not found")
            return
        names = [f.split()[-1] for f in r.stdout.splitlines() if f.split()]
        hits = [n for n in names if STREAM_SYMBOLS.match(n)]
        if hits:
            example = next((n for n in hits if "basic_ostringstream" in n), hits[0])
            print(f"{len(hits):5d}  {lib}   e.g. {example}")
    print()


def build(name, src, root, cflags, ldflags):
    d = os.path.join(root, name.replace("+", "x"))
    os.makedirs(d, exist_ok=True)
    r = run([sys.executable, "-c", BUILD, "errprobe", src, d, " ".join(cflags), " ".join(ldflags)])
    so = os.path.join(d, "errprobe.so")
    return (
        (so, "")
        if r.returncode == 0 and os.path.exists(so)
        else (None, f"build or load failed: {outcome(r)}")
    )


def bindings(so: str) -> None:
    """Where the probe's references to libstdc++ bind (glibc's LD_DEBUG=bindings): every one that a
    library other than libstdc++ takes, and the stream members that libstdc++ serves."""
    with tempfile.TemporaryDirectory() as d:
        env = {"LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": f"{d}/ld"}
        run([sys.executable, "-c", CALL, so, "number"], env=env)
        found = {}
        for f in os.listdir(d):
            for ln in open(os.path.join(d, f), errors="replace"):
                m = re.search(r"binding file (\S+) .*to (\S+) .*symbol `(_ZN?K?R?S[to][^']*)'", ln)
                if m and m.group(1) == so and m.group(2) != so:
                    found[m.group(3)] = os.path.basename(m.group(2))
    if not found:
        print("  (no binding lines: LD_DEBUG unsupported here)")
    names = sorted(n for n, lib in found.items() if "libstdc++" not in lib or STREAM_SYMBOLS.match(n))
    plain = run(["c++filt", *names]).stdout.splitlines() if shutil.which("c++filt") else names
    for name, shown in zip(names, plain or names, strict=False):
        print(f"  {found[name]:24s} {shown[:150]}")


def backtrace(so: str) -> None:
    if not shutil.which("gdb"):
        print("  gdb not found")
        return
    gdb = ["gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 15", "--args"]
    r = run([*gdb, sys.executable, "-c", CALL, so, "number"])
    frames = [ln for ln in r.stdout.splitlines() if ln.startswith("#")]
    print("\n".join("  " + f[:220] for f in frames) or "  (no crash under gdb)")


def main() -> int:
    libstdcxx = first_line([os.environ.get("CXX", "c++"), "-print-file-name=libstdc++.so.6"])
    environment(libstdcxx)
    exporters()
    root = tempfile.mkdtemp(prefix="errprobe-")
    src = os.path.join(root, "errprobe.cpp")
    with open(src, "w") as f:
        f.write(SOURCE)
    jobs = max(1, min(len(VARIANTS), (os.cpu_count() or 2) // 2))
    builds = {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {
            name: pool.submit(build, name, src, root, cflags, ldflags)
            for name, (cflags, ldflags, env) in VARIANTS.items()
            if not env  # a variant that only changes the environment runs the default build
        }
        builds = {name: f.result() for name, f in futures.items()}
    print("== probe extension: outcome of each failing check, per build variant")
    print(f"{'variant':22s} " + " | ".join(CALLS))
    default_ok, order = False, []
    for name, (_, _, env) in VARIANTS.items():
        so, failure = builds.get(name, builds["default"])
        if so is None:
            print(f"{name:22s} {failure}")
            continue
        env = {k: v.replace("@libstdc++@", libstdcxx) for k, v in env.items()}
        results = [outcome(run([sys.executable, "-c", CALL, so, call], env=env)) for call in CALLS]
        print(f"{name:22s} " + " | ".join(results))
        if name == "default":
            default_ok = all(r.startswith(("ValueError", "returned")) for r in results)
            needed = run(["readelf", "-d", so]).stdout if shutil.which("readelf") else ""
            order = re.findall(r"NEEDED.*\[(.+)\]", needed)
    print()
    default_so = builds["default"][0]
    print("== default probe: DT_NEEDED order:", " ".join(order) or "-")
    if default_so:
        print("== default probe: where its stream symbols bind")
        bindings(default_so)
        if not default_ok:
            print("== default probe: native backtrace of the `number` call")
            backtrace(default_so)
    print()
    print("== relconv's extension, a C++ argument check that formats a shape:")
    r = run([sys.executable, "-c", RELCONV])
    print(" ", outcome(r))
    try:
        import relconv._C as ext

        needed = run(["readelf", "-d", ext.__file__]).stdout if shutil.which("readelf") else ""
        print("  DT_NEEDED:", " ".join(re.findall(r"NEEDED.*\[(.+)\]", needed)))
    except ImportError as err:
        print("  relconv not importable:", err)
    shutil.rmtree(root, ignore_errors=True)
    return 0 if default_ok else 1


if __name__ == "__main__":
    sys.exit(main())
