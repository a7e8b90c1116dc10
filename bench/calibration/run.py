"""Calibrate the step-time model on published Megatron runs and report its error.

    .venv/bin/python bench/calibration/run.py            # fit, hold-out checks, write results
    .venv/bin/python bench/calibration/run.py --no-fit   # only score the committed parameters (writes nothing)
    .venv/bin/python bench/calibration/run.py --render   # rewrite results.md from results.json
    .venv/bin/python bench/calibration/run.py --coverage-only  # recompute the interval coverage in results.*

Splits: in-sample, release hold-out, leave-one-source-out, leave-one-family-out, leave-one-GPU-out, each with the
constant-MFU baseline (one MFU per precision class x dense/MoE, fitted on the same training side) and, for the
held-out ones, the coverage of the 80 % interval every estimate states (its residuals exclude the row's group).
The fits (about 20) run in a few processes; then run release_holdout.py, which writes the coverage cells.

Data: tests/data/calibration/published_calibration.json (copy of the project's shared calibration file).
The row rules, the prediction in each publisher's FLOP convention, the fit and the hold-out checks are
`megapilot.estimate.calibration` (its docstring states the rules); this script reads the rows, runs
them and writes results.json and results.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from megapilot.errors import MegapilotError
from megapilot.estimate.calibration import (
    PRIOR,
    PUBLISHER_CONVENTION,
    TRAIN_RELEASES,
    AnyRow,
    CalibrationRow,
    ConstantMfu,
    ErrorSummary,
    Fitter,
    PublishedRun,
    ReleaseRow,
    baseline_held_out,
    calibration_rows,
    constant_mfu_errors,
    errors,
    fit,
    gpu_of,
    leave_one_family_out,
    leave_one_gpu_out,
    leave_one_source_out,
    model_family,
    release_error,
    release_row,
    resolve_layout,
    same_layout_repeats,
    split_by_release,
    summary,
)
from megapilot.estimate.coverage import (
    CoverageCell,
    ErrorBand,
    error_band,
    family_of,
    mechanisms,
    nearest_coverage,
    precision_class,
    with_mechanisms,
)
from megapilot.estimate.efficiency import CALIBRATED, EfficiencyParams
from megapilot.estimate.flops import flops_per_token
from megapilot.estimate.published import PublishedLayout, enter_published_run, parenthesized_run
from megapilot.spec import GPUSpec, ModelSpec, ParallelConfig

DATA = ROOT / "tests" / "data" / "calibration" / "published_calibration.json"
RELEASE_DATA = ROOT / "tests" / "data" / "calibration" / "published_calibration_2025.json"
OUT_DIR = Path(__file__).resolve().parent


def load_rows() -> tuple[list[CalibrationRow], list[dict[str, str]]]:
    """The calibration rows of the committed data file, and the excluded ones as report entries."""
    runs = [PublishedRun.model_validate(raw) for raw in json.loads(DATA.read_text())]
    rows, excluded = calibration_rows(runs)
    return rows, [e._asdict() for e in excluded]


def release_tables() -> list[tuple[dict[str, Any], float | None, str]]:
    """Each newer table row and the run its parentheses print (`parenthesized_run`: the other FP8 granularity), with
    its tokens/s/GPU and where that figure comes from."""
    found: list[tuple[dict[str, Any], float | None, str]] = []
    for raw in json.loads(RELEASE_DATA.read_text()):
        found.append((raw, (raw.get("measured") or {}).get("tokens_per_sec_per_gpu"), "printed"))
        beside = parenthesized_run(raw)
        if beside is not None:
            how = "TFLOP/s in parentheses x the row's tokens per TFLOP" if beside.derived_from_tflops else "parentheses"
            found.append((beside.row, beside.tokens_per_s_per_gpu, how))
    return found


def gemm_format(layout: PublishedLayout) -> str:
    """The GEMM format a row ran, for the report's groups: bf16, fp8-cs (per-tensor current scaling, what the
    tables' plain "FP8" ran), fp8-blockwise, fp8-delayed, mxfp8, nvfp4."""
    precision, recipe = layout.gemm_precision
    if precision != "fp8":
        return precision
    return "fp8-cs" if recipe in (None, "tensorwise") else f"fp8-{recipe}"


def load_release_rows() -> tuple[list[ReleaseRow], dict[str, dict[str, Any]]]:
    """Every newer row typed in as published (`enter_published_run`), its parenthesized run beside it, and by id what
    the report prints of it: the layout, what was retyped, or the refusal."""
    rows, notes = [], {}
    for raw, published, figure in release_tables():
        layout = PublishedLayout.from_row(raw)
        note: dict[str, Any] = {"figure": figure,
            "model": layout.model, "gpu": layout.gpu, "fsdp": layout.fsdp, "published_tokens_per_s_per_gpu": published,
            "precision": precision_class(layout.gemm_precision.precision), "format": gemm_format(layout),
            "layout": f"TP{layout.tp} PP{layout.pp} VP{layout.vp or 1} CP{layout.cp} EP{layout.ep or 1} "
                      f"MBS{layout.mbs} GBS{layout.gbs}"}
        notes[layout.id] = note
        try:
            entry = enter_published_run(layout)
        except MegapilotError as refusal:
            note["refused"] = str(refusal)
            continue
        note["retyped"] = entry.retyped
        note["fits"] = entry.result.fits
        if published:
            rows.append(release_row(layout.id, entry.case, published))
    return rows, notes


def _held_out_by_release(judged: list[ReleaseRow]) -> dict[str, dict[str, float]]:
    """The committed parameters on the releases the fit never saw, all rows and per family
    (release_holdout.md lists them row by row)."""
    errs = {r.id: release_error(r, CALIBRATED) for r in judged}
    groups = {"all": list(errs.values())} | {
        f"family={family}": [errs[r.id] for r in judged if r.family == family]
        for family in sorted({r.family for r in judged})}
    return {name: _summary_doc(values) for name, values in groups.items()}


def _summary_doc(errs: list[float]) -> dict[str, float]:
    return _as_doc(summary(errs))


def _as_doc(found: ErrorSummary) -> dict[str, float]:
    return dict(found._asdict())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-fit", action="store_true", help="score the committed CALIBRATED parameters only")
    parser.add_argument("--render", action="store_true", help="rewrite results.md from results.json, fitting nothing")
    parser.add_argument("--coverage-only", action="store_true",
                        help="recompute the interval coverage in results.json/.md from its stored held-out errors")
    args = parser.parse_args(argv)
    if args.render:
        (OUT_DIR / "results.md").write_text(_markdown(json.loads((OUT_DIR / "results.json").read_text())))
        return 0
    if args.coverage_only:
        stored = json.loads((OUT_DIR / "results.json").read_text())
        coverage_only(stored, load_rows()[0], load_release_rows()[0])
        (OUT_DIR / "results.json").write_text(json.dumps(stored, indent=1) + "\n")
        (OUT_DIR / "results.md").write_text(_markdown(stored))
        return 0

    rows, excluded = load_rows()
    release, _ = load_release_rows()
    seen, judged = split_by_release(release)
    resolved = {row.id: resolve_layout(row) for row in rows}
    layouts = {row_id: layout for row_id, (layout, _) in resolved.items()}
    committed = errors(rows, layouts, CALIBRATED)
    report: dict[str, Any] = {"rows_used": len(rows), "excluded": excluded, "prior": asdict(PRIOR),
                              "train_releases": list(TRAIN_RELEASES),
                              "committed_parameters": asdict(CALIBRATED),
                              "committed_summary": _summary_doc(list(committed.values())),
                              "release_rows_in_fit": {r.id: round(release_error(r, CALIBRATED), 4) for r in seen},
                              "held_out_by_release": _held_out_by_release(judged)}
    if not args.no_fit:
        fits = ParallelFits(rows, layouts, release)
        _fit_report(report, rows, release, seen, judged, layouts, fits.record)  # learn which fits are needed
        fits.run()
        _fit_report(report, rows, release, seen, judged, layouts, fits.record)
    report["row_groups"] = {row.id: [f"family={family_of(row.model)}", f"gpu={row.cluster.gpu.name}",
                                     f"precision={row.training.precision}"] for row in rows} | {
        r.id: [f"family={r.family}", f"gpu={r.case.cluster.gpu.name}", f"precision={r.case.training.precision}"]
        for r in release}
    report["rows"] = [_row_record(row, layouts[row.id], resolved[row.id][1], committed[row.id]) for row in rows]
    if not args.no_fit:  # the committed results always carry the fit and its hold-out checks
        (OUT_DIR / "results.json").write_text(json.dumps(report, indent=1) + "\n")
        (OUT_DIR / "results.md").write_text(_markdown(report))
    print(_markdown(report))
    return 0


def _fit_report(report: dict[str, Any], rows: list[CalibrationRow], release: list[ReleaseRow],
                seen: list[ReleaseRow], judged: list[ReleaseRow], layouts: dict[str, ParallelConfig],
                fitter: Fitter) -> None:
    """The fit, every hold-out split and the baseline beside them, into `report`."""
    fitted = fitter(rows, layouts, seen)
    fitted_errors = errors(rows, layouts, fitted)
    report["fitted_parameters"] = asdict(fitted)
    report["fitted_summary"] = _summary_doc(list(fitted_errors.values())
                                            + [release_error(r, fitted) for r in seen])
    report["leave_one_source_out"] = {
        source: {"held_out": _as_doc(fold.held_out), "fitted": asdict(fold.fitted),
                 "errors": {k: round(v, RESIDUAL_DIGITS) for k, v in fold.errors.items()}}
        for source, fold in leave_one_source_out(rows, layouts, release, fitter).items()
    }
    report["prior_summary"] = _summary_doc(list(errors(rows, layouts, PRIOR).values())
                                           + [release_error(r, PRIOR) for r in seen])
    report["constant_mfu_baseline"] = _summary_doc(constant_mfu_errors(rows))
    report["splits"] = _splits(report, rows, release, seen, judged, layouts, fitted, fitted_errors, fitter)


# ---- every fit once, in a few processes ----------------------------------------------------------------
# The splits need about 20 fits of ~25 s each; they are independent, so a small pool runs them side by side.
# The rows reach the forked workers as module state (only ids cross the pipe).

FIT_WORKERS = 5
_STATE: dict[str, Any] = {}
FitKey = tuple[tuple[str, ...], tuple[str, ...]]


def _fit_by_ids(key: FitKey) -> EfficiencyParams:
    rows, release, layouts = _STATE["rows"], _STATE["release"], _STATE["layouts"]
    return fit([rows[i] for i in key[0]], layouts, [release[i] for i in key[1]])


class ParallelFits:
    """A `fit` stand-in that first records the training sets asked for (answering the prior), then, after `run`,
    answers each with its fitted parameters."""

    def __init__(self, rows: list[CalibrationRow], layouts: dict[str, ParallelConfig],
                 release: list[ReleaseRow]) -> None:
        _STATE.update(rows={r.id: r for r in rows}, release={r.id: r for r in release}, layouts=layouts)
        self.wanted: dict[FitKey, None] = {}
        self.done: dict[FitKey, EfficiencyParams] = {}

    def record(self, rows: list[CalibrationRow], layouts: dict[str, ParallelConfig],
               release: list[ReleaseRow]) -> EfficiencyParams:
        key = (tuple(r.id for r in rows), tuple(r.id for r in release))
        if key in self.done:
            return self.done[key]
        self.wanted[key] = None
        return PRIOR

    def run(self) -> None:
        keys = [key for key in self.wanted if key not in self.done]
        with multiprocessing.get_context("fork").Pool(FIT_WORKERS) as pool:
            self.done.update(zip(keys, pool.map(_fit_by_ids, keys), strict=True))


def _row_record(row: CalibrationRow, layout: ParallelConfig, fits: bool, error: float) -> dict[str, Any]:
    ours_full = flops_per_token(row.model, row.training.seq_length, convention="megatron_full_attention").total
    check = row.publisher_check_flops_per_token
    return {
        "id": row.id, "source": row.source, "gpu": row.cluster.gpu.alias, "precision": row.training.precision,
        "layout": {"tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp, "dp": layout.dp,
                   "mbs": layout.mbs, "recompute": layout.recompute, "sp": layout.sequence_parallel},
        "mbs_chosen": row.choose_mbs, "recompute_chosen": row.choose_recompute, "fits_by_our_memory_model": fits,
        "publisher_convention": PUBLISHER_CONVENTION[row.source],
        "published_tflops_per_gpu": round(row.published_tflops, 1),
        "predicted_tflops_per_gpu": round(row.published_tflops * (1 + error), 1),
        "error": round(error, 4),
        "flops_per_token_vs_file_check": None if check is None else round(ours_full / check, 4),
    }


RESIDUAL_DIGITS = 4  # results.json and calibration_coverage.json store each held-out error to 0.01 %
SPLIT_KEYS = {"leave-one-source-out": lambda r: r.source, "leave-one-family-out": model_family,
              "leave-one-GPU-out": gpu_of}


def _splits(report: dict[str, Any], rows: list[CalibrationRow], release: list[ReleaseRow], seen: list[ReleaseRow],
            judged: list[ReleaseRow], layouts: dict[str, ParallelConfig], fitted: Any,
            fitted_errors: dict[str, float], fitter: Fitter) -> dict[str, Any]:
    """Every split, the model beside the constant-MFU baseline (fitted on the same training side), and how often
    the true value fell inside the stated 80 % interval when the interval's residuals never saw the row's group."""
    every: list[AnyRow] = [*rows, *release]
    cells = {r.id: _cell(r) for r in every}
    model: dict[str, dict[str, float]] = {
        "in-sample": fitted_errors | {r.id: release_error(r, fitted) for r in seen},
        "release hold-out": {r.id: release_error(r, fitted) for r in judged},
        "leave-one-source-out": {k: v for fold in report["leave_one_source_out"].values()
                                 for k, v in fold["errors"].items()},
    }
    family_folds = leave_one_family_out(rows, layouts, release, fitter)
    gpu_folds = leave_one_gpu_out(rows, layouts, release, fitter)
    model["leave-one-family-out"] = {k: v for fold in family_folds.values() for k, v in fold.errors.items()}
    model["leave-one-GPU-out"] = {k: v for fold in gpu_folds.values() for k, v in fold.errors.items()}
    trained = [*rows, *seen]
    trained_baseline = ConstantMfu.fitted(trained)  # the in-sample fit is the one the release hold-out judges
    baseline: dict[str, dict[str, float]] = {
        "in-sample": {r.id: trained_baseline.error(r) for r in trained},
        "release hold-out": {r.id: trained_baseline.error(r) for r in judged},
    } | {name: baseline_held_out(every, key) for name, key in SPLIT_KEYS.items()}
    # the interval's residuals: each row's errors when its family, then its GPU, was held out, rounded as the
    # product reads them (calibration_coverage.json), so that --coverage-only recomputes the same figures
    # (a parenthesized run at its twin's layout adds none: calibration.same_layout_repeats)
    held_out = {r.id: (round(model["leave-one-family-out"][r.id], RESIDUAL_DIGITS),
                       round(model["leave-one-GPU-out"][r.id], RESIDUAL_DIGITS)) for r in every}
    repeats = same_layout_repeats(release)
    residuals = {k: pair for k, pair in held_out.items() if k not in repeats}
    groups: dict[str, Any] = {"release hold-out": release_group(judged)} | SPLIT_KEYS
    by_id = {r.id: r for r in every}
    result: dict[str, Any] = {}
    for name, errs in model.items():
        entry: dict[str, Any] = {"model": _summary_doc(list(errs.values())),
                                 "baseline": _summary_doc([baseline[name][k] for k in errs])}
        if name in groups:
            key = groups[name]
            entry |= _interval_coverage(errs, residuals, cells, by_id, key)
            entry["by_group"] = {
                group: {"model": _summary_doc([errs[r.id] for r in every if r.id in errs and key(r) == group]),
                        "baseline": _summary_doc([baseline[name][r.id] for r in every
                                                  if r.id in errs and key(r) == group])}
                for group in dict.fromkeys(key(by_id[k]) for k in errs)}
        result[name] = entry
    report["heldout_errors"] = {k: list(pair) for k, pair in held_out.items()}  # what each split judges
    report["heldout_residuals"] = {k: list(pair) for k, pair in residuals.items()}  # what an interval is built of
    report["heldout_cells"] = {k: list(v) for k, v in cells.items()}
    return result


def _cell(row: AnyRow) -> tuple[str, str, str]:
    """(family dense/moe/hybrid, GPU, precision class): the coverage cell a row belongs to."""
    if isinstance(row, CalibrationRow):
        return family_of(row.model), row.cluster.gpu.name, precision_class(row.training.precision)
    return row.family, row.case.cluster.gpu.name, precision_class(row.case.training.precision)


def _interval_coverage(errs: dict[str, float], residuals: dict[str, tuple[float, ...]],
                       cells: dict[str, tuple[str, str, str]], by_id: dict[str, AnyRow],
                       key: Callable[[AnyRow], str]) -> dict[str, float]:
    """How often a split's held-out error lies in the 80 % band the product would state from the residuals of
    the other groups alone, and the band's median width (p90 - p10 of tokens/s, a fraction of the prediction)."""
    inside, widths = [], []
    ran = {}  # each run's mechanisms: what a band's runs had is what it checks
    for row_id, row in by_id.items():
        model, _, gemm_format = _run(row)
        ran[row_id] = mechanisms(model, gemm_format)
    for row_id, error in errs.items():
        group = key(by_id[row_id])
        kept = {k: v for k, v in residuals.items() if key(by_id[k]) != group}
        checked = frozenset().union(*(ran[k] for k in kept))
        band = _band(cells, kept, by_id[row_id], tuple(sorted(ran[row_id] - checked)))
        inside.append(band.p10_error <= round(error, RESIDUAL_DIGITS) <= band.p90_error)
        low, high = band.tokens_interval(1.0)
        widths.append(high - low)
    return {"interval_coverage": sum(inside) / len(inside), "interval_median_width": statistics.median(widths)}


def _band(cells: dict[str, tuple[str, str, str]], residuals: dict[str, tuple[float, ...]],
          row: AnyRow, unchecked: tuple[str, ...]) -> ErrorBand:
    """The 80 % band the product would state for `row` had `residuals` been every held-out error it knew, and
    their runs every run it knew: `unchecked` are the mechanisms of `row` none of them had (its GEMM format's
    included), which widen the band as they widen the product's (`coverage.with_mechanisms`)."""
    grouped: dict[tuple[str, str, str], list[float]] = {}
    for row_id, pair in residuals.items():
        grouped.setdefault(cells[row_id], []).extend(pair)
    table = tuple(CoverageCell(family, gpu, precision, len(errs) // 2, 0.0, 0.0, tuple(errs))
                  for (family, gpu, precision), errs in grouped.items())
    family, gpu_name, klass = cells[row.id]
    model, gpu, gemm_format = _run(row)
    placed = nearest_coverage(table, family, gpu_name, gpu.vendor, gpu.architecture, klass)
    return error_band(table, with_mechanisms(placed, model, gpu, gemm_format, unchecked))


def _run(row: AnyRow) -> tuple[ModelSpec, GPUSpec, str]:
    """A row's model, GPU and GEMM format."""
    if isinstance(row, CalibrationRow):
        return row.model, row.cluster.gpu, row.training.gemm_format
    return row.case.model, row.case.cluster.gpu, row.case.training.gemm_format


def release_group(judged: list[ReleaseRow]) -> Callable[[AnyRow], str]:
    """The release hold-out's group of a row: judged (a release the fit never saw) or seen."""
    judged_ids = {r.id for r in judged}
    return lambda r: "judged" if r.id in judged_ids else "seen"


def coverage_only(report: dict[str, Any], rows: list[CalibrationRow], release: list[ReleaseRow]) -> None:
    """Recompute every split's interval coverage and width from the held-out errors `report` already stores (the
    fits are not rerun: the interval's rule does not change them)."""
    every: list[AnyRow] = [*rows, *release]
    by_id = {r.id: r for r in every}
    cells = {r.id: _cell(r) for r in every}
    residuals = {k: tuple(pair) for k, pair in report["heldout_residuals"].items()}
    # every row is judged, a twin's same-layout repeat too; only the interval leaves the repeats out
    judged_pairs = {k: tuple(pair) for k, pair in report["heldout_errors"].items()}
    fitted = EfficiencyParams(**report["fitted_parameters"])
    _, judged = split_by_release(release)
    held_out: dict[str, tuple[dict[str, float], Callable[[AnyRow], str]]] = {
        "release hold-out": ({r.id: release_error(r, fitted) for r in judged}, release_group(judged)),
        "leave-one-source-out": ({k: v for fold in report["leave_one_source_out"].values()
                                  for k, v in fold["errors"].items()}, SPLIT_KEYS["leave-one-source-out"]),
        "leave-one-family-out": ({k: pair[0] for k, pair in judged_pairs.items()},
                                 SPLIT_KEYS["leave-one-family-out"]),
        "leave-one-GPU-out": ({k: pair[1] for k, pair in judged_pairs.items()}, SPLIT_KEYS["leave-one-GPU-out"]),
    }
    for name, (errs, key) in held_out.items():
        report["splits"][name] |= _interval_coverage(errs, residuals, cells, by_id, key)


def _loso_groups(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Leave-one-source-out errors grouped by family, GPU and precision (`row_groups` says each row's)."""
    grouped: dict[str, list[float]] = {}
    for entry in report["leave_one_source_out"].values():
        for row_id, error in entry["errors"].items():
            for key in report["row_groups"][row_id]:
                grouped.setdefault(key, []).append(error)
    return {name: _summary_doc(errs) for name, errs in sorted(grouped.items())}


def _parameter(name: str, value: float) -> str:
    """A fitted parameter as the report prints it: seconds in microseconds, the fractions to 3 decimals."""
    return f"{name}={1e6 * value:.2f} us" if name.endswith("_s") else f"{name}={value:.3f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _beats(model: dict[str, float], baseline: dict[str, float]) -> str:
    """'yes' when the model is below the baseline on median and p90, else which of the two it loses."""
    lost = [name for name, key in (("median", "median_abs_error"), ("p90", "p90_abs_error"))
            if model[key] >= baseline[key]]
    return "yes" if not lost else "NO (" + ", ".join(lost) + ")"


def _markdown(report: dict[str, Any]) -> str:
    lines = ["# Step-time calibration on published Megatron runs", "",
             "Generated by `bench/calibration/run.py`. The fit sees the older file (papers, Megatron README, NeMo",
             "24.07; error = predicted / published TFLOP/s/GPU - 1 in the publisher's FLOP convention) and the newer",
             f"file's releases {', '.join(report['train_releases'])} (error = predicted / published tokens/s/GPU - 1);",
             "later releases are judged in release_holdout.md. Row rules and exclusions:",
             "megapilot/estimate/calibration.py.", ""]
    c = report["committed_summary"]
    lines.append(f"- older-file rows used: {report['rows_used']} (excluded: {len(report['excluded'])}); "
                 f"newer-file rows in the fit: {len(report['release_rows_in_fit'])}")
    lines.append(f"- committed parameters on the older file: median |error| {_pct(c['median_abs_error'])}, "
                 f"max |error| {_pct(c['max_abs_error'])}, mean signed {_pct(c['mean_signed_error'])}")
    held = report["held_out_by_release"]
    lines.append("- committed parameters held out by release (the releases after "
                 f"{report['train_releases'][-1]}, unseen by the fit; release_holdout.md): median |error| "
                 + ", ".join(f"{_pct(group['median_abs_error'])} {name.removeprefix('family=')} ({group['rows']} rows)"
                             for name, group in held.items()))
    if "fitted_summary" in report:
        f, p = report["fitted_summary"], report["prior_summary"]
        b = report["constant_mfu_baseline"]
        lines.append(f"- baseline, one constant MFU per precision (older file, in-sample): median |error| "
                     f"{_pct(b['median_abs_error'])}, max {_pct(b['max_abs_error'])}")
        lines.append(f"- unfitted prior (all fitted rows): median |error| {_pct(p['median_abs_error'])}, max "
                     f"{_pct(p['max_abs_error'])}")
        lines.append(f"- fitted now (all fitted rows): median |error| {_pct(f['median_abs_error'])}, max "
                     f"{_pct(f['max_abs_error'])}")
        lines += ["", "Every split, the model beside the constant-MFU baseline (one MFU per precision class x "
                  "dense/MoE,", "the median of the training side of the same split); coverage = share of held-out "
                  "rows whose true", "throughput lies inside the stated 80 % interval, the interval built without "
                  "the row's group", "(in brackets its median width, p10 to p90 of tokens/s in % of the prediction; "
                  "rule: megapilot/estimate/coverage.py):", "",
                  "| split | rows | model median | model p90 | baseline median | baseline p90 | 80 % interval "
                  "coverage (width) | model beats baseline |", "|---|---|---|---|---|---|---|---|"]
        for name, entry in report["splits"].items():
            m, b = entry["model"], entry["baseline"]
            cov = "-" if "interval_coverage" not in entry else f"{100 * entry['interval_coverage']:.0f} %" + (
                f" ({_pct(entry['interval_median_width'])})" if "interval_median_width" in entry else "")
            beats = _beats(m, b)
            lines.append(f"| {name} | {m['rows']} | {_pct(m['median_abs_error'])} | {_pct(m['p90_abs_error'])} | "
                         f"{_pct(b['median_abs_error'])} | {_pct(b['p90_abs_error'])} | {cov} | {beats} |")
        losses = [f"{name} {_beats(e['model'], e['baseline']).removeprefix('NO ')}"
                  for name, e in report["splits"].items() if _beats(e["model"], e["baseline"]) != "yes"]
        losses += [f"{name} {group} {_beats(e['model'], e['baseline']).removeprefix('NO ')}"
                   for name in ("leave-one-family-out", "leave-one-GPU-out")
                   for group, e in report["splits"][name]["by_group"].items()
                   if _beats(e["model"], e["baseline"]) != "yes"]
        lines += ["", "Where the model does not beat the baseline (on the median or p90 named): "
                  + ("; ".join(losses) if losses else "nowhere") + "."]
        for name in ("leave-one-family-out", "leave-one-GPU-out"):
            lines += ["", f"{name}, by held-out group (model / baseline):", "",
                      "| held out | rows | model median | model p90 | baseline median | baseline p90 | beats |",
                      "|---|---|---|---|---|---|---|"]
            for group, entry in report["splits"][name]["by_group"].items():
                m, b = entry["model"], entry["baseline"]
                lines.append(f"| {group} | {m['rows']} | {_pct(m['median_abs_error'])} | "
                             f"{_pct(m['p90_abs_error'])} | {_pct(b['median_abs_error'])} | "
                             f"{_pct(b['p90_abs_error'])} | {_beats(m, b)} |")
        lines += ["", "Leave one source out over both files (fit on every other source, predict this one):", "",
                  "| held-out source | rows | median abs error | max abs error | mean signed |",
                  "|---|---|---|---|---|"]
        for source, entry in report["leave_one_source_out"].items():
            s = entry["held_out"]
            lines.append(f"| {source} | {s['rows']} | {_pct(s['median_abs_error'])} | {_pct(s['max_abs_error'])} | "
                         f"{_pct(s['mean_signed_error'])} |")
        lines += ["", "The same held-out errors by family, GPU and precision:", "",
                  "| group | rows | median abs error | max abs error | mean signed |", "|---|---|---|---|---|"]
        for name, s in _loso_groups(report).items():
            lines.append(f"| {name} | {s['rows']} | {_pct(s['median_abs_error'])} | {_pct(s['max_abs_error'])} | "
                         f"{_pct(s['mean_signed_error'])} |")
        fitted = report["fitted_parameters"].items()
        lines += ["", "Fitted parameters: " + ", ".join(_parameter(name, value) for name, value in fitted)]
    lines += ["", "The older file covers dense GPT/Llama/Nemotron models on A100 (BF16) and H100 (BF16, FP8); the",
              "fitted newer releases add B200/GB200 FP8, Mixtral MoE and Megatron-FSDP. No row covers AMD GPUs.", ""]
    lines += ["| row | layout (tp/pp/vpp/cp/dp, mbs, recompute) | published | predicted | error |",
              "|---|---|---|---|---|"]
    for r in report["rows"]:
        lay = r["layout"]
        chosen = "*" if r["mbs_chosen"] or r["recompute_chosen"] else ""
        lines.append(f"| {r['id']} | {lay['tp']}/{lay['pp']}/{lay['vpp']}/{lay['cp']}/{lay['dp']}, {lay['mbs']}, "
                     f"{lay['recompute']}{chosen} | {r['published_tflops_per_gpu']} | "
                     f"{r['predicted_tflops_per_gpu']} | "
                     f"{_pct(r['error'])} |")
    lines += ["", "`*` = micro-batch size and/or recompute chosen by the stated rule (not published).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
