"""A suite config's threshold file and sweep: the threshold table read and checked, the run cells with their
overlays merged, and CVS's rule that every run cell has a threshold cell. On the packaged tiny-local config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from megapilot.suite.cells import DEFAULT_CELL_KEY, TrainParams
from megapilot.suite.config import SuiteCheck, SuiteConfig, check_suite, load_suite
from megapilot.suite.config_schema import Sweep
from megapilot.suite.config_sweep import (
    _build_cells,
    _check_param_keys,
    _check_threshold_coverage,
    _combination_key,
    _read_thresholds,
    _sweep_cells,
    _threshold_table,
)
from megapilot.suite.gates import evaluate
from megapilot.suite.templates import template_path
from tests.suite.cvs_files import CVS_DIR, SINGLE_8B, filled_in, raw_cvs, write_suite

BF16 = "MBS=1,GBS=8,PRECISION=BF16"
FP8 = "MBS=2,GBS=16,PRECISION=FP8"
BF16_8B = "MBS=4,GBS=128,PRECISION=BF16"  # a cell of the CVS 8B single-node threshold file
LOSS_MAX = {"training.lm_loss": {"kind": "max", "value": 12.0}}


@pytest.fixture(scope="module")
def base() -> SuiteConfig:
    return load_suite(template_path("tiny-local")).config


def _with(config: SuiteConfig, **update: object) -> SuiteConfig:
    return config.model_copy(update=update)


def _sweep(combinations: dict, runs: list[str]) -> Sweep:
    return Sweep(combinations=combinations, runs=runs)


def _paths(check: SuiteCheck) -> list[str]:
    return [problem.path for problem in check.problems]


# ---- thresholds ---------------------------------------------------------------------------------
def test_the_threshold_table_skips_comments_and_names_each_bad_spec() -> None:
    check = SuiteCheck()
    table = _threshold_table({"_comment": "x", "MBS=1,GBS=8,PRECISION=bf16": {"_note": "y", **LOSS_MAX},
                              "not-a-cell": LOSS_MAX, "MBS=2,GBS=8,PRECISION=BF16": ["wrong"],
                              FP8: {"training.lm_loss": {"kind": "between", "value": 1}}}, check)
    # keys canonical where they parse, kept as given where not; a malformed cell is there, empty (not also missing)
    assert list(table) == [BF16, "not-a-cell", "MBS=2,GBS=8,PRECISION=BF16", FP8]
    assert list(table[BF16]) == ["training.lm_loss"] and table[FP8] == {} == table["MBS=2,GBS=8,PRECISION=BF16"]
    assert _paths(check) == ["thresholds.MBS=2,GBS=8,PRECISION=BF16", f"thresholds.{FP8}.training.lm_loss"]


def test_a_specs_issue_is_said_once_at_its_first_cell_a_problem_only_while_enforced() -> None:
    typo = {"training.tokens_per_gpuu": {"kind": "min", "value": 50},
            "training.lm_loss": {"kind": "max", "value": 12, "bogus": 1}}
    raw = {BF16: typo, FP8: typo}
    check = SuiteCheck()
    table = _threshold_table(raw, check)
    assert list(table[BF16]) == list(typo)  # still read: run time judges them as check said
    assert _paths(check) == [f"thresholds.{BF16}.training.tokens_per_gpuu"]
    assert "did you mean training.tokens_per_gpu" in check.problems[0].message
    assert check.problems[0].message.endswith("(and in 1 other cell(s))")
    assert [w.split(":")[0] for w in check.warnings] == [f"thresholds.{BF16}.training.lm_loss"]
    recorded = SuiteCheck()
    _threshold_table(raw, recorded, enforce=False)  # nothing gates: every issue is a warning
    assert recorded.problems == [] and len(recorded.warnings) == 2
    assert "enforce_thresholds false" in recorded.warnings[0]


def test_a_spec_that_cannot_be_read_is_one_problem_at_its_first_cell_enforced_or_not() -> None:
    # a threshold file repeats a metric's spec in every cell: a value of the wrong type is one mistake, said once,
    # naming the field and the value found
    wrong = {"training.lm_loss": {"kind": "max", "value": "fast"},
             "training.time_to_target_s": {"kind": "max", "value": 60},
             "training.time_to_target_seconds": {"kind": "max", "value": 90}}
    for enforce in (True, False):  # a spec not read gates nothing as written: a problem either way
        check = SuiteCheck()
        _threshold_table({BF16: wrong, FP8: wrong, "MBS=4,GBS=8,PRECISION=BF16": wrong}, check, enforce=enforce)
        assert _paths(check) == [f"thresholds.{BF16}.training.lm_loss",
                                 f"thresholds.{BF16}.training.time_to_target_seconds"]
        assert check.problems[0].message == ("value: Input should be a valid number, unable to parse string as a "
                                             "number (got 'fast') (and in 2 other cell(s))")
        assert check.problems[1].message.endswith("two names of one metric) (and in 2 other cell(s))")


def test_a_number_written_with_its_unit_is_told_to_be_a_bare_number_in_the_metric_s_unit() -> None:
    # a data sheet's "300 TFLOPs": the fix names the field, the unit the gate compares in, and the number
    check = SuiteCheck()
    _threshold_table({BF16: {"training.throughput_per_gpu": {"kind": "min", "value": "300 TFLOPs"},
                             "training.tokens_per_gpu": {"kind": "min_ratio", "value": "0.9 x",
                                                         "reference": "training.throughput_per_gpu"},
                             "training.lm_loss": {"kind": "within", "value": 3, "tolerance_pct": "5 %"},
                             "training.elapsed_time_per_iteration": {"kind": "max_ms", "value": "1.2k ms"}}},
                     check)
    assert [p.fix for p in check.problems] == [
        "write value as a bare JSON number in TFLOP/s/GPU, without quotes or units (value: 300)",
        "write value as a bare JSON number, without quotes or units (value: 0.9)",  # a ratio has no unit
        "write tolerance_pct as a bare JSON number in %, without quotes or units (tolerance_pct: 5)",
        "write value as a bare JSON number in ms, without quotes or units",  # 1.2k is not 1.2: no number offered
    ]


def test_a_spec_field_out_of_its_bounds_is_told_the_bound() -> None:
    check = SuiteCheck()
    _threshold_table({BF16: {"training.tokens_per_gpu": {"kind": "within", "value": 1000, "tolerance_pct": -5},
                             "training.lm_loss": {"kind": "baseline", "tolerance_pct": 5, "last_n": 0}}}, check)
    assert [p.fix for p in check.problems] == ["give tolerance_pct a value that is greater than or equal to 0",
                                               "give last_n a value that is greater than or equal to 1"]


def test_the_named_threshold_file_is_read_relative_to_the_config(base: SuiteConfig, tmp_path: Path) -> None:
    (tmp_path / "cells").mkdir()
    (tmp_path / "cells" / "mine_threshold.json").write_text(json.dumps({BF16: LOSS_MAX}))
    check = SuiteCheck()
    table, path = _read_thresholds(_with(base, threshold_json="cells/mine_threshold.json"), tmp_path / "s.json", [],
                                   check)
    assert path == tmp_path / "cells" / "mine_threshold.json" and list(table) == [BF16] and check.problems == []
    check = SuiteCheck()
    assert _read_thresholds(_with(base, threshold_json="gone.json"), tmp_path / "s.json", [], check) == ({}, None)
    assert _paths(check) == ["threshold_json"] and "does not exist" in check.problems[0].message


def test_a_threshold_key_given_twice_is_a_problem_not_the_last_one_silently(base: SuiteConfig,
                                                                            tmp_path: Path) -> None:
    loss = '"training.lm_loss": {"kind": "max", "value": %d}'
    (tmp_path / "t_threshold.json").write_text(f'{{"{BF16}": {{{loss % 12}, {loss % 1}}}}}')
    check = SuiteCheck()
    _read_thresholds(_with(base, threshold_json="t_threshold.json"), tmp_path / "s.json", [], check)
    assert _paths(check) == ["threshold_json"]
    assert "'training.lm_loss' appears more than once" in check.problems[0].message


def test_two_threshold_cells_that_are_one_run_cell_are_a_problem() -> None:
    check = SuiteCheck()
    table = _threshold_table({BF16: LOSS_MAX, BF16.replace("BF16", "bf16"): {}}, check)
    assert list(table) == [BF16]
    assert _paths(check) == [f"thresholds.{BF16.replace('BF16', 'bf16')}"]
    assert "are the same cell" in check.problems[0].message


def test_a_threshold_json_naming_a_folder_says_so_not_that_it_does_not_exist(base: SuiteConfig,
                                                                            tmp_path: Path) -> None:
    (tmp_path / "cells").mkdir()
    check = SuiteCheck()
    assert _read_thresholds(_with(base, threshold_json="cells"), tmp_path / "s.json", [], check) == ({}, None)
    assert _paths(check) == ["threshold_json"] and check.problems[0].message.endswith("cells is a folder, not a file")


def test_an_unfilled_threshold_json_is_not_read(base: SuiteConfig, tmp_path: Path) -> None:
    (tmp_path / "x_threshold.json").write_text("not json")
    check = SuiteCheck()
    assert _read_thresholds(_with(base, threshold_json=""), tmp_path / "s.json", ["threshold_json"], check) == ({},
                                                                                                                None)
    assert check.problems == []  # its <changeme> is the problem already reported


def test_an_empty_threshold_json_takes_the_one_file_beside_the_config(base: SuiteConfig, tmp_path: Path) -> None:
    config = _with(base, threshold_json="")
    check = SuiteCheck()
    assert _read_thresholds(config, tmp_path / "s.json", [], check) == ({}, None)
    assert _paths(check) == ["threshold_json"]  # enforced: a threshold file is needed
    record_only = SuiteCheck()
    _read_thresholds(_with(config, enforce_thresholds=False), tmp_path / "s.json", [], record_only)
    assert record_only.problems == [] and "none gated" in record_only.warnings[0]
    (tmp_path / "a_threshold.json").write_text(json.dumps({BF16: LOSS_MAX}))
    table, path = _read_thresholds(config, tmp_path / "s.json", [], SuiteCheck())
    assert path == tmp_path / "a_threshold.json" and list(table) == [BF16]
    (tmp_path / "b_threshold.json").write_text("{}")
    several = SuiteCheck()
    assert _read_thresholds(config, tmp_path / "s.json", [], several) == ({}, None)
    assert "several threshold files" in several.problems[0].message


def test_a_threshold_file_that_is_not_a_mapping_is_a_problem(base: SuiteConfig, tmp_path: Path) -> None:
    (tmp_path / "t_threshold.json").write_text("[1]")
    check = SuiteCheck()
    table, path = _read_thresholds(_with(base, threshold_json="t_threshold.json"), tmp_path / "s.json", [], check)
    assert (table, path) == ({}, None) and _paths(check) == ["threshold_json"]


def test_a_threshold_file_that_cannot_be_read_is_one_problem_not_one_per_run_cell(tmp_path: Path) -> None:
    # the file's cells are unknown, not missing: no "run cell ... has no threshold cell" for each run
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    (tmp_path / "t_threshold.json").write_text('{"MBS=4,GBS=128,PRECISION=FP8": {')
    assert _paths(check_suite(config)) == ["threshold_json"]
    (tmp_path / "t_threshold.json").write_text("[1]")
    assert _paths(check_suite(config)) == ["threshold_json"]


# ---- cells --------------------------------------------------------------------------------------
def test_no_sweep_is_the_default_cell_of_train_params(base: SuiteConfig) -> None:
    config = _with(base, sweep=Sweep())
    assert _build_cells(config, {}, SuiteCheck()) == [(DEFAULT_CELL_KEY, config.train_params)]


def test_runs_in_order_with_the_key_and_overlay_merged(base: SuiteConfig) -> None:
    config = _with(base, sweep=_sweep({FP8: {"sequence_length": "64"}, "MBS=1,GBS=8,PRECISION=bf16": {}},
                                      [FP8, "MBS=1,GBS=8,PRECISION=bf16", FP8]))
    check = SuiteCheck()
    cells = _build_cells(config, {}, check)
    assert [key for key, _ in cells] == [FP8, BF16, FP8]
    fp8 = cells[0][1]
    assert (fp8.micro_batch_size, fp8.global_batch_size, fp8.precision, fp8.sequence_length) == (2, 16, "FP8", 64)
    assert cells[1][1].sequence_length == base.train_params.sequence_length  # no overlay: train_params'
    assert check.problems == [] and check.warnings == [f"sweep.runs: {FP8} is listed more than once; it runs once "
                                                       "per listing"]


def test_each_bad_run_or_combination_is_a_problem_the_others_still_build(base: SuiteConfig) -> None:
    config = _with(base, sweep=_sweep({FP8: {}, "MBS=x,GBS=8,PRECISION=BF16": {},
                                       "MBS=2,GBS=16,PRECISION=fp8": {},  # the same cell as FP8
                                       BF16: {"micro_batch_size": "4", "precision": "bf16"},
                                       "MBS=4,GBS=8,PRECISION=BF16": {"sequence_length": "long"}},
                                      [FP8, "MBS=9,GBS=9,PRECISION=BF16", BF16]))
    check = SuiteCheck()
    cells = _build_cells(config, {}, check)
    assert [key for key, _ in cells] == [FP8]
    assert _paths(check) == ["sweep.combinations.MBS=x,GBS=8,PRECISION=BF16",
                             "sweep.combinations.MBS=2,GBS=16,PRECISION=fp8",
                             f"sweep.combinations.{BF16}.micro_batch_size",  # the body disagrees with the key
                             "sweep.combinations.MBS=4,GBS=8,PRECISION=BF16.sequence_length",
                             "sweep.runs[1]"]
    assert "use one of:" in check.problems[-1].fix


def test_an_iteration_count_out_of_bounds_in_a_combination_is_told_its_bound_not_a_retype(base: SuiteConfig) -> None:
    check = SuiteCheck()
    _build_cells(_with(base, sweep=_sweep({BF16: {"training_iterations": "-5"}}, [BF16])), {}, check)
    assert _paths(check) == [f"sweep.combinations.{BF16}.training_iterations"]
    assert check.problems[0].fix == "give a value that is greater than 0"


def test_the_threshold_cell_of_a_refused_combination_is_not_also_said_to_match_no_run(tmp_path: Path) -> None:
    # the combination's own problem is the one to fix; "remove the threshold cell" would leave the run without one
    config = tmp_path / "suite.json"
    shutil.copy(template_path("tiny-local"), config)
    shutil.copy(template_path("tiny-local").with_name("tiny-local_threshold.json"), tmp_path)
    raw = json.loads(config.read_text())
    raw["sweep"]["combinations"][BF16]["training_iterations"] = "-5"
    raw["sweep"]["combinations"]["MBS=2,GBS=8,PRECISION=BF16"]["micro_batch_size"] = "4"
    config.write_text(json.dumps(raw))
    assert _paths(check_suite(config)) == [f"sweep.combinations.{BF16}.training_iterations",
                                           "sweep.combinations.MBS=2,GBS=8,PRECISION=BF16.micro_batch_size"]


def test_combinations_without_runs_is_a_problem(base: SuiteConfig) -> None:
    check = SuiteCheck()
    assert _build_cells(_with(base, sweep=_sweep({FP8: {}}, [])), {}, check) == [] and _paths(check) == ["sweep.runs"]


def test_a_free_form_id_takes_its_cell_from_the_body() -> None:
    body = {"micro_batch_size": "4", "global_batch_size": "128", "precision": "te_fp8"}
    assert _combination_key("llama3_1_8b-mi355x-bs128-mbs4-fp8", body).key == "MBS=4,GBS=128,PRECISION=FP8"
    with pytest.raises(ValueError):
        _combination_key("llama3_1_8b-mi355x-bs128-mbs4-fp8", {"micro_batch_size": "4", "precision": "fp8"})


def test_threshold_coverage_both_ways_enforced_or_recorded(base: SuiteConfig, tmp_path: Path) -> None:
    cells = [(BF16, base.train_params), (FP8, base.train_params)]
    thresholds = {BF16: {}, "MBS=8,GBS=8,PRECISION=BF16": {}}
    path = tmp_path / "t_threshold.json"
    check = SuiteCheck()
    _check_threshold_coverage(base, cells, thresholds, path, check)
    assert _paths(check) == [f"thresholds.{FP8}", "thresholds.MBS=8,GBS=8,PRECISION=BF16"]
    assert check.problems[0].message == f"run cell {FP8} has no threshold cell in t_threshold.json"
    recorded = SuiteCheck()
    _check_threshold_coverage(_with(base, enforce_thresholds=False), cells, thresholds, path, recorded)
    assert recorded.problems == [] and len(recorded.warnings) == 2
    no_file = SuiteCheck()
    _check_threshold_coverage(base, cells, thresholds, None, no_file)
    assert no_file.problems == [] and no_file.warnings == []


def test_sweep_cells_carry_the_key_and_the_merged_params(base: SuiteConfig) -> None:
    params = TrainParams.model_validate({**base.train_params.model_dump(), "micro_batch_size": 2,
                                         "global_batch_size": 16, "precision": "FP8"})
    default, fp8 = _sweep_cells([(DEFAULT_CELL_KEY, base.train_params), (FP8, params)], None, 1)
    assert default.key == DEFAULT_CELL_KEY and default.seq_length == 128
    assert (fp8.key, fp8.layout.mbs, fp8.gbs, fp8.precision, fp8.seq_length) == (FP8, 2, 16, "FP8", 128)


# ---- keys of train_params and of the combinations' bodies ------------------------------------------------------
def test_a_slip_of_a_train_params_key_is_a_problem_anywhere_it_is_written() -> None:
    # TrainParams keeps unknown keys, so `pipline_parallelism: 2` would train with PP 1 without a word
    raw = {"train_params": {"model_name": "tiny", "pipline_parallelism": "2", "tp": "2"},
           "sweep": {"combinations": {BF16: {"tensor_paralellism": "2", "name": "cvs label"}}}}
    check = SuiteCheck()
    _check_param_keys(raw, check)
    problems = {p.path: p for p in check.problems}
    assert list(problems) == ["train_params.pipline_parallelism", "train_params.tp",
                              f"sweep.combinations.{BF16}.tensor_paralellism"]
    assert problems["train_params.pipline_parallelism"].message == \
        "unknown key (did you mean pipeline_parallelism?)"
    assert problems["train_params.tp"].fix == "rename it to tensor_parallelism"
    assert check.warnings == []  # a combination's `name` is CVS's label, not a setting


def test_a_foreign_train_params_key_is_kept_with_a_warning() -> None:
    raw = {"train_params": {"model_name": "tiny", "result_dict": {}},
           "sweep": {"combinations": {BF16: {"mock_data": "1"}}}}
    check = SuiteCheck()
    _check_param_keys(raw, check)
    assert check.problems == []
    assert [w.split(":")[0] for w in check.warnings] == ["train_params.result_dict",
                                                          f"sweep.combinations.{BF16}.mock_data"]


def test_a_cpu_suite_is_warned_of_each_gate_it_can_never_measure_once(tmp_path: Path) -> None:
    """A CPU run has no GPU peak (MFU) and no GPU memory (its fraction): `suite check` says before the run that such a
    gate is SKIPPED on every run, once per metric; an `info` spec (it only records) and a GPU suite are not warned."""
    source = template_path("tiny-local")
    raw = json.loads(source.read_text())
    thresholds = json.loads(source.with_name("tiny-local_threshold.json").read_text())
    cells = [cell for cell in thresholds if not cell.startswith("_")]
    for cell in cells:  # each cell already records the memory fraction (info, optional)
        thresholds[cell]["training.mfu_pct"] = {"kind": "min", "value": 30}
    (tmp_path / "tiny-local_threshold.json").write_text(json.dumps(thresholds))
    (tmp_path / "cpu.json").write_text(json.dumps(raw))
    check = check_suite(tmp_path / "cpu.json")
    assert check.problems == [] and check.suite is not None
    assert [w for w in check.warnings if "CPU" in w] == [
        f"thresholds.{cells[0]}.training.mfu_pct: a CPU run has no GPU peak to compute MFU from: this gate can never "
        "be measured on a CPU suite and is SKIPPED on every run (and in 1 other cell(s)) — fix: gate it in a GPU "
        "suite, or remove it from this one"]
    raw["gpu_name"], raw["megapilot"]["device"] = "H100", "gpu"
    (tmp_path / "gpu.json").write_text(json.dumps(raw))
    assert not any("CPU" in w for w in check_suite(tmp_path / "gpu.json").warnings)


def test_a_stock_cvs_time_to_target_gate_is_the_measured_metric_s_gate_without_a_warning(tmp_path: Path) -> None:
    """CVS's threshold files gate `training.time_to_target_seconds` (CVS's Megatron code computes it): the suite
    measures it as training.time_to_target_s, so the gate is that metric's, read and judged as written."""
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B), gpu="MI355X"), SINGLE_8B)
    shutil.copyfile(CVS_DIR / "mi355x_megatron_llama-3.1-8b_single_threshold.json", tmp_path / "t_threshold.json")
    check = check_suite(config)
    assert check.problems == [] and check.suite is not None
    assert not [w for w in check.warnings if "time_to_target" in w]
    for specs in check.suite.thresholds.values():
        assert "training.time_to_target_seconds" not in specs
        assert specs["training.time_to_target_s"].describe() == "info (2500)"
    rows = evaluate({"training.time_to_target_s": 12.5}, {}, check.suite.thresholds[BF16_8B], enforce=True)
    (row,) = [row for row in rows if "time_to_target" in row.name]
    assert (row.name, row.value, row.reason) == ("training.time_to_target_s", 12.5, "info: recorded, never gated")


def test_one_metric_gated_under_both_its_names_is_a_problem_at_the_second() -> None:
    check = SuiteCheck()
    table = _threshold_table({BF16: {"training.time_to_target_s": {"kind": "max", "value": 60},
                                     "training.time_to_target_seconds": {"kind": "max", "value": 90}}}, check)
    assert table[BF16]["training.time_to_target_s"].describe() == "<= 60"
    assert _paths(check) == [f"thresholds.{BF16}.training.time_to_target_seconds"]
    assert check.problems[0].fix == "keep one of training.time_to_target_s and training.time_to_target_seconds"


def test_a_throughput_floor_above_the_gpu_s_peak_at_the_cell_s_precision_is_refused_naming_the_peak(
        tmp_path: Path) -> None:
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B), gpu="MI300X"), SINGLE_8B)
    table = json.loads((tmp_path / "t_threshold.json").read_text())
    fp8, bf16 = "MBS=4,GBS=128,PRECISION=FP8", "MBS=4,GBS=128,PRECISION=BF16"
    table[fp8]["training.throughput_per_gpu"] = {"kind": "min", "value": 1e9}
    table[bf16]["training.throughput_per_gpu"] = {"kind": "min", "value": 2000}  # above BF16's peak, below FP8's
    (tmp_path / "t_threshold.json").write_text(json.dumps(table))
    check = check_suite(config)
    assert check.suite is None
    assert [(p.path, p.message, p.fix) for p in check.problems] == [
        (f"thresholds.{fp8}.training.throughput_per_gpu", "a floor of 1e+09 fails every run "
         "(training.throughput_per_gpu is never above 2614.9 TFLOP/s/GPU, the MI300X dense FP8 peak)",
         "give a bound a measurement can miss"),
        (f"thresholds.{bf16}.training.throughput_per_gpu", "a floor of 2000 fails every run "
         "(training.throughput_per_gpu is never above 1307.4 TFLOP/s/GPU, the MI300X dense BF16 peak)",
         "give a bound a measurement can miss")]
    raw = json.loads(config.read_text())
    raw["enforce_thresholds"] = False  # nothing gates: said, as a warning
    config.write_text(json.dumps(raw))
    recorded = check_suite(config)
    assert recorded.problems == [] and any("2614.9 TFLOP/s/GPU" in w for w in recorded.warnings)
