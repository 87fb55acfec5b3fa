"""examples/export/run_pt2.cpp: an AOTInductor package of an R-GCN run from C++ equals eager."""

import os
import shutil
import subprocess

import pytest
import torch

from relconv.export import export_rgcn
from tests.conftest import DEVICES
from tests.export.test_export import RGCN, _eager_graph_pyg_style, _graph

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPS_LIB = os.path.join(ROOT, "relconv", "lib", "librelconv_ops.so")


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_cpp_loader_runs_rgcn_package_equal_to_eager(tmp_path, device):
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.skip("needs cmake and a C++ compiler to build examples/export/run_pt2.cpp")
    if not os.path.exists(OPS_LIB):
        pytest.skip(
            "needs relconv/lib/librelconv_ops.so: RELCONV_BUILD_OPS_LIB=1 python setup.py build_ext --inplace"
        )
    from torch._inductor import aoti_compile_and_package

    torch.manual_seed(0)
    model = RGCN(8, 16, 5, 4).to(device).eval()
    package = aoti_compile_and_package(
        export_rgcn(model, *_graph(40, 150, 4, device, seed=0), num_relations=4),
        package_path=str(tmp_path / "rgcn.pt2"),
    )
    args = _graph(70, 400, 4, device, seed=2)
    torch.save([t.cpu() for t in (*args, _eager_graph_pyg_style(model, *args))], tmp_path / "rgcn_io.pt")

    build = tmp_path / "build"
    prefix = torch.utils.cmake_prefix_path
    subprocess.run(
        [
            "cmake",
            "-S",
            os.path.join(ROOT, "examples", "export"),
            "-B",
            str(build),
            f"-DCMAKE_PREFIX_PATH={prefix}",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    run = subprocess.run(
        [str(build / "run_pt2"), OPS_LIB, package, str(tmp_path / "rgcn_io.pt"), device, "3"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "equal (rtol = atol = 1e-5): yes" in run.stdout
