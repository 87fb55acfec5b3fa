"""PyG's RGCNConv and FastRGCNConv used as its docs show (conv(x, edge_index, edge_type)), timed with
the twins' own loop (standalone twin of the harness's pyg / pyg-fast rows; see
benchmarks/crosscheck.py).

    python -m benchmarks.standalone.pyg
"""

from __future__ import annotations

import torch

from benchmarks.standalone.loop import feature_copies, report

C = 64


def graph_cases(graph) -> dict:
    from torch_geometric.nn import FastRGCNConv, RGCNConv

    edge_index, edge_type, n, r = graph
    xs = feature_copies(n, C, torch.float32)
    out = {}
    for name, cls in (("rgcn-layer", RGCNConv), ("rgcn-layer-fast", FastRGCNConv)):
        conv = cls(C, C, r, aggr="mean").cuda()

        @torch.no_grad()
        def layer(conv=conv):
            return conv(next(xs), edge_index, edge_type)

        out[name] = layer
    return out


def main() -> None:
    from benchmarks.workloads.graphs import make_kg

    ei, et, n, r, _ = make_kg("AIFB", seed=0)
    report("pyg", graph_cases((ei.cuda(), et.cuda(), n, r)))


if __name__ == "__main__":
    main()
