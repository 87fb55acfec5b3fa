"""examples/export/run_pt2.cpp: AOTInductor packages of a MinkUNet and an R-GCN, run from C++
(libtorch and relconv's ops library, no Python), equal eager on inputs of another size."""

import os
import shutil
import subprocess

import pytest
import torch

from relconv.export import export_minkunet, export_rgcn
from tests.conftest import DEVICES
from tests.export.test_export import RGCN, _eager_graph_pyg_style, _eager_voxel, _graph, _minkunet, _scene

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPS_LIB = os.path.join(ROOT, "relconv", "lib", "librelconv_ops.so")


@pytest.fixture(scope="module")
def run_pt2(tmp_path_factory) -> str:
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.skip("needs cmake and a C++ compiler to build examples/export/run_pt2.cpp")
    if not os.path.exists(OPS_LIB):
        pytest.skip(
            "needs relconv/lib/librelconv_ops.so: RELCONV_BUILD_OPS_LIB=1 python setup.py build_ext --inplace"
        )
    build = tmp_path_factory.mktemp("run_pt2")
    source = os.path.join(ROOT, "examples", "export")
    prefix = f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"
    subprocess.run(["cmake", "-S", source, "-B", str(build), prefix], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    return str(build / "run_pt2")


def _rgcn_case(device: str):
    torch.manual_seed(0)
    model = RGCN(8, 16, 5, 4).to(device).eval()
    ep = export_rgcn(model, *_graph(40, 150, 4, device, seed=0), num_relations=4)
    args = _graph(70, 400, 4, device, seed=2)
    return ep, args, _eager_graph_pyg_style(model, *args)


def _minkunet_case(device: str):
    model = _minkunet(device)
    ep = export_minkunet(model, *_scene(500, 12, device, seed=0))
    args = _scene(900, 14, device, seed=2)
    return ep, args, _eager_voxel(model, *args)


# Each case compiles a package (C++ on the CPU, Triton on CUDA): minutes on a 2-core host.
@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["rgcn", "minkunet"])
def test_cpp_loader_runs_package_equal_to_eager(run_pt2, tmp_path, name, device):
    from torch._inductor import aoti_compile_and_package

    ep, args, expected = {"rgcn": _rgcn_case, "minkunet": _minkunet_case}[name](device)
    package = aoti_compile_and_package(ep, package_path=str(tmp_path / f"{name}.pt2"))
    io = tmp_path / f"{name}_io.pt"
    torch.save([t.cpu() for t in (*args, expected)], io)
    run = subprocess.run([run_pt2, OPS_LIB, package, str(io), device, "3"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "equal (rtol = atol = 1e-5): yes" in run.stdout
