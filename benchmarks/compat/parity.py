"""Parity of relconv's shims (and native twins) with the real spconv / TorchSparse on downstream backbones.

    source benchmarks/peers/activate.sh
    python -m benchmarks.compat.parity --out OUT_DIR            # GPU host, real library as reference
    python -m benchmarks.compat.parity --out OUT_DIR --dry-run  # CPU, shims only, tiny scans

Per backbone the reference library (the real one) builds the model from the downstream snapshot,
saves its initial state_dict, and runs; every candidate (the shim with the same state_dict, the
native twin with it converted by `relconv.convert`) runs the same input. For fp32 and fp16, training
mode and inference: the output coordinates must be the same set and, sorted, the same rows; the
features, the input-feature gradient and every parameter gradient of the backward of a fixed
projection of the outputs must agree within `TOLERANCE` (max |a - b| / max |b| per tensor).

Training gradients of a deep network with BatchNorm and ReLU are only as accurate as the precision
allows (BatchNorm's backward subtracts means over every voxel, ReLU switches on values rounding can
move), which can be far coarser than `TOLERANCE`; so can fp16 features. So the shim also runs in
float64 from the same state and input (`--no-accuracy` skips it), and every fp32 and fp16 run is
measured against that: a candidate is "as accurate" when each of its errors against float64 (in the
2-norm) is within the dtype's `TOLERANCE` or `ACCURACY_FACTOR` times the reference library's.
One fp32 training step is a single draw: rounding decides which ReLUs switch, and BatchNorm's
backward spreads each switch over a whole channel, so two fp32 runs of the same library that sum
in another order differ from each other about as much as either differs from float64. Each
library's fp32 step therefore also runs on inputs moved by one unit in the last place
(`--accuracy-repeats`, float64 on the same inputs), and the verdict compares median errors.
Writes parity.json and parity.md to OUT_DIR (after every backbone, so a cut-off run keeps its rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.compat import backbones as bb
from benchmarks.compat import native
from benchmarks.compat.spawn import run_child

TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2}


def sort_rows(coords: torch.Tensor) -> torch.Tensor:
    """The permutation that sorts integer rows lexicographically."""
    perm = torch.arange(coords.shape[0])
    for col in reversed(range(coords.shape[1])):
        perm = perm[torch.sort(coords[perm, col], stable=True).indices]
    return perm


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    """max |a - b| / max |b|, the denominator at least `floor`."""
    if a.shape != b.shape:
        return float("inf")
    if b.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(floor))


# A conv bias that a BatchNorm in training mode follows has a zero gradient in exact arithmetic, and
# every library leaves rounding noise there, which the tensor's own scale would make a huge relative
# error: a parameter gradient's error is taken relative to at least this fraction of the largest
# parameter gradient of the run.
GRAD_FLOOR = 1e-4


def grad_floor(grads: dict[str, torch.Tensor], norm: bool = False) -> float:
    """`GRAD_FLOOR` times the largest gradient (its 2-norm with `norm`, else its largest entry)."""
    sizes = [float(g.double().norm()) if norm else float(g.double().abs().max()) for g in grads.values()]
    return GRAD_FLOOR * max(sizes, default=0.0) or 1e-30


def compare_outputs(ref: dict, cand: dict, err=None) -> dict:
    """Per output: coordinate agreement and the features' error (`err`, default `rel_err`) after
    aligning rows by coordinates."""
    err = err or rel_err
    result = {}
    for name, (rc, rf) in ref.items():
        if name not in cand:
            result[name] = {"coords": "missing"}
            continue
        cc, cf = cand[name]
        rp, cp = sort_rows(rc), sort_rows(cc)
        rs, cs = rc[rp], cc[cp]
        distinct = (
            rs.shape[0] == torch.unique(rs, dim=0).shape[0]
            and cs.shape[0] == torch.unique(cs, dim=0).shape[0]
        )
        if rs.shape != cs.shape or not torch.equal(rs, cs):
            same_set = False
        else:
            same_set = distinct
        entry = {"rows": [int(rc.shape[0]), int(cc.shape[0])], "coords_same_set": same_set}
        entry["coords_same_order"] = bool(rc.shape == cc.shape and torch.equal(rc, cc))
        entry["feats_rel_err"] = err(cf[cp], rf[rp]) if same_set else None
        result[name] = entry
    return result


def compare_run(ref: dict, cand: dict, dtype: str) -> dict:
    tol = TOLERANCE[dtype]
    out = {}
    for phase in ("train", "infer"):
        outs = compare_outputs(ref[phase]["outputs"], cand[phase]["outputs"])
        errs = [e.get("feats_rel_err") for e in outs.values()]
        coords_ok = all(e.get("coords_same_set") for e in outs.values())
        feats = max((e for e in errs if e is not None), default=None)
        row = {"outputs": outs, "coords_ok": coords_ok, "feats_rel_err": feats}
        ok = coords_ok and feats is not None and feats <= tol
        if phase == "train":
            row["input_grad_rel_err"] = rel_err(cand[phase]["input_grad"], ref[phase]["input_grad"])
            rg, cg = ref[phase]["param_grads"], cand[phase]["param_grads"]
            row["param_grads_missing"] = sorted(set(rg) ^ set(cg))
            floor = grad_floor(rg)
            per = {k: rel_err(cg[k], rg[k], floor) for k in rg if k in cg}
            worst = max(per, key=per.get) if per else None
            row["param_grad_rel_err"] = per[worst] if worst else None
            row["param_grad_worst"] = worst
            ok = ok and row["input_grad_rel_err"] <= tol and not row["param_grads_missing"]
            ok = ok and (row["param_grad_rel_err"] or 0.0) <= tol
        row["pass"] = bool(ok)
        out[phase] = row
    return out


def norm_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    """|a - b| / |b| in the 2-norm (the denominator at least `floor`): unlike the max-based
    `rel_err`, not decided by the few entries where rounding moved a value across a ReLU's kink."""
    if a.shape != b.shape:
        return float("inf")
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(floor))


def _feats_error(run: dict, truth: dict) -> float | None:
    """The worst output's feature error (`norm_err`) against float64's, rows aligned by coordinates."""
    outs = compare_outputs(truth["outputs"], run["outputs"], norm_err)
    # sites that differ (or an output missing) make the run inaccurate whatever its features
    errs = [e.get("feats_rel_err") for e in outs.values()]
    return max((float("inf") if e is None else e for e in errs), default=None)


def _train_errors(run: dict, truth: dict) -> dict:
    """One training step's errors (`norm_err`, worst output / parameter) against float64's."""
    grads, want = run["param_grads"], truth["param_grads"]
    floor = grad_floor(want, norm=True)
    per = [norm_err(grads[k], want[k], floor) for k in want if k in grads]
    return {
        "feats": _feats_error(run, truth),
        "input_grad": norm_err(run["input_grad"], truth["input_grad"]),
        "param_grad": max(per, default=None),
    }


def accuracy(runs: dict[str, dict], truth: dict) -> dict:
    """Per run of one dtype (by library) and phase: its errors (`norm_err`, worst output /
    parameter) against the float64 run `truth`, output rows aligned by coordinates. A training
    step repeated on perturbed inputs (`train_repeats`, each against float64 on the same input)
    gives the median of its errors, and every error under "samples"."""
    out = {}
    for lib, run in runs.items():
        pairs = [(run["train"], truth["train"])]
        # an fp16 run has no repeats (its features cannot hold the perturbation): one step only
        pairs += list(zip(run.get("train_repeats", []), truth.get("train_repeats", []), strict=False))
        steps = [_train_errors(r, t) for r, t in pairs]
        train = {}
        for key in ("feats", "input_grad", "param_grad"):
            values = [e[key] for e in steps if e[key] is not None]
            train[key] = statistics.median(values) if values else None
        if len(steps) > 1:
            train["samples"] = {key: [e[key] for e in steps] for key in ("feats", "input_grad", "param_grad")}
        out[lib] = {"train": train, "infer": {"feats": _feats_error(run["infer"], truth["infer"])}}
    return out


# A candidate's error against float64 may exceed the reference library's by this factor and still
# count as as accurate: two fp32 runs' errors against the same float64 result vary by about that.
ACCURACY_FACTOR = 2.0


def as_accurate(errors: dict, reference: str, candidate: str, tol: float) -> dict:
    """Per phase: whether every error of `candidate` against float64 is within `tol` or within
    `ACCURACY_FACTOR` times the reference library's."""
    verdict = {}
    for phase, ref_row in errors[reference].items():
        cand_row = errors[candidate][phase]
        verdict[phase] = all(
            c is not None and (c <= tol or (r is not None and c <= ACCURACY_FACTOR * r))
            for key, r in ref_row.items()
            if key != "samples"
            for c in [cand_row.get(key)]
        )
    return verdict


def run_backbone(name: str, args, work: Path) -> dict:
    base = ["--downstream", str(args.downstream), "--device", args.device]
    base += ["--repeats", str(args.accuracy_repeats if args.accuracy else 1)]
    base += ["--scene-cache", str(work / "scenes"), *(["--tiny"] if args.tiny else [])]
    common = [*base, "--dtypes", args.dtypes]
    ref_file = work / f"{name}-{args.reference}.pt"
    report: dict = {"backbone": name, "reference": args.reference, "candidates": {}}
    # spconv 2.3's CPU kernels race under several OpenMP threads (its outputs differed by up to 15%
    # from run to run on 2 threads, and were bitwise repeatable on one): CPU runs are single-threaded.
    env = {"OMP_NUM_THREADS": "1"} if args.device == "cpu" else None
    err = run_child(["parity", name, args.reference, str(ref_file), *common], args.timeout, env)
    if err:
        report["error"] = f"{args.reference}: {err}"
        return report
    ref = torch.load(ref_file)
    report["reference_library"] = ref["library"]
    first = next(iter(ref["dtypes"].values()))["train"]["outputs"]
    report["reference_rows"] = {k: int(c.shape[0]) for k, (c, _) in first.items()}
    state_file = work / f"{name}-state.pt"
    torch.save(ref["state"], state_file)
    # per dtype, per library: the runs measured against float64
    runs = {d: {args.reference: r} for d, r in ref["dtypes"].items()}
    for cand in args.candidates:
        if cand == "native" and name not in native.TWINS:
            report["candidates"][cand] = {"skipped": "no native twin"}
            continue
        if cand == args.reference:
            continue
        cand_file = work / f"{name}-{cand}.pt"
        err = run_child(
            ["parity", name, cand, str(cand_file), "--state", str(state_file), *common], args.timeout, env
        )
        if err:
            report["candidates"][cand] = {"error": err}
            continue
        got = torch.load(cand_file)
        report["candidates"][cand] = {
            "library": got["library"],
            "dtypes": {d: compare_run(ref["dtypes"][d], got["dtypes"][d], d) for d in ref["dtypes"]},
        }
        for d, r in got["dtypes"].items():
            runs.setdefault(d, {})[cand] = r
    if args.accuracy and runs and bb.BACKBONES[name].family in ("spconv", "torchsparse"):
        truth_file = work / f"{name}-fp64.pt"
        child = ["parity", name, "shim", str(truth_file), "--state", str(state_file), *base]
        err = run_child([*child, "--dtypes", "fp64"], args.timeout, env)
        if err:
            report["accuracy"] = {"error": err}
        else:
            truth = torch.load(truth_file)["dtypes"]["fp64"]
            errors = {d: accuracy(by_lib, truth) for d, by_lib in runs.items()}
            verdicts = {
                d: {
                    c: as_accurate(errors[d], args.reference, c, TOLERANCE[d])
                    for c in by_lib
                    if c != args.reference
                }
                for d, by_lib in runs.items()
            }
            report["accuracy"] = {"errors": errors, "as_accurate": verdicts}
    return report


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2e}"


def _cells(*values) -> str:
    return "| " + " | ".join(str(v) for v in values) + " |"


def _row_cells(backbone: str, cand: str, dtype: str, phase: str, row: dict) -> str:
    train = phase == "train"
    grads = [
        _fmt(row.get("input_grad_rel_err")),
        f"{_fmt(row.get('param_grad_rel_err'))} ({row.get('param_grad_worst')})",
    ]
    coords = "same" if row["coords_ok"] else "DIFFER"
    ok = "yes" if row["pass"] else "NO"
    return _cells(
        backbone, cand, dtype, phase, coords, _fmt(row["feats_rel_err"]), *(grads if train else ["", ""]), ok
    )


def _acc(row: dict, key: str) -> str:
    """An error against float64; over repeated steps, the median with the range of the samples."""
    samples = [v for v in row.get("samples", {}).get(key, []) if v is not None]
    if len(samples) < 2:
        return _fmt(row.get(key))
    return f"{_fmt(row.get(key))} ({_fmt(min(samples))} to {_fmt(max(samples))})"


def _accuracy_lines(reports: list[dict]) -> list[str]:
    rows = [r for r in reports if "accuracy" in r]
    if not rows:
        return []
    lines = [
        "",
        "Against float64 (relconv's shim in float64, same state and input; |a - b| / |b| in the "
        f"2-norm, worst tensor; as accurate: within the dtype's tolerance {TOLERANCE} or "
        f"{ACCURACY_FACTOR:g}x the reference's error; repeated fp32 training steps: the median, "
        "with the range over the steps):",
        "",
        _cells(
            "backbone", "library", "dtype", "phase", "features", "input grad", "param grad", "as accurate"
        ),
        _cells(*["---"] * 8),
    ]
    for r in rows:
        acc = r["accuracy"]
        if "error" in acc:
            why = "error: " + acc["error"].splitlines()[-1]
            lines.append(_cells(r["backbone"], "-", "-", "-", why, "", "", ""))
            continue
        for dtype, by_lib in acc["errors"].items():
            for lib, phases in by_lib.items():
                for phase, row in phases.items():
                    verdict = acc["as_accurate"][dtype].get(lib, {}).get(phase)
                    lines.append(
                        _cells(
                            r["backbone"],
                            lib,
                            dtype,
                            phase,
                            _acc(row, "feats"),
                            _acc(row, "input_grad") if phase == "train" else "",
                            _acc(row, "param_grad") if phase == "train" else "",
                            "reference" if verdict is None else ("yes" if verdict else "NO"),
                        )
                    )
    return lines


def markdown(reports: list[dict]) -> str:
    lines = [
        "# Shim parity on downstream backbones",
        "",
        f"Tolerances (max |a - b| / max |b| per tensor): {TOLERANCE}. "
        "Coordinates: the same set, then the same rows once sorted.",
        "",
        _cells(
            "backbone",
            "candidate",
            "dtype",
            "phase",
            "coords",
            "features",
            "input grad",
            "param grad",
            "pass",
        ),
        _cells(*["---"] * 9),
    ]
    for r in reports:
        if "error" in r:
            lines.append(
                _cells(
                    r["backbone"], "-", "-", "-", "error: " + r["error"].splitlines()[-1], "", "", "", "no"
                )
            )
            continue
        for cand, c in r["candidates"].items():
            if "dtypes" not in c:
                why = c.get("skipped") or "error: " + c["error"].splitlines()[-1]
                lines.append(
                    _cells(r["backbone"], cand, "-", "-", why, "", "", "", "-" if "skipped" in c else "no")
                )
                continue
            for dtype, phases in c["dtypes"].items():
                lines += [_row_cells(r["backbone"], cand, dtype, phase, row) for phase, row in phases.items()]
    lines += _accuracy_lines(reports)
    refs = "; ".join(f"{r['backbone']}: {r.get('reference_library', '?')}" for r in reports)
    rows = [f"- {r['backbone']}: {r['reference_rows']}" for r in reports if "reference_rows" in r]
    return "\n".join([*lines, "", "Reference libraries: " + refs, "", "Reference output rows:", *rows]) + "\n"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for parity.json and parity.md")
    p.add_argument("--backbones", default=",".join(bb.BACKBONES), help="comma-separated subset")
    p.add_argument("--reference", default="real", choices=("real", "shim"))
    p.add_argument("--candidates", default="shim,native")
    p.add_argument("--downstream", type=Path, default=bb.DEFAULT_DOWNSTREAM.resolve())
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="fp32,fp16")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per child process")
    p.add_argument(
        "--no-accuracy",
        dest="accuracy",
        action="store_false",
        help="skip the float64 run that measures each fp32 run's own accuracy",
    )
    p.add_argument(
        "--accuracy-repeats",
        type=int,
        default=3,
        help="fp32 training steps per library measured against float64, each after the first on a "
        "one-ulp perturbed input; the verdict compares medians",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU, tiny scans, fp32, the shim as reference and the native twins as candidates",
    )
    args = p.parse_args(argv)
    if args.dry_run:
        args.device, args.tiny, args.dtypes, args.reference, args.candidates = (
            "cpu",
            True,
            "fp32",
            "shim",
            "native",
        )
    args.candidates = [c for c in args.candidates.split(",") if c]
    args.backbones = [b for b in args.backbones.split(",") if b]
    unknown = [b for b in args.backbones if b not in bb.BACKBONES]
    if unknown:
        p.error(f"unknown backbones {unknown}; known: {sorted(bb.BACKBONES)}")
    args.downstream = args.downstream.resolve()
    return args


def main(argv=None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    reports = []
    with tempfile.TemporaryDirectory(prefix="relconv-compat-") as tmp:
        for name in args.backbones:
            reports.append(run_backbone(name, args, Path(tmp)))
            (args.out / "parity.json").write_text(json.dumps(reports, indent=1))
            (args.out / "parity.md").write_text(markdown(reports))
            print(markdown(reports[-1:]).split("\n", 6)[-1], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
