"""Calibrate the step-time model on published Megatron runs and report its error.

    .venv/bin/python bench/calibration/run.py            # fit, hold-out checks, write results
    .venv/bin/python bench/calibration/run.py --no-fit   # only score the committed parameters (writes nothing)

Data: tests/data/calibration/published_calibration.json (copy of the project's shared calibration file).
The row rules, the prediction in each publisher's FLOP convention, the fit and the hold-out checks are
`megapilot.estimate.calibration` (its docstring states the rules); this script reads the rows, runs
them and writes results.json and results.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from megapilot.estimate.calibration import (
    PRIOR,
    PUBLISHER_CONVENTION,
    CalibrationRow,
    ErrorSummary,
    PublishedRun,
    calibration_rows,
    constant_mfu_errors,
    errors,
    fit,
    k_fold,
    leave_one_source_out,
    resolve_layout,
    summary,
)
from megapilot.estimate.efficiency import CALIBRATED
from megapilot.estimate.flops import flops_per_token
from megapilot.spec import ParallelConfig

DATA = ROOT / "tests" / "data" / "calibration" / "published_calibration.json"
OUT_DIR = Path(__file__).resolve().parent


def load_rows() -> tuple[list[CalibrationRow], list[dict[str, str]]]:
    """The calibration rows of the committed data file, and the excluded ones as report entries."""
    runs = [PublishedRun.model_validate(raw) for raw in json.loads(DATA.read_text())]
    rows, excluded = calibration_rows(runs)
    return rows, [e._asdict() for e in excluded]


def _summary_doc(errs: list[float]) -> dict[str, float]:
    return _as_doc(summary(errs))


def _as_doc(found: ErrorSummary) -> dict[str, float]:
    return dict(found._asdict())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-fit", action="store_true", help="score the committed CALIBRATED parameters only")
    args = parser.parse_args(argv)

    rows, excluded = load_rows()
    resolved = {row.id: resolve_layout(row) for row in rows}
    layouts = {row_id: layout for row_id, (layout, _) in resolved.items()}
    committed = errors(rows, layouts, CALIBRATED)
    report: dict[str, Any] = {"rows_used": len(rows), "excluded": excluded, "prior": asdict(PRIOR),
                              "committed_parameters": asdict(CALIBRATED),
                              "committed_summary": _summary_doc(list(committed.values()))}
    if not args.no_fit:
        fitted = fit(rows, layouts)
        fitted_errors = errors(rows, layouts, fitted)
        report["fitted_parameters"] = asdict(fitted)
        report["fitted_summary"] = _summary_doc(list(fitted_errors.values()))
        report["leave_one_source_out"] = {
            source: {"held_out": _as_doc(fold.held_out), "fitted": asdict(fold.fitted)}
            for source, fold in leave_one_source_out(rows, layouts).items()
        }
        report["five_fold"] = _as_doc(k_fold(rows, layouts, k=5))
        report["prior_summary"] = _summary_doc(list(errors(rows, layouts, PRIOR).values()))
        report["constant_mfu_baseline"] = _summary_doc(constant_mfu_errors(rows))
    report["rows"] = [_row_record(row, layouts[row.id], resolved[row.id][1], committed[row.id]) for row in rows]
    if not args.no_fit:  # the committed results always carry the fit and its hold-out checks
        (OUT_DIR / "results.json").write_text(json.dumps(report, indent=1) + "\n")
        (OUT_DIR / "results.md").write_text(_markdown(report))
    print(_markdown(report))
    return 0


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


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _markdown(report: dict[str, Any]) -> str:
    lines = ["# Step-time calibration on published Megatron runs", "",
             "Generated by `bench/calibration/run.py`; error = predicted / published TFLOP/s/GPU - 1, in the",
             "publisher's FLOP convention. Row rules and exclusions: see megapilot/estimate/calibration.py.", ""]
    c = report["committed_summary"]
    lines.append(f"- rows used: {report['rows_used']} (excluded: {len(report['excluded'])})")
    lines.append(f"- committed parameters: median |error| {_pct(c['median_abs_error'])}, "
                 f"max |error| {_pct(c['max_abs_error'])}, mean signed {_pct(c['mean_signed_error'])}")
    if "fitted_summary" in report:
        f, p = report["fitted_summary"], report["prior_summary"]
        b = report["constant_mfu_baseline"]
        lines.append(f"- baseline, one constant MFU per precision (in-sample): median |error| "
                     f"{_pct(b['median_abs_error'])}, max {_pct(b['max_abs_error'])}")
        lines.append(f"- unfitted prior: median |error| {_pct(p['median_abs_error'])}, max {_pct(p['max_abs_error'])}")
        lines.append(f"- fitted now: median |error| {_pct(f['median_abs_error'])}, max {_pct(f['max_abs_error'])}")
        kf = report["five_fold"]
        lines.append(f"- 5-fold hold-out: median |error| {_pct(kf['median_abs_error'])}, max "
                     f"{_pct(kf['max_abs_error'])}")
        lines += ["", "Leave one source out (fit on the other three, predict this one):", "",
                  "| held-out source | rows | median abs error | max abs error | mean signed |",
                  "|---|---|---|---|---|"]
        for source, entry in report["leave_one_source_out"].items():
            s = entry["held_out"]
            lines.append(f"| {source} | {s['rows']} | {_pct(s['median_abs_error'])} | {_pct(s['max_abs_error'])} | "
                         f"{_pct(s['mean_signed_error'])} |")
        lines += ["", "Fitted parameters: " + ", ".join(f"{k}={v:.3f}" for k, v in report["fitted_parameters"].items())]
    lines += ["", "Scope: dense GPT/Llama/Nemotron models on A100 (BF16) and H100 (BF16, FP8) only. No row covers",
              "MoE (expert all-to-all), CP > 2, Blackwell or AMD GPUs: predictions there rest on the same",
              "physics but are not checked against a published run.", ""]
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
