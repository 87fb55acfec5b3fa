"""Runs the demo parts in turn on the GPU if there is one, else on the CPU."""

import argparse
import importlib

import torch

PARTS = {
    "ops": "relconv.demo.ops_demo",
    "voxel": "relconv.demo.voxel_demo",
    "graph": "relconv.demo.graph_demo",
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m relconv.demo", description=__doc__)
    parser.add_argument("--part", choices=["all", *PARTS], default="all")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"relconv demo on {device} (torch {torch.__version__})")
    for name, module in PARTS.items():
        if args.part in ("all", name):
            importlib.import_module(module).run(device)


if __name__ == "__main__":
    main()
