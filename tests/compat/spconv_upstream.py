"""Runs spconv's own layer tests (`test/test_conv.py` and `test/test_multi_impl.py` of a spconv
snapshot) against relconv.spconv.

    python -m tests.compat.spconv_upstream /path/to/spconv-checkout [--device cuda] [--small] [--tests ...]

The snapshot's files are read at run time, never copied: `spconv.test_utils` (numpy-only helpers)
is loaded from the checkout, `relconv.spconv.install()` stands in for spconv, and test_conv.py's
hard-coded device list is replaced by `--device`. `--small` shrinks the channel counts and runs one
`algo` (relconv ignores it) so that the CPU run takes minutes; the geometry grid is spconv's.
`test_multi_impl` compares one network on the CPU with the same network on CUDA (under each of
spconv's algorithms, which relconv ignores), so it needs a GPU; its unused `cumm.tensorview` import
gets an empty stand-in where cumm is not installed. Prints PASS / FAIL / SKIP per test and exits
non-zero on any failure.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import types
from pathlib import Path

import torch

CONV_TESTS = ("test_spconv3d", "test_spdeconv3d", "test_spmaxpool3d", "test_spglobalmaxpool3d")
TESTS = (*CONV_TESTS, "test_multi_impl")


def _load(name: str, path: Path, source: str | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(source if source is not None else path.read_text(), str(path), "exec"), module.__dict__)
    sys.modules[name] = module
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a spconv source tree (with test/ and spconv/)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--tests", nargs="+", default=list(TESTS))
    args = parser.parse_args()

    import relconv.spconv

    relconv.spconv.install()
    _load("spconv.test_utils", args.checkout / "spconv" / "test_utils.py")
    source = (args.checkout / "test" / "test_conv.py").read_text()
    device = repr([args.device])
    source = source.replace('devices = ["cuda:0"]', f"devices = {device}")
    source = source.replace('devices = ["cpu:0", "cuda:0"]', f"devices = {device}")
    if args.small:
        for old, new in (
            ("in_channels = [32]", "in_channels = [4]"),
            ("out_channels = [32, 48, 64]", "out_channels = [5]"),
            ("in_channels = [64]", "in_channels = [4]"),
            ("out_channels = [64]", "out_channels = [4]"),
            (
                "algos = [ConvAlgo.Native, ConvAlgo.MaskImplicitGemm, ConvAlgo.MaskSplitImplicitGemm]",
                "algos = [ConvAlgo.Native]",
            ),
        ):
            source = source.replace(old, new)
    conv_tests = _load("spconv_upstream_test_conv", args.checkout / "test" / "test_conv.py", source)
    modules = {"test_conv": conv_tests}
    failed = 0
    for name in args.tests:
        if name not in TESTS:
            print(f"{name} FAIL: unknown test; known: {', '.join(TESTS)}")
            failed += 1
            continue
        if name == "test_multi_impl":
            if not torch.cuda.is_available():
                print(f"{name} SKIP: compares the CPU with CUDA, and CUDA is not available")
                continue
            modules.setdefault(name, _multi_impl_module(args.checkout))
        test = getattr(modules["test_conv" if name in CONV_TESTS else name], name)
        start = time.time()
        try:
            test()
            print(f"{name} PASS ({time.time() - start:.1f} s)")
        except Exception:
            failed += 1
            traceback.print_exc()
            print(f"{name} FAIL")
    return 1 if failed else 0


def _multi_impl_module(checkout: Path) -> types.ModuleType:
    try:
        import cumm.tensorview  # noqa: F401  (the real one, where installed)
    except ImportError:
        cumm = types.ModuleType("cumm")
        cumm.tensorview = types.ModuleType("cumm.tensorview")
        sys.modules["cumm"], sys.modules["cumm.tensorview"] = cumm, cumm.tensorview
    path = checkout / "test" / "test_multi_impl.py"
    return _load("spconv_upstream_test_multi_impl", path)


if __name__ == "__main__":
    sys.exit(main())
