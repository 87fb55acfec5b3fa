"""torch.compile(fullgraph=True) traces the ops (fake kernels, autograd) and matches eager."""

import pytest
import torch

from relconv import relational_conv
from tests.conftest import DEVICES
from tests.ops.maps import random_map, rel_error


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_matches_eager_forward_and_backward(device):
    torch._dynamo.reset()
    rmap = random_map(40, 30, 5, 300, device)
    x = torch.randn(40, 8, device=device, requires_grad=True)
    w = torch.randn(5, 2, 4, 3, device=device, requires_grad=True)

    def layer(x, w):
        return torch.relu(relational_conv(x, w, rmap, groups=2)) * 2.0

    compiled = torch.compile(layer, fullgraph=True)
    out_c = compiled(x, w)
    out_e = layer(x, w)
    assert rel_error(out_c, out_e) < 1e-6
    gc = torch.autograd.grad(out_c.sum(), (x, w))
    ge = torch.autograd.grad(out_e.sum(), (x, w))
    assert all(rel_error(a, b) < 1e-6 for a, b in zip(gc, ge, strict=True))
