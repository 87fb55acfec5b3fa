"""Merges the results.json of several runs (e.g. one per 10-minute GPU call) into one directory.

    python -m benchmarks.merge --out benchmarks/results RUN_DIR [RUN_DIR ...]

A later directory's rows for a case replace all earlier rows of that case (a re-run may have
fewer implementations, e.g. where a crash row stood before). The environment
is the first run's, with every run's peers and ceilings kept under "runs"; a directory that is
itself a merge (benchmarks/results) contributes its own runs, so new runs extend the list. Every
row keeps the GPU it ran on under "gpu" (its run's device), so that tables can say which rows come
from another card than the environment's. Plots and the table are redrawn from the merged rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.harness import report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.merge", description=__doc__)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("runs", nargs="+", type=Path, help="directories holding results.json")
    args = p.parse_args(argv)
    rows: dict[str, list[dict]] = {}
    env, runs = None, []
    for run_dir in args.runs:
        data = json.loads((run_dir / "results.json").read_text())
        env = env or data["environment"]
        runs.extend(
            data["environment"].get("runs")
            or [{"dir": str(run_dir), "args": data["args"], "environment": data["environment"]}]
        )
        fresh: dict[str, list[dict]] = {}
        for row in data["rows"]:
            row.setdefault("gpu", data["environment"]["device"])
            fresh.setdefault(row["case"], []).append(row)
        rows.update(fresh)
    merged = dict(env, runs=runs)
    args.out.mkdir(parents=True, exist_ok=True)
    all_rows = [row for case_rows in rows.values() for row in case_rows]
    report.write_json(args.out / "results.json", merged, all_rows, {"merged_from": [r["dir"] for r in runs]})
    plots = report.plot(all_rows, args.out)
    print(
        f"merged {len(all_rows)} rows into {args.out / 'results.json'}; plots: "
        f"{', '.join(p.name for p in plots) or 'none'}"
    )
    print(report.table(all_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
