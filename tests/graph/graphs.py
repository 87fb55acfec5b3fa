"""Small random typed graphs and helpers shared by the graph tests."""

from __future__ import annotations

import torch
from torch import Tensor


def random_graph(
    num_src: int = 30, num_dst: int = 30, num_edges: int = 150, num_relations: int = 5, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """(edge_index [2, E], edge_type [E]) with duplicate edges, an empty last relation and, because
    targets are drawn from the first 90 % of nodes only, target nodes without any edge."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_src, (num_edges,), generator=gen)
    dst = torch.randint(0, max(1, int(num_dst * 0.9)), (num_edges,), generator=gen)
    edge_type = torch.randint(0, max(1, num_relations - 1), (num_edges,), generator=gen)
    return torch.stack([src, dst]), edge_type


def features(n: int, c: int, seed: int = 1, dtype: torch.dtype = torch.float32) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=gen, dtype=torch.float64).to(dtype)


def paired_layers(pyg_cls: type, relconv_cls: type, *args, **kwargs):
    """A PyG layer and a relconv layer holding the same state_dict (loaded unchanged)."""
    torch.manual_seed(0)
    ref = pyg_cls(*args, **kwargs).double()
    ours = relconv_cls(*args, **kwargs).double()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def grads(module: torch.nn.Module, *inputs: Tensor) -> dict[str, Tensor]:
    """Gradients of every parameter and floating input after the previous backward."""
    out = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    out.update(
        {f"input{i}": t.grad.clone() for i, t in enumerate(inputs) if t is not None and t.grad is not None}
    )
    return out


def assert_close_grads(a: dict[str, Tensor], b: dict[str, Tensor], **tol) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=lambda m, k=k: f"{k}: {m}", **tol)
