"""One R-GCN layer, relconv vs PyG RGCNConv / FastRGCNConv (and DGL RelGraphConv on CPU).

    python -m benchmarks.graph.bench_rgcn [--device cuda|cpu] [--tiny] [--out benchmarks/results/graph]

Synthetic graphs with the AIFB / MUTAG / BGS / AM statistics (plus the real ml-100k KG), C = 16 and
64 on the GPU, forward and forward+backward, fresh and cached map, all implementations loaded with
the same state_dict and checked for agreement before timing (CUDA events, median of 20 after
warm-up, peak memory). This selects the single-layer cases of the shared graph suite
(`benchmarks/graph_suite.py`, runner `benchmarks/run.py`); on a GPU machine the CPU cases run too.
Writes `<out>/results.json` and plots; prints the table last.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.graph.bench_rgcn", description=__doc__)
    p.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--out", default="benchmarks/results/graph")
    p.add_argument("--tiny", action="store_true", help="tiny graph, few runs (CPU smoke test)")
    p.add_argument("--model", action="store_true", help="also time the 2-layer R-GCN cases")
    args, rest = p.parse_known_args(argv)
    cases = "graph/*/layer/*,graph/*/rgcn2/*" if args.model else "graph/*/layer/*"
    forwarded = ["--suite", "graph", "--device", args.device, "--out", args.out, "--cases", cases]
    return run.main(forwarded + (["--tiny"] if args.tiny else []) + rest)


if __name__ == "__main__":
    sys.exit(main())
