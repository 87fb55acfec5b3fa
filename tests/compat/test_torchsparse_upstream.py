"""TorchSparse 2.1's own Python tests (tests/python: single-layer conv against torch's dense conv,
to_dense) run against relconv.torchsparse through install().

They need a TorchSparse source tree, never vendored here: set RELCONV_TORCHSPARSE_TESTS to its
`tests` directory (e.g. extracted from a snapshot of mit-han-lab/torchsparse). Skipped otherwise.
Each device runs in a fresh interpreter, so the `torchsparse` aliases never leak into other tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEVICES

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = os.environ.get("RELCONV_TORCHSPARSE_TESTS")

SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import torch
import relconv.torchsparse
relconv.torchsparse.install()
# The tests compare with torch's dense conv3d; on a GPU torch lets cuDNN run that in TF32, an error
# of ~1e-3 that alone exceeds the tests' 1e-4 mean bound. The reference runs in exact fp32 here.
torch.backends.cudnn.allow_tf32 = False
sys.path.insert(0, {upstream!r})
from python import test_single_layer_convolution_forward, test_to_dense_forward
from torchsparse.nn import functional as F

# tests/test.py: both kernel-map modes, kernel sizes 2, 3, 5, strides 1, 2, 3; its thresholds.
diffs = []
for mode in ("hashmap", "hashmap_on_the_fly"):
    config = F.conv_config.get_default_conv_config()
    config.kmap_mode = mode
    F.conv_config.set_global_conv_config(config)
    for kernel_size in (2, 3, 5):
        for stride in (1, 2, 3):
            for half in (False, True):
                diffs.append(test_single_layer_convolution_forward(
                    kernel_size=kernel_size, stride=stride, device={device!r}, is_half=half))
mean_adiff = sum(d[0] for d in diffs) / len(diffs)
mean_rdiff = sum(d[1] for d in diffs) / len(diffs)
assert mean_adiff <= 1e-4, mean_adiff
assert mean_rdiff <= 1e-2, mean_rdiff
assert test_to_dense_forward(device={device!r}) <= 1e-5
print("upstream tests passed", len(diffs), mean_adiff, mean_rdiff)
"""


@pytest.mark.skipif(not UPSTREAM, reason="set RELCONV_TORCHSPARSE_TESTS to TorchSparse's tests directory")
@pytest.mark.parametrize("device", DEVICES)
def test_torchsparse_own_python_tests_pass(device):
    if not (Path(UPSTREAM) / "python" / "test_single_layer_conv.py").is_file():
        pytest.fail(f"RELCONV_TORCHSPARSE_TESTS={UPSTREAM} has no python/test_single_layer_conv.py")
    script = SCRIPT.format(root=str(ROOT), upstream=UPSTREAM, device=device)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "upstream tests passed" in done.stdout
