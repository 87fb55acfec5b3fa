"""Runs spconv's own layer tests (`test/test_conv.py` of a spconv snapshot) against relconv.spconv.

    python -m tests.compat.spconv_upstream /path/to/spconv-checkout [--device cuda] [--small] [--tests ...]

The snapshot's files are read at run time, never copied: `spconv.test_utils` (numpy-only helpers)
is loaded from the checkout, `relconv.spconv.install()` stands in for spconv, and the test module's
hard-coded device list is replaced by `--device`. `--small` shrinks the channel counts and runs one
`algo` (relconv ignores it) so that the CPU run takes minutes; the geometry grid is spconv's.
Prints PASS / FAIL per test and exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import types
from pathlib import Path

TESTS = ("test_spconv3d", "test_spdeconv3d", "test_spmaxpool3d", "test_spglobalmaxpool3d")


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
    tests = _load("spconv_upstream_test_conv", args.checkout / "test" / "test_conv.py", source)
    failed = 0
    for name in args.tests:
        start = time.time()
        try:
            getattr(tests, name)()
            print(f"{name} PASS ({time.time() - start:.1f} s)")
        except Exception:
            failed += 1
            traceback.print_exc()
            print(f"{name} FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
