"""Calibration: the committed parameters hold on the published runs, and the fit's parts do what they say."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.estimate.calibration import (
    PRIOR,
    PublishedRun,
    calibration_rows,
    errors,
    identifiable,
    loss,
    nelder_mead,
    resolve_layout,
    summary,
)
from megapilot.estimate.efficiency import CALIBRATED

DATA = Path(__file__).resolve().parents[1] / "data" / "calibration" / "published_calibration.json"


@pytest.fixture(scope="module")
def published() -> list[PublishedRun]:
    return [PublishedRun.model_validate(raw) for raw in json.loads(DATA.read_text())]


def test_committed_parameters_predict_published_runs_within_calibration_error(published):
    rows, excluded = calibration_rows(published)
    assert len(rows) >= 40 and all(e.reason for e in excluded)
    layouts = {row.id: resolve_layout(row)[0] for row in rows}
    errs = errors(rows, layouts, CALIBRATED)
    assert statistics.median(abs(e) for e in errs.values()) <= 0.06
    assert max(abs(e) for e in errs.values()) <= 0.35


def test_fine_tuning_rows_and_rows_without_a_batch_are_excluded_with_their_reason(published):
    rows, excluded = calibration_rows(published)
    reasons = {e.id: e.reason for e in excluded}
    tasks = {run.id: run.task for run in published}
    assert all(tasks[row.id] == "pretrain" for row in rows)
    assert all("fine-tuning" in reasons[i] for i, task in tasks.items() if task != "pretrain")
    assert {row.id for row in rows}.isdisjoint(reasons)


def test_nelder_mead_finds_the_minimum_of_a_shifted_quadratic():
    found = nelder_mead(lambda v: (v[0] - 0.7) ** 2 + 3 * (v[1] - 1.9) ** 2, [0.5, 1.5], iterations=300)
    assert found == pytest.approx([0.7, 1.9], abs=1e-3)


def test_without_fp8_rows_the_8bit_fraction_is_not_fitted_and_bounds_are_enforced(published):
    rows, _ = calibration_rows(published)
    bf16 = [row for row in rows if row.training.precision == "bf16"]
    assert "gemm_peak_fraction_8bit" not in identifiable(bf16)
    assert "gemm_peak_fraction_8bit" in identifiable(rows)  # the NeMo FP8 rows identify it
    layouts = {row.id: resolve_layout(row)[0] for row in bf16[:3]}
    free = identifiable(bf16)
    inside = loss(bf16[:3], layouts, free, [getattr(PRIOR, name) for name in free])
    outside = loss(bf16[:3], layouts, free, [5.0] * len(free))  # a 500 % GEMM efficiency is impossible
    assert inside < outside


def test_summary_states_median_max_and_signed_mean():
    found = summary([0.1, -0.3, 0.05])
    assert found.median_abs_error == pytest.approx(0.1) and found.max_abs_error == pytest.approx(0.3)
    assert found.mean_signed_error == pytest.approx(-0.05) and found.rows == 3


RELEASE_DATA = DATA.parent / "published_calibration_2025.json"


@pytest.fixture(scope="module")
def release_rows():
    from megapilot.estimate.calibration import release_row
    from megapilot.estimate.published import PublishedLayout, enter_published_run, parenthesized_run

    rows = []
    for raw in json.loads(RELEASE_DATA.read_text()):
        layout = PublishedLayout.from_row(raw)
        published = raw["measured"]["tokens_per_sec_per_gpu"]
        rows.append(release_row(layout.id, enter_published_run(layout).case, published))
        beside = parenthesized_run(raw)
        if beside is None:
            continue
        other = PublishedLayout.from_row(beside.row)
        try:
            rows.append(release_row(other.id, enter_published_run(other).case, beside.tokens_per_s_per_gpu))
        except MegapilotError as refusal:  # GB200 DeepSeek-V3's MXFP8 run at PP 8 prints no EP; 64 cannot be one
            assert "DeepSeekV3" in other.id and refusal.field == "ep"
    return rows


def test_the_newer_rows_split_by_release_and_the_judged_ones_hold_within_the_stated_error(release_rows):
    """Fit on <= 25.04, judge on 25.07 and 25.09 (release_holdout.md): the committed parameters must keep the
    held-out median |error| of the printed rows where it stands, 7.5 % overall and 14 % on MoE rows. (It read
    7.0 and 10 % while the rows printed without their pipeline split were retyped with the refusal's first fix;
    typed as `megapilot estimate` answers them, with the balanced split, DeepSeek-V3 on 16 B200 stages reads
    +25.5 % where 2 and 3 end layers had given -5.2 %, and Qwen3-235B on B200 +16.1 % where +12.9 %.)"""
    from megapilot.estimate.calibration import TRAIN_RELEASES, release_error, split_by_release
    from megapilot.estimate.published import parenthesized_twin

    seen, judged = split_by_release(release_rows)
    assert {r.release for r in seen} == set(TRAIN_RELEASES) and len(seen) == 16
    printed = [r for r in judged if parenthesized_twin(r.id) is None]  # the parenthesized runs: the test below
    assert {r.release for r in printed} == {"25.07", "25.09"} and len(printed) == 21
    assert {r.source for r in judged} == {"nemo-25.07", "bridge-25.09"}
    errs = {r.id: release_error(r, CALIBRATED) for r in printed}
    assert statistics.median(abs(e) for e in errs.values()) <= 0.075
    assert statistics.median(abs(errs[r.id]) for r in printed if r.family == "moe") <= 0.14


def test_the_other_fp8_granularity_is_priced_against_current_scaling_as_the_same_layouts_ran(release_rows):
    """The 25.07 / 25.09 tables print, in parentheses, MXFP8 on Blackwell and blockwise FP8 on H100 beside per-tensor
    current scaling; where both ran one layout, their throughput ratio isolates the granularity. Nine MXFP8 pairs
    and one blockwise pair: the predicted ratio within 3 % of the published one at the median (5 % when MXFP8's
    GEMMs were priced at FP8's rate, its one-kernel casts making it the faster), and MXFP8 predicted no faster than
    current scaling on a dense layer, as every dense pair ran."""
    from megapilot.estimate.calibration import release_error, same_layout_repeats
    from megapilot.estimate.published import parenthesized_twin

    by_id = {r.id: r for r in release_rows}
    pairs = []
    for other in (by_id[row_id] for row_id in same_layout_repeats(release_rows)):
        main = by_id[parenthesized_twin(other.id) or ""]
        published = other.published_tokens_per_s / main.published_tokens_per_s
        predicted = (1 + release_error(other, CALIBRATED)) * other.published_tokens_per_s / (
            (1 + release_error(main, CALIBRATED)) * main.published_tokens_per_s)
        pairs.append((other, published, predicted))
    assert len(pairs) == 10
    assert statistics.median(abs(predicted / published - 1) for _, published, predicted in pairs) <= 0.03
    assert all(predicted < 1 for other, _, predicted in pairs if other.family == "dense")


def test_the_grouped_gemm_fraction_is_fitted_only_when_a_moe_row_is_in_the_fit(published, release_rows):
    rows, _ = calibration_rows(published)
    dense_only = [r for r in release_rows if r.family == "dense"]
    assert "grouped_gemm_fraction" not in identifiable(rows, dense_only)
    assert "grouped_gemm_fraction" in identifiable(rows, release_rows)


def test_a_release_rows_source_is_its_publisher_and_release():
    from megapilot.estimate.calibration import release_source

    assert release_source("nemo-25.02-DGX-B200-GPT3-175B") == "nemo-25.02"
    assert release_source("bridge-25.09-pretrain-DGX-H100-LLAMA3_8B-FP8 (x)-271") == "bridge-25.09"
    with pytest.raises(ValueError, match="no release"):
        release_source("narayanan2021-t1-1.7b")


def test_the_committed_parameters_are_where_the_fit_lands(published, release_rows):
    """A change to the model moves the fit's minimum; the committed parameters must move with it (run
    bench/calibration/run.py and commit what it fits). No 3 % step of one parameter may lower the fit's loss by
    more than 0.001 (the loss is flat along the ridge multiplier: a step there moves it by 1e-4)."""
    from dataclasses import asdict

    from megapilot.estimate.calibration import split_by_release

    rows, _ = calibration_rows(published)
    seen, _ = split_by_release(release_rows)
    layouts = {row.id: resolve_layout(row)[0] for row in rows}
    free = identifiable(rows, seen)
    at = [asdict(CALIBRATED)[name] for name in free]
    committed = loss(rows, layouts, free, at, seen)
    for index, name in enumerate(free):
        for step in (0.97, 1.03):
            moved = [value * step if i == index else value for i, value in enumerate(at)]
            assert loss(rows, layouts, free, moved, seen) > committed - 0.001, (name, step)


def test_the_committed_coverage_cells_are_the_committed_parameters_errors(published, release_rows):
    """Every estimate quotes calibration_coverage.json, and the planner's tie-break band is its median error: the
    file must be what the committed parameters give (bench/calibration/release_holdout.py writes it), per
    family, GPU and precision class, over the older file's rows and the newer releases'."""
    from collections import defaultdict
    from importlib import resources

    from megapilot.estimate.calibration import release_error, same_layout_repeats
    from megapilot.estimate.coverage import precision_class

    rows, _ = calibration_rows(published)
    layouts = {row.id: resolve_layout(row)[0] for row in rows}
    by_cell: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for row in rows:
        by_cell[("dense", row.cluster.gpu.name, precision_class(row.training.precision))].append(
            errors([row], layouts, CALIBRATED)[row.id])
    repeats = same_layout_repeats(release_rows)
    assert len(repeats) == 10  # the same-layout pairs' parenthesized runs (as printed: the typing's recompute aside)
    for release in (r for r in release_rows if r.id not in repeats):
        by_cell[(release.family, release.case.cluster.gpu.name,
                 precision_class(release.case.training.precision))].append(release_error(release, CALIBRATED))
    expected = {cell: (len(errs), statistics.median(abs(e) for e in errs), statistics.median(errs))
                for cell, errs in by_cell.items()}
    text = resources.files("megapilot.estimate").joinpath("data").joinpath("calibration_coverage.json").read_text()
    committed = {(c["family"], c["gpu"], c["precision"]): (c["runs"], c["median_abs_error"], c["median_signed_error"])
                 for c in json.loads(text)["cells"]}
    assert committed.keys() == expected.keys()
    for cell, (runs, median, signed) in expected.items():  # the bench rounds each row's error before the median
        assert committed[cell][0] == runs, cell
        assert committed[cell][1:] == pytest.approx((median, signed), abs=0.0005), cell


def test_the_constant_mfu_baseline_predicts_each_cells_median_mfu_and_falls_back_to_its_precision(
        published, release_rows):
    """One MFU per precision class x dense/MoE, fitted on the rows it is given: a row whose cell no training row
    fills takes its precision's median; a row at its cell's median MFU is predicted exactly."""
    from megapilot.estimate.calibration import ConstantMfu, baseline_cell, row_mfu

    rows, _ = calibration_rows(published)
    dense_fp8 = [r for r in release_rows if baseline_cell(r) == ("fp8", "dense")]
    baseline = ConstantMfu.fitted(dense_fp8)
    middle = sorted(dense_fp8, key=row_mfu)[len(dense_fp8) // 2]
    assert abs(baseline.error(middle)) < 0.05 or len(dense_fp8) % 2 == 0
    moe = next(r for r in release_rows if r.case.model.moe is not None)
    assert baseline.error(moe) == pytest.approx(baseline.by_precision["fp8"] / row_mfu(moe) - 1)
    assert all(0.05 < row_mfu(r) < 0.8 for r in [*rows, *release_rows])  # MFUs a GPU can reach


def test_every_row_falls_in_one_model_family_and_one_gpu_for_the_held_out_splits(published, release_rows):
    from megapilot.estimate.calibration import MODEL_FAMILIES, gpu_of, model_family

    rows, _ = calibration_rows(published)
    families = {model_family(r) for r in [*rows, *release_rows]}
    assert families <= set(MODEL_FAMILIES) and {"gpt", "llama", "qwen", "deepseek", "mixtral"} <= families
    # a release row's preset may carry another name (Nemotron-15B runs as mcore-gpt-16b): the published name counts
    assert {model_family(r) for r in release_rows if "Nemotron" in r.id} == {"nemotron"}
    assert {gpu_of(r) for r in [*rows, *release_rows]} == {"A100-SXM4-80GB", "H100-SXM5-80GB", "B200", "GB200"}


def test_summary_states_the_90th_percentile_of_the_absolute_errors():
    found = summary([0.01 * i for i in range(1, 11)])
    assert found.p90_abs_error == pytest.approx(0.09)
