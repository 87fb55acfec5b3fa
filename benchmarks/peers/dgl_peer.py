"""DGL peer for the graph suite on CPU: `dgl.nn.pytorch.RelGraphConv`.

PyPI's `dgl` 2.1 is CPU-only and its `dgl.graphbolt` submodule imports `torchdata` datapipes that
current torch lacks. R-GCN never touches graphbolt, so at import time an empty stand-in module is
registered under that name in `sys.modules` (nothing on disk is patched). Put the unpacked wheel on
PYTHONPATH (see benchmarks/README.md).

Layout: RelGraphConv's `linear_r.W` is [R, C_in, C_out] (or [B, C_in, C_out] with
`linear_r.coeff` [R, B] for bases), `loop_weight` is the root [C_in, C_out] and `h_bias` the bias:
the same tensors as relconv's `weight`/`comp`/`root`/`bias`. DGL always sums messages, so mean
aggregation is given as the per-edge norm 1 / deg_r(target).
"""

from __future__ import annotations

import sys
import types

import torch


def _import_dgl():
    if "dgl.graphbolt" not in sys.modules:
        stub = types.ModuleType("dgl.graphbolt")
        stub.__path__ = []  # a package, so `from dgl.graphbolt import x` fails cleanly if ever used
        sys.modules["dgl.graphbolt"] = stub
    import dgl

    return dgl


def _importer(err: BaseException) -> str:
    """The innermost non-importlib frame of a failed import ("dgl/x.py:12"), to attribute it.

    In the DGL 2.1 wheels (cp311 and cp312, identical Python sources) only dgl/graphbolt/* imports
    torchdata, and the stub above keeps that package from loading; the GPU host still reported
    "No module named 'torchdata'", so the row now names the file that asked for it.
    """
    import traceback

    frames = [f for f in traceback.extract_tb(err.__traceback__) if "importlib" not in f.filename]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{'/'.join(f.filename.split('/')[-3:])}:{f.lineno}"


def available() -> tuple[bool, str]:
    try:
        dgl = _import_dgl()
    except Exception as err:  # dgl's import runs native code and many submodules; any failure = absent
        return False, f"not importable ({type(err).__name__}: {err}; imported from {_importer(err)})"
    return True, dgl.__version__


def set_num_threads(count: int) -> None:
    """DGL's own OpenMP pool (its sparse kernels do not use torch's intra-op pool)."""
    _import_dgl().utils.set_num_threads(count)


def make_graph(edge_index: torch.Tensor, num_nodes: int):
    dgl = _import_dgl()
    return dgl.graph((edge_index[0], edge_index[1]), num_nodes=num_nodes)


def mean_norm(edge_index: torch.Tensor, edge_type: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """[E, 1] per-edge factor 1 / deg_r(target): R-GCN's per-relation mean as a weighted sum."""
    key = edge_type * num_nodes + edge_index[1]
    _, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
    return (1.0 / counts[inverse].float()).unsqueeze(1)


def rgcn_layer(
    state_dict: dict, in_channels: int, out_channels: int, num_relations: int, num_bases: int | None = None
) -> torch.nn.Module:
    """RelGraphConv with relconv's RGCNConv weights (root -> self loop, bias -> h_bias)."""
    _import_dgl()
    from dgl.nn.pytorch import RelGraphConv

    layer = RelGraphConv(
        in_channels,
        out_channels,
        num_relations,
        regularizer="basis" if num_bases else None,
        num_bases=num_bases,
        bias="bias" in state_dict,
        self_loop="root" in state_dict,
    )
    with torch.no_grad():
        layer.linear_r.W.copy_(state_dict["weight"])
        if num_bases:
            layer.linear_r.coeff.copy_(state_dict["comp"])
        if "root" in state_dict:
            layer.loop_weight.copy_(state_dict["root"])
        if "bias" in state_dict:
            layer.h_bias.copy_(state_dict["bias"])
    return layer
