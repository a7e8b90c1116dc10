"""The run history on both backends: record, list, show, compare, resume, baselines, calibration, secrets,
migrations, concurrent writers. PostgreSQL runs against a real server the tests start (tests/store/pg_server.py).

`make_suite_result` builds the SuiteResult a suite run would write; test_regress and the CLI tests use it too.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.spec import LayoutPins, Prediction
from megapilot.store import history as history_module
from megapilot.store.history import HISTORY_ENV, History, history_url, open_history
from megapilot.store.schema import SCHEMA_VERSION, apply_migrations, schema_version
from megapilot.suite.metric_table import METRICS
from megapilot.suite.outcome import RunStatus, run_outcome
from megapilot.suite.results import (
    RECORDED_LAYOUT_FIELDS,
    ComboResult,
    JobSummary,
    MetricRow,
    Regression,
    RunCard,
    SuiteResult,
    Verdict,
    read_suite_result,
)
from tests.tmpfs import small_tmpfs

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
CELL = "MBS=2,GBS=64,PRECISION=BF16"
TOKENS = "training.tokens_per_gpu"
TFLOPS = "training.throughput_per_gpu"
STEP = "training.elapsed_time_per_iteration"
MFU = "training.mfu_pct"
NAN_ITERATIONS = "training.nan_iterations"
FAKE_TOKEN = "hf_FaKeToKeN0123456789abcdefXYZ"


# ---- the factory ----------------------------------------------------------------------------------

def make_combo(key: str = CELL, *, verdict: Verdict = Verdict.PASS, tokens: float | None = 1000.0,
               tflops: float | None = 300.0, step_ms: float | None = 800.0, predicted: Prediction | None = None,
               job_state: str = "COMPLETED", **fields: object) -> ComboResult:
    """A measured cell: tokens/s/GPU, TFLOP/s/GPU and step time, gated or recorded like a suite run would."""
    readings = ((TOKENS, tokens, "tok/s/GPU"), (TFLOPS, tflops, "TFLOP/s/GPU"), (STEP, step_ms, "ms"))
    metrics = [MetricRow(name=name, value=value, unit=unit, verdict=verdict if value is not None else Verdict.SKIPPED,
                         threshold=">= 1" if name == TOKENS else None)
               for name, value, unit in readings if value is not None]
    layout = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "mbs": 2} | {name: fields.pop(name) for name in RECORDED_LAYOUT_FIELDS
                                                                if name in fields}
    defaults: dict[str, object] = {"directory": key, "backend": "megatron-lm", "layout": LayoutPins(**layout),
                                   "gbs": 64, "precision": "BF16", "seq_length": 4096, "nodes": 1,
                                   "gpus_per_node": 8, "duration_s": 120.0}
    defaults.update(fields)
    job = JobSummary(executor="local", job_id="1234", state=job_state, duration_s=110.0)
    return ComboResult(key=key, verdict=verdict, metrics=metrics, predicted=predicted, job=job, **defaults)


def make_suite_result(run_id: str, *, hour: float = 0, verdict: Verdict = Verdict.PASS, model: str = "llama3.1-8b",
                      family: str = "llama", gpu: str = "MI300X", combos: list[ComboResult] | None = None,
                      **result_fields: object) -> SuiteResult:
    """A finished suite run `hour` hours after T0 (later runs are newer)."""
    card = RunCard(suite_name="megatron-single", model=model, model_family=family, gpu=gpu, nodes=1, gpus_per_node=8,
                   executor="local", backend="megatron-lm", layout="TP=1,PP=1,CP=1,EP=1,DP=8", precision="BF16",
                   megapilot_version="0.1.0", git_commit="abc123", config_hash="sha256:feed")
    started = T0 + timedelta(hours=hour)
    fields: dict[str, object] = {"run_dir": f"/runs/{run_id}", "ended_at": started + timedelta(minutes=10),
                                 "duration_s": 600.0, "finished": True}
    fields.update(result_fields)
    return SuiteResult(run_id=run_id, verdict=verdict, card=card, started_at=started,
                       combos=combos if combos is not None else [make_combo()], **fields)


# ---- the two backends -----------------------------------------------------------------------------

@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "history.sqlite")
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def history(db_url):
    with open_history(db_url) as opened:
        yield opened


# ---- record, list, show ---------------------------------------------------------------------------

def test_recorded_run_lists_with_its_card_and_counts(history: History):
    failed = make_combo("MBS=4,GBS=64,PRECISION=BF16", verdict=Verdict.FAIL, tokens=None, tflops=None, step_ms=None,
                        reason="out of memory")
    history.record(make_suite_result("run-a", verdict=Verdict.FAIL, combos=[make_combo(), failed]))
    [row] = history.runs()
    assert (row.run_id, row.verdict, row.model, row.model_family, row.gpu) == ("run-a", Verdict.FAIL, "llama3.1-8b",
                                                                                "llama", "MI300X")
    assert (row.nodes, row.gpus_per_node, row.layout, row.backend, row.executor) == (
        1, 8, "TP=1,PP=1,CP=1,EP=1,DP=8", "megatron-lm", "local")
    assert (row.combos, row.failed_combos, row.finished, row.git_commit) == (2, 1, True, "abc123")
    assert row.started_at == T0 and row.ended_at == T0 + timedelta(minutes=10)


def test_runs_are_newest_first_limited_and_filtered(history: History):
    history.record(make_suite_result("old", hour=0))
    history.record(make_suite_result("new", hour=2))
    history.record(make_suite_result("other-gpu", hour=1, gpu="H100"))
    history.record(make_suite_result("other-model", hour=3, model="llama3.1-70b"))
    assert [r.run_id for r in history.runs()] == ["other-model", "new", "other-gpu", "old"]
    assert [r.run_id for r in history.runs(limit=2)] == ["other-model", "new"]
    assert [r.run_id for r in history.runs(gpu="h100")] == ["other-gpu"]
    assert [r.run_id for r in history.runs(model="llama3.1-8b", gpu="MI300X")] == ["new", "old"]


def test_a_limit_past_every_run_lists_them_all(history: History):
    """`history list -n 99999999999999999999` was an internal error (OverflowError) on SQLite, and "cannot be used
    as the history (bigint out of range)" on PostgreSQL."""
    history.record(make_suite_result("run-1"))
    assert [row.run_id for row in history.runs(limit=10**20)] == ["run-1"]


def test_show_returns_combos_metrics_and_prediction_with_measured_values(history: History):
    predicted = Prediction(step_time_ms=750.0, tokens_per_s_per_gpu=1100.0, tflops_per_gpu=320.0, memory_gib=40.0)
    history.record(make_suite_result("run-a", combos=[make_combo(predicted=predicted, tp=2, vpp=2)]))
    detail = history.run("run-a")
    [combo] = detail.combos
    assert combo.key == CELL and combo.layout == "TP=2,PP=1,CP=1,EP=1,DP=4,VPP=2" and combo.job_state == "COMPLETED"
    assert {m.name: m.value for m in combo.metrics} == {TOKENS: 1000.0, TFLOPS: 300.0, STEP: 800.0}
    assert {m.name: m.threshold for m in combo.metrics}[TOKENS] == ">= 1"
    assert combo.prediction is not None
    assert (combo.prediction.predicted_step_time_ms, combo.prediction.measured_step_time_ms) == (750.0, 800.0)
    assert (combo.prediction.predicted_tokens_per_s_per_gpu, combo.prediction.measured_tokens_per_s_per_gpu) == (
        1100.0, 1000.0)
    assert combo.prediction.measured_memory_gib is None  # no memory metric in GiB was measured


def test_a_run_read_from_an_earlier_suite_json_records_its_combos_layouts(history: History):
    """suite.json as written before a combo's layout was one field (tests/data/suite_results/flat_layout): the
    rows hold the layout it ran, in the columns rows always had."""
    earlier = read_suite_result(Path(__file__).resolve().parents[1] / "data" / "suite_results" / "flat_layout")
    history.record(earlier)
    combos = {combo.key: combo for combo in history.run(earlier.run_id).combos}
    passing, failing = combos["MBS=1,GBS=8,PRECISION=BF16"], combos["MBS=2,GBS=16,PRECISION=FP8"]
    assert passing.layout == "TP=1,PP=2,CP=1,EP=1,DP=1,VPP=2" and (passing.pp, passing.vpp, passing.mbs) == (2, 2, 1)
    assert (failing.layout, failing.tp, failing.ep, failing.vpp, failing.mbs) == ("TP=2,PP=1,CP=1,EP=2,DP=1", 2, 2,
                                                                                   None, 2)


def test_floats_keep_full_precision_and_nan_is_stored_as_missing(history: History):
    history.record(make_suite_result("run-a", combos=[make_combo(tokens=12345.678901, step_ms=float("nan"))]))
    values = {m.name: m.value for m in history.run("run-a").combos[0].metrics}
    assert values[TOKENS] == 12345.678901 and values[STEP] is None


def test_an_unfinished_run_is_interrupted_and_rows_written_before_that_read_so(history: History):
    stopped = make_combo("MBS=4", verdict=Verdict.INTERRUPTED, tokens=None, tflops=None, step_ms=None,
                         job_state="CANCELLED", reason="interrupted at iteration 10 of 80 by SIGINT")
    history.record(make_suite_result("run-a", verdict=Verdict.INTERRUPTED, finished=False,
                                     combos=[make_combo(), stopped]))
    [row] = history.runs()
    assert (row.verdict, row.finished, row.combos, row.failed_combos) == (RunStatus.INTERRUPTED, False, 2, 0)
    detail = history.run("run-a")
    assert [c.verdict for c in detail.combos] == [Verdict.PASS, Verdict.INTERRUPTED]
    assert history.finished_combos("run-a") == {make_combo().key}  # the stopped one runs again on --resume
    # an interrupted run recorded before INTERRUPTED was a verdict of its own said FAIL (or, killed, what its
    # suite.json said mid-run)
    for old in ("FAIL", "SKIPPED"):
        with history._db.write():
            history._db.execute("UPDATE runs SET verdict = ? WHERE run_id = ?", (old, "run-a"))
        assert history.run("run-a").run.verdict is RunStatus.INTERRUPTED
    history.record(make_suite_result("run-b", verdict=Verdict.FAIL, finished=False, hour=1))  # a suite.json of then
    assert history.run("run-b").run.verdict is RunStatus.INTERRUPTED


def _regressed(run_id: str, *, hour: float, enforced: bool) -> SuiteResult:
    """A run whose gates passed and whose tokens/s fell 30 % against the history, as `suite run` leaves it."""
    slower = make_suite_result(run_id, hour=hour, combos=[make_combo(tokens=700.0)], regressions_enforced=enforced)
    slower.regressions = [Regression(combo=CELL, metric=TOKENS, value=700.0, baseline_median=1000.0, change_pct=-30.0,
                                     runs_compared=2, worse=True, message="tokens/s/GPU -30.0 % vs the last 2 runs")]
    return slower


@pytest.mark.parametrize(("enforced", "status"), [(False, RunStatus.WARN), (True, RunStatus.FAIL)])
def test_a_run_that_regressed_is_stored_with_the_one_verdict_not_its_gates_pass(history: History, enforced, status):
    history.record(_regressed("slower", hour=1, enforced=enforced))
    [row] = history.runs()
    assert row.verdict is status is run_outcome(_regressed("slower", hour=1, enforced=enforced)).status
    assert "tokens/s/GPU -30.0 % vs the last 2 runs" in row.reason and "regressed beyond its band" in row.reason
    assert history.run("slower").run.verdict is status and history.run("slower").combos[0].verdict is Verdict.PASS


def test_a_row_recorded_before_the_verdict_was_the_one_verdict_reads_as_it_was(history: History):
    history.record(_regressed("old", hour=1, enforced=False))
    with history._db.write():  # what a regressed run's row said then: its gates' PASS
        history._db.execute("UPDATE runs SET verdict = 'PASS', reason = '' WHERE run_id = 'old'")
    assert history.run("old").run.verdict is RunStatus.PASS


def test_recording_a_run_again_replaces_its_rows(history: History):
    history.record(make_suite_result("run-a", finished=False, combos=[make_combo(), make_combo("MBS=4", tokens=5.0)]))
    history.record(make_suite_result("run-a", finished=True, combos=[make_combo(tokens=1200.0)]))
    [row] = history.runs()
    assert row.finished and row.combos == 1
    [combo] = history.run("run-a").combos
    assert {m.name: m.value for m in combo.metrics}[TOKENS] == 1200.0


# ---- run ids --------------------------------------------------------------------------------------

def test_run_ids_resolve_by_unique_prefix_and_latest(history: History):
    history.record(make_suite_result("20250301-abc", hour=0))
    history.record(make_suite_result("20250302-abd", hour=1))
    assert history.resolve("20250301") == "20250301-abc"
    assert history.run("latest").run.run_id == "20250302-abd"
    with pytest.raises(MegapilotError, match="matches 2 runs"):
        history.resolve("2025030")


def test_unknown_run_id_names_it_and_how_to_list_ids(history: History):
    history.record(make_suite_result("run-a"))
    with pytest.raises(MegapilotError) as caught:
        history.run("nope")
    assert "'nope'" in str(caught.value) and "megapilot history list" in str(caught.value)


def test_latest_in_an_empty_history_is_a_user_error(history: History):
    with pytest.raises(MegapilotError, match="no runs yet"):
        history.resolve("latest")


# ---- compare --------------------------------------------------------------------------------------

def test_compare_gives_delta_and_direction_per_combo_and_metric(history: History):
    history.record(make_suite_result("a", combos=[make_combo(tokens=1000.0, step_ms=800.0), make_combo("only-a")]))
    history.record(make_suite_result("b", hour=1, combos=[make_combo(tokens=900.0, step_ms=720.0, tflops=300.0),
                                                           make_combo("only-b")]))
    comparison = history.compare("a", "b")
    by_metric = {(d.combo, d.metric): d for d in comparison.deltas}
    tokens, step, tflops = by_metric[(CELL, TOKENS)], by_metric[(CELL, STEP)], by_metric[(CELL, TFLOPS)]
    assert (tokens.value_a, tokens.value_b, tokens.change) == (1000.0, 900.0, "worse")
    assert tokens.delta_pct == pytest.approx(-10.0)
    assert step.delta_pct == pytest.approx(-10.0) and step.change == "better"  # faster steps are better
    assert tflops.change == "unchanged"
    assert comparison.combos_only_in_a == ["only-a"] and comparison.combos_only_in_b == ["only-b"]
    assert (comparison.run_a.run_id, comparison.run_b.run_id) == ("a", "b")


def with_metric(combo: ComboResult, name: str, value: float | None, unit: str = "") -> ComboResult:
    """The combo with one more measured metric row."""
    row = MetricRow(name=name, value=value, unit=unit, verdict=Verdict.RECORD)
    return combo.model_copy(update={"metrics": [*combo.metrics, row]})


def test_compare_calls_zero_to_zero_unchanged_and_a_move_inside_the_band_within_band(history: History):
    history.record(make_suite_result("a", combos=[with_metric(make_combo(tokens=1000.0), NAN_ITERATIONS, 0.0)]))
    history.record(make_suite_result("b", hour=1, combos=[with_metric(make_combo(tokens=1020.0), NAN_ITERATIONS, 0.0)]))
    by_metric = {d.metric: d for d in history.compare("a", "b").deltas}
    assert (by_metric[NAN_ITERATIONS].delta_pct, by_metric[NAN_ITERATIONS].change) == (0.0, "unchanged")
    assert by_metric[TOKENS].change == "within band"  # +2 % inside the 5 % band: noise, not "better"


def cpu_combo(tokens: float = 1000.0) -> ComboResult:
    """A CPU run's cell: its log prints TFLOP/s/GPU 0.0 (one decimal of 0.03), the MFU of a zero reads 0 too."""
    predicted = Prediction(step_time_ms=30.0, tokens_per_s_per_gpu=17000.0, tflops_per_gpu=0.1, mfu_pct=55.0)
    return with_metric(make_combo(tokens=tokens, tflops=0.0, predicted=predicted), MFU, 0.0, "%")


def assert_zero_throughputs_read_as_unmeasured(history: History) -> None:
    detail = history.run("b")
    [combo] = detail.combos
    values = {m.name: m.value for m in combo.metrics}
    assert values[TFLOPS] is None and values[MFU] is None and values[TOKENS] == 1100.0
    assert combo.prediction is not None
    assert (combo.prediction.predicted_tflops_per_gpu, combo.prediction.measured_tflops_per_gpu) == (0.1, None)
    assert (combo.prediction.predicted_mfu_pct, combo.prediction.measured_mfu_pct) == (55.0, None)
    by_metric = {d.metric: d for d in history.compare("a", "b").deltas}
    for name in (TFLOPS, MFU):
        delta = by_metric[name]
        assert (delta.value_a, delta.value_b, delta.delta_pct, delta.change) == (None, None, None, "unknown")
    assert history.baseline(TFLOPS, **BASE) is None  # a zero is no baseline either


def test_a_zero_throughput_or_mfu_is_not_a_measurement(history: History):
    """A CPU run measures no TFLOP/s (the log rounds it to 0.0) and no MFU: missing, not 0 'unchanged'."""
    history.record(make_suite_result("a", combos=[cpu_combo()]))
    history.record(make_suite_result("b", hour=1, combos=[cpu_combo(tokens=1100.0)]))
    assert_zero_throughputs_read_as_unmeasured(history)


def test_the_zero_rule_is_the_metric_table_s(history: History, monkeypatch):
    """A row without `zero_unmeasured` keeps its zero: the history reads the rule from the suite's metric table."""
    for name in (TFLOPS, "training.tflops_per_gpu"):
        monkeypatch.setitem(METRICS, name, replace(METRICS[name], zero_unmeasured=False))
    history.record(make_suite_result("a", combos=[cpu_combo()]))
    [combo] = history.run("a").combos
    assert {m.name: m.value for m in combo.metrics}[TFLOPS] == 0.0
    assert combo.prediction is not None and combo.prediction.measured_tflops_per_gpu == 0.0
    assert {m.name: m.value for m in combo.metrics}[MFU] is None  # its row still says so


def test_zero_throughputs_recorded_before_read_as_unmeasured(history: History, monkeypatch):
    with monkeypatch.context() as recorded_as_given:  # rows as a history written before the rule holds them
        recorded_as_given.setattr(history_module, "_measured_value", lambda name, value: value, raising=False)
        history.record(make_suite_result("a", combos=[cpu_combo()]))
        history.record(make_suite_result("b", hour=1, combos=[cpu_combo(tokens=1100.0)]))
        assert {m.name: m.value for m in history.run("b").combos[0].metrics}[TFLOPS] == 0.0
    assert_zero_throughputs_read_as_unmeasured(history)


# ---- resume ---------------------------------------------------------------------------------------

def test_finished_combos_are_the_terminal_ones(history: History):
    combos = [make_combo("pass"), make_combo("fail", verdict=Verdict.FAIL), make_combo("record",
                                                                                       verdict=Verdict.RECORD),
              make_combo("skipped", verdict=Verdict.SKIPPED),
              make_combo("cancelled", verdict=Verdict.FAIL, job_state="CANCELLED")]
    history.record(make_suite_result("run-a", finished=False, combos=combos))
    assert history.finished_combos("run-a") == {"pass", "fail", "record"}


# ---- baselines ------------------------------------------------------------------------------------

BASE = {"model": "llama3.1-8b", "layout": "TP=1,PP=1,CP=1,EP=1,DP=8", "gpu": "MI300X", "combo_key": CELL}


def test_baseline_is_the_median_of_the_last_n_passing_runs_of_the_same_cell(history: History):
    for hour, tokens in enumerate([500.0, 1000.0, 1100.0, 900.0]):  # the oldest falls outside last_n=3
        history.record(make_suite_result(f"pass-{hour}", hour=hour, combos=[make_combo(tokens=tokens)]))
    history.record(make_suite_result("failed", hour=10, verdict=Verdict.FAIL, combos=[make_combo(tokens=1.0)]))
    history.record(make_suite_result("other-gpu", hour=11, gpu="H100", combos=[make_combo(tokens=5000.0)]))
    history.record(make_suite_result("other-layout", hour=12, combos=[make_combo(tokens=7000.0, tp=2)]))
    history.record(make_suite_result("other-cell", hour=13, combos=[make_combo("MBS=4", tokens=7000.0)]))
    stats = history.baseline(TOKENS, **BASE, last_n=3)
    assert stats is not None
    assert (stats.median, stats.count, stats.run_ids) == (1000.0, 3, ["pass-3", "pass-2", "pass-1"])
    assert stats.values == [900.0, 1100.0, 1000.0] and stats.mean == pytest.approx(1000.0)
    assert stats.stdev == pytest.approx(100.0)


def test_baseline_leaves_out_the_run_itself_and_counts_recorded_runs(history: History):
    history.record(make_suite_result("first", combos=[make_combo(verdict=Verdict.RECORD, tokens=800.0)]))
    history.record(make_suite_result("current", hour=1, combos=[make_combo(tokens=400.0)]))
    stats = history.baseline(TOKENS, **BASE, exclude_run="current")
    assert stats is not None and (stats.median, stats.count, stats.stdev) == (800.0, 1, None)


def test_no_baseline_without_passing_history(history: History):
    history.record(make_suite_result("failed", verdict=Verdict.FAIL))
    assert history.baseline(TOKENS, **BASE) is None


def test_a_warned_run_still_counts_for_the_baseline_and_an_enforced_one_does_not(history: History):
    """A WARN passed its gates: as before it was stored as WARN, a lasting change becomes the baseline after a few
    runs. A regression enforced failed the run, and a failed run is no baseline."""
    history.record(make_suite_result("first", combos=[make_combo(tokens=1000.0)]))
    history.record(_regressed("warned", hour=1, enforced=False))
    history.record(_regressed("failed", hour=2, enforced=True))
    stats = history.baseline(TOKENS, **BASE)
    assert stats is not None and stats.run_ids == ["warned", "first"]


# ---- calibration ----------------------------------------------------------------------------------

def test_calibration_groups_errors_by_gpu_and_model_family(history: History):
    def run(run_id: str, gpu: str, family: str, predicted_ms: float, measured_ms: float) -> SuiteResult:
        combo = make_combo(step_ms=measured_ms, tokens=1000.0,
                           predicted=Prediction(step_time_ms=predicted_ms, tokens_per_s_per_gpu=1000.0))
        return make_suite_result(run_id, gpu=gpu, family=family, combos=[combo])

    history.record(run("a", "MI300X", "llama", 900.0, 1000.0))   # -10 %
    history.record(run("b", "MI300X", "llama", 1200.0, 1000.0))  # +20 %
    history.record(run("c", "MI300X", "llama", 1050.0, 1000.0))  # +5 %
    history.record(run("d", "H100", "qwen", 500.0, 400.0))       # +25 %
    history.record(make_suite_result("unpredicted"))
    rows = {(r.gpu, r.model_family, r.quantity): r for r in history.calibration()}
    assert set(rows) == {("H100", "qwen", "step_time_ms"), ("H100", "qwen", "tokens_per_s_per_gpu"),
                         ("MI300X", "llama", "step_time_ms"), ("MI300X", "llama", "tokens_per_s_per_gpu")}
    llama = rows[("MI300X", "llama", "step_time_ms")]
    assert llama.count == 3
    assert llama.median_abs_error_pct == pytest.approx(10.0)
    assert llama.mean_signed_error_pct == pytest.approx(5.0)
    assert rows[("H100", "qwen", "step_time_ms")].mean_signed_error_pct == pytest.approx(25.0)
    assert rows[("MI300X", "llama", "tokens_per_s_per_gpu")].median_abs_error_pct == 0.0


# ---- secrets --------------------------------------------------------------------------------------

def test_nothing_secret_reaches_the_database_file(tmp_path):
    leaky = make_combo(reason=f"failed; HF_TOKEN={FAKE_TOKEN} was set",
                       command=f"HF_TOKEN={FAKE_TOKEN} torchrun pretrain_gpt.py --hf-token {FAKE_TOKEN}",
                       log_tail=[f"token {FAKE_TOKEN}"])
    result = make_suite_result("run-a", combos=[leaky], notes=[f"used token {FAKE_TOKEN}"],
                               reason=f"bearer {FAKE_TOKEN}")
    path = tmp_path / "history.sqlite"
    with open_history(str(path)) as history:
        history.record(result)
        assert "<redacted>" in history.run("run-a").combos[0].reason
        everything = b"".join(p.read_bytes() for p in tmp_path.iterdir())  # the WAL file too, while open
        assert FAKE_TOKEN.encode() not in everything and b"torchrun" not in everything
    assert FAKE_TOKEN.encode() not in path.read_bytes()


# ---- files, locations, schema ---------------------------------------------------------------------

def test_default_location_is_the_user_data_dir_unless_overridden(tmp_path, monkeypatch):
    monkeypatch.delenv(HISTORY_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert history_url() == str(tmp_path / "data" / "megapilot" / "history.sqlite")
    monkeypatch.setenv(HISTORY_ENV, str(tmp_path / "env.sqlite"))
    assert history_url() == str(tmp_path / "env.sqlite")
    assert history_url(str(tmp_path / "flag.sqlite")) == str(tmp_path / "flag.sqlite")
    with open_history() as history:
        history.record(make_suite_result("run-a"))
    assert (tmp_path / "env.sqlite").is_file()


def test_sqlite_history_uses_wal_and_records_the_schema_version(tmp_path):
    path = tmp_path / "nested" / "dir" / "history.sqlite"  # parents are created
    open_history(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION


class _RawSqlite:
    """A bare connection speaking the schema's Database protocol, to build an old database by hand."""

    dialect = "sqlite"

    def __init__(self, path: Path):
        self.location = str(path)
        self.connection = sqlite3.connect(path, isolation_level=None)

    def execute(self, sql, params=()):
        self.connection.execute(sql, tuple(params))

    def query(self, sql, params=()):
        return self.connection.execute(sql, tuple(params)).fetchall()

    def write(self):
        from contextlib import contextmanager

        @contextmanager
        def transaction():
            self.connection.execute("BEGIN")
            yield
            self.connection.execute("COMMIT")

        return transaction()


def test_a_version_1_database_is_migrated_on_open_and_keeps_its_runs(tmp_path):
    path = tmp_path / "v1.sqlite"
    raw = _RawSqlite(path)
    assert apply_migrations(raw, target=1) == [1]
    raw.execute("INSERT INTO runs (run_id, started_at, verdict, suite_name, model, gpu, nodes, gpus_per_node, "
                "recorded_at) VALUES ('old-run', ?, 'PASS', 'suite', 'llama3.1-8b', 'MI300X', 1, 8, ?)",
                (T0.isoformat(), T0.isoformat()))
    raw.execute("INSERT INTO combos (run_id, combo_key, verdict, layout) VALUES ('old-run', ?, 'PASS', ?)",
                (CELL, BASE["layout"]))
    raw.execute("INSERT INTO metrics (run_id, combo_key, name, value, verdict) VALUES ('old-run', ?, ?, 950.0, "
                "'PASS')", (CELL, TOKENS))
    raw.connection.close()

    with open_history(str(path)) as history:
        assert history.run("old-run").run.model_family == ""  # the column v2 added, with its default
        assert history.baseline(TOKENS, **BASE).median == 950.0
        history.record(make_suite_result("new-run", combos=[make_combo(predicted=Prediction(step_time_ms=1.0))]))
        assert history.run("new-run").combos[0].prediction is not None  # the v2 table exists
    check = _RawSqlite(path)
    assert schema_version(check) == SCHEMA_VERSION
    assert [row[0] for row in check.query("SELECT version FROM schema_version ORDER BY version")] == [1, 2, 3]


def test_a_database_from_a_newer_megapilot_is_refused(tmp_path):
    path = tmp_path / "future.sqlite"
    open_history(str(path)).close()
    with sqlite3.connect(path) as raw:
        raw.execute("INSERT INTO schema_version VALUES (?, 'from the future', 'now')", (SCHEMA_VERSION + 1,))
    with pytest.raises(MegapilotError, match=f"schema version {SCHEMA_VERSION + 1}"):
        open_history(str(path))


@pytest.mark.parametrize("make_bad", [lambda p: p.mkdir(), lambda p: p.write_bytes(b"not a database at all" * 100)],
                         ids=["directory", "not-sqlite"])
def test_a_path_that_is_not_a_history_is_a_user_error(tmp_path, make_bad):
    path = tmp_path / "history.sqlite"
    make_bad(path)
    with pytest.raises(MegapilotError) as caught:
        open_history(str(path))
    assert caught.value.field == "--db" and str(path) in str(caught.value)


@pytest.mark.parametrize("read_only", [True, False], ids=["reader", "writer"])
def test_another_programs_sqlite_file_is_refused_and_not_written(tmp_path, read_only):
    """A reader used to migrate it (the history's tables added to another program's file); a writer set its journal
    mode to WAL before anything was checked."""
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    connection.close()
    before = path.read_bytes()
    with pytest.raises(MegapilotError, match=r"is not a megapilot history: it holds table\(s\) notes"):
        open_history(str(path), read_only=read_only)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["app.sqlite"]


# ---- damaged, missing, read-only ------------------------------------------------------------------

def write_damaged_history(path: Path) -> bytes:
    """A history with runs whose pages 3 and 4 (bytes 8192-16383, past the header) are overwritten; its bytes."""
    with open_history(str(path)) as history:
        for index in range(3):
            history.record(make_suite_result(f"run-{index}", hour=index,
                                             combos=[make_combo(predicted=Prediction(step_time_ms=750.0))]))
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA journal_mode = DELETE")  # everything in the main file, so the damage is there
    data = bytearray(path.read_bytes())
    data[8192:16384] = b"\xde\xad\xbe\xef" * (8192 // 4)
    path.write_bytes(bytes(data))
    return bytes(data)


def _writable(folder: Path) -> bool:
    probe = folder / ".probe"
    try:
        probe.touch()
    except OSError:
        return False
    probe.unlink()
    return True


@contextmanager
def read_only_folder(folder: Path) -> Iterator[None]:
    """The folder made unwritable for this user: by its mode, or for root (whom modes do not stop) by the immutable
    attribute; the test is skipped where neither holds."""
    folder.chmod(0o555)
    immutable = False
    try:
        if _writable(folder):
            immutable = shutil.which("chattr") is not None and subprocess.run(
                ["chattr", "+i", str(folder)], capture_output=True, check=False).returncode == 0
            if _writable(folder):
                pytest.skip("cannot make a folder read-only here (root without chattr +i)")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True, check=False)
        folder.chmod(0o755)


@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "reader"])
def test_a_damaged_history_is_refused_naming_it_damaged_and_left_as_it_was(tmp_path, read_only):
    path = tmp_path / "history.sqlite"
    damaged = write_damaged_history(path)
    with pytest.raises(MegapilotError) as caught:
        open_history(str(path), read_only=read_only)
    message = str(caught.value)
    assert caught.value.field == "--db" and str(path) in message
    assert "damaged" in message and "malformed" in message and "backup" in message
    assert path.read_bytes() == damaged  # nothing written into it


def test_a_damaged_page_met_after_the_check_is_a_user_error_too(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite"
    write_damaged_history(path)
    monkeypatch.setattr(history_module, "_refuse_damaged", lambda connection, location: None)
    with open_history(str(path), read_only=True) as history, pytest.raises(MegapilotError) as caught:
        for run in history.runs():
            history.run(run.run_id)
        history.calibration()
    assert caught.value.field == "--db" and "damaged" in str(caught.value)


def test_a_reader_reads_what_a_writer_recorded(db_url):
    with open_history(db_url) as history:
        history.record(make_suite_result("run-a", combos=[make_combo(predicted=Prediction(step_time_ms=750.0))]))
    with open_history(db_url, read_only=True) as history:
        assert [row.run_id for row in history.runs()] == ["run-a"]
        assert history.run("latest").combos[0].prediction is not None and history.calibration()


def test_a_reader_changes_nothing_in_the_file(tmp_path):
    path = tmp_path / "history.sqlite"
    with open_history(str(path)) as history:
        history.record(make_suite_result("run-a"))
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA journal_mode = DELETE")  # a reader that switched it to WAL would show
    before = path.read_bytes()
    with open_history(str(path), read_only=True) as history:
        assert [row.run_id for row in history.runs()] == ["run-a"]
        with pytest.raises(MegapilotError):
            history.record(make_suite_result("run-b"))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.sqlite"]


def test_a_reader_of_a_path_that_does_not_exist_creates_nothing(tmp_path):
    path = tmp_path / "no" / "such" / "history.sqlite"
    with pytest.raises(MegapilotError) as caught:
        open_history(str(path), read_only=True)
    assert caught.value.field == "--db" and f"no history at {path}" in str(caught.value)
    assert "megapilot suite run" in str(caught.value)
    assert not (tmp_path / "no").exists()


def test_the_default_history_not_made_yet_reads_as_empty_without_being_made(tmp_path, monkeypatch):
    monkeypatch.delenv(HISTORY_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    with open_history(read_only=True) as history:
        assert history.runs() == [] and history.calibration() == []
        assert history.location == str(tmp_path / "data" / "megapilot" / "history.sqlite")
    assert not (tmp_path / "data").exists()
    # the configured location reads empty until a first run records there (a demo, a CI job's first run)
    monkeypatch.setenv(HISTORY_ENV, str(tmp_path / "env.sqlite"))
    with open_history(read_only=True) as history:
        assert history.runs() == []
    assert not (tmp_path / "env.sqlite").exists()
    with pytest.raises(MegapilotError, match="there is no history"):  # a --db typed on the command line must exist
        open_history(str(tmp_path / "typo.sqlite"), read_only=True)


def test_a_reader_migrates_a_history_from_an_older_megapilot(tmp_path):
    path = tmp_path / "v1.sqlite"
    raw = _RawSqlite(path)
    apply_migrations(raw, target=1)
    raw.connection.close()
    with open_history(str(path), read_only=True) as history:
        assert history.runs() == [] and history.calibration() == []  # v2's predictions table is there
    assert schema_version(_RawSqlite(path)) == SCHEMA_VERSION


def test_a_history_in_a_read_only_folder_reads_and_a_writer_says_the_folder_is_not_writable(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / "history.sqlite"
    with open_history(str(path)) as history:
        history.record(make_suite_result("run-a"))
    assert sorted(p.name for p in folder.iterdir()) == ["history.sqlite"]  # WAL files gone with the last writer
    with read_only_folder(folder):
        with open_history(str(path), read_only=True) as history:
            assert [row.run_id for row in history.runs()] == ["run-a"]
        with pytest.raises(MegapilotError) as caught:
            open_history(str(path))
        message = str(caught.value)
        assert caught.value.field == "--db" and f"its folder {folder} is not writable" in message
        with pytest.raises(MegapilotError, match="not writable"):
            open_history(str(folder / "new.sqlite"))


# ---- concurrent writers ---------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from megapilot.store.history import open_history
    from megapilot.suite.results import SuiteResult

    url, name, result_file, go_file, count = sys.argv[1:6]
    template = SuiteResult.model_validate_json(Path(result_file).read_text())
    while not Path(go_file).exists():  # start together with the other writer
        time.sleep(0.005)
    for index in range(int(count)):
        with open_history(url) as history:  # a fresh open each time: opens race with writes too
            history.record(template.model_copy(update={"run_id": f"{name}-{index}"}))
""")


def run_concurrent_writers(url: str, tmp_path: Path, *, writers: int = 2, runs_each: int = 15) -> None:
    """Start `writers` processes that each record `runs_each` runs into url at the same moment."""
    result_file = tmp_path / "result.json"
    result_file.write_text(make_suite_result("template").model_dump_json())
    go = tmp_path / "go"
    repo = Path(__file__).parents[2]
    processes = [subprocess.Popen([sys.executable, "-c", WRITER, url, f"writer{n}", str(result_file), str(go),
                                   str(runs_each)], cwd=repo, stderr=subprocess.PIPE, text=True)
                 for n in range(writers)]
    go.touch()
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr


def test_two_processes_writing_at_once_both_land(tmp_path):
    url = str(tmp_path / "shared.sqlite")
    run_concurrent_writers(url, tmp_path)
    with open_history(url) as history:
        ids = {row.run_id for row in history.runs(limit=100)}
    assert ids == {f"writer{n}-{i}" for n in range(2) for i in range(15)}


def test_json_of_every_record_type_is_plain_data(history: History):
    history.record(make_suite_result("a", combos=[make_combo(predicted=Prediction(step_time_ms=700.0))]))
    history.record(make_suite_result("b", hour=1))
    for record in (history.runs()[0], history.run("a"), history.compare("a", "b"),
                   history.baseline(TOKENS, **BASE), history.calibration()[0]):
        assert json.loads(record.model_dump_json())


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs, to be filled (mounting needs root: skipped with the reason otherwise)."""
    with small_tmpfs(tmp_path, "1m") as mount:
        yield mount


@pytest.mark.parametrize("read_only", [False, True])
def test_a_history_on_a_full_disk_is_named_full_not_another_file(full_disk, tmp_path, read_only):
    """SQLite says only "disk I/O error" when the -wal or -shm file cannot be made on a full disk: the message says
    the disk is full, not that the file is not a history."""
    path = full_disk / "history.sqlite"
    with open_history(str(tmp_path / "history.sqlite")) as history:
        history.record(make_suite_result("run-1"))
    shutil.copy(tmp_path / "history.sqlite", path)  # no -wal left beside it: closed cleanly
    with open(full_disk / "filler", "wb") as filler:
        filler.write(b"\0" * shutil.disk_usage(full_disk).free)
    with pytest.raises(MegapilotError) as caught, open_history(str(path), read_only=read_only) as history:
        history.record(make_suite_result("run-2"))
    assert caught.value.field == "--db" and f"the disk under {path} is full" in str(caught.value)
    assert caught.value.fix == "free space there, or use another --db"


def test_a_run_deck_of_a_suite_run_already_recorded_is_left_as_it_is_not_refused(tmp_path):
    """Importing the run deck of a suite run megapilot recorded itself: the same ids, the same cluster. It was
    refused with 'give the record its own id'; it is the same run, so it is left as it is and said so."""
    from megapilot.store.measured import from_plan_run
    from megapilot.suite.predicted import predict_combo
    from tests.store.test_measured import _plan

    plan = _plan(mbs=1)
    row = from_plan_run("20261206-1/MBS1", "lab", plan, predict_combo(plan, plan.cluster.gpu), 0.5, completed=True,
                        recorded_at="2026-12-06T06:00:00")
    assert row is not None
    with open_history(str(tmp_path / "h.sqlite")) as history:
        history.record_measured([replace(row, origin="suite")])
        written = history.record_measured([replace(row, origin="import")])
        assert (written.already, written.kept, written.refused) == (("20261206-1/MBS1",), (), ())
        elsewhere = history.record_measured([replace(row, origin="import", cluster="other")])
        assert [problem for _, problem in elsewhere.refused] == [
            "'20261206-1/MBS1' is already the id of a suite run's combo of cluster 'lab' in the history"]


@contextmanager
def file_size_limit(limit_bytes: int) -> Iterator[None]:
    """This process's `ulimit -f` lowered to limit_bytes, and restored (Python ignores SIGXFSZ: a write past the
    limit fails with EFBIG instead of killing the process)."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "reader"])
def test_a_history_past_the_file_size_limit_names_the_limit_and_keeps_its_runs(tmp_path, read_only):
    """A write past `ulimit -f` fails with EFBIG, which SQLite calls a "disk I/O error": it was told as "cannot be
    used as the history ... point --db at a history file", of a history that is fine."""
    path = tmp_path / "history.sqlite"
    with open_history(str(path)) as history:
        history.record(make_suite_result("run-1"))
    with file_size_limit(8192), pytest.raises(MegapilotError) as caught, \
            open_history(str(path), read_only=read_only) as history:
        history.record(make_suite_result("run-2"))
    message = str(caught.value)
    assert caught.value.field == "--db" and f"{path} cannot grow" in message and "`ulimit -f`" in message
    assert "8.0 KiB" in message and caught.value.fix == "raise the limit (`ulimit -f unlimited`) and run the " \
                                                       "command again"
    with open_history(str(path), read_only=True) as history:
        assert [row.run_id for row in history.runs()] == ["run-1"]


def test_a_disk_i_o_error_is_said_to_be_the_disk_s_not_that_the_file_is_no_history():
    error = history_module._sqlite_problem("/nfs/h.sqlite", sqlite3.OperationalError("disk I/O error"),
                                           Path("/nfs/h.sqlite"))
    assert error.field == "--db" and "reading or writing /nfs/h.sqlite failed (disk I/O error)" in str(error)
    assert "not a history" not in str(error) and "file system" in (error.fix or "")


@pytest.mark.parametrize(("url", "fix"), [
    ("postgresql+psycopg://team:pw@db.example/runs", "write it postgresql://team:<redacted>@db.example/runs"),
    ("mysql://db.example/runs", "give a SQLite file's path or a postgresql:// URL"),
    ("sqlite://history.sqlite", "write sqlite:///relative/path or sqlite:////absolute/path"),
])
@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "reader"])
def test_a_url_of_another_database_or_driver_is_refused_not_made_a_local_file(tmp_path, monkeypatch, url, fix,
                                                                                read_only):
    """`--db postgresql+psycopg://...` (SQLAlchemy's spelling) was read as a SQLite path: a writer made the folders
    `postgresql+psycopg:/team:pw@db.example` here and recorded the runs into a file there, the password in its name."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MegapilotError) as caught:
        open_history(url, read_only=read_only)
    assert caught.value.field == "--db" and caught.value.fix is not None and caught.value.fix.startswith(fix)
    assert "pw" not in str(caught.value) and "pw" not in caught.value.fix
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(HISTORY_ENV, url)
    with pytest.raises(MegapilotError) as caught:
        open_history(read_only=read_only)
    assert caught.value.field == f"${HISTORY_ENV}"
    assert list(tmp_path.iterdir()) == []


def test_the_salvage_command_of_a_damaged_history_runs_as_given_in_a_folder_with_a_space(tmp_path, cli):
    """The fix said `sqlite3 PATH .recover | sqlite3 PATH.recovered`, which needs a sqlite3 shell built with
    sqlite_dbpage: Debian 12's is not, and wrote an empty file. The command given now is megapilot's own, quoted
    for a path with a space, and writes a history that opens."""
    folder = tmp_path / "team runs"
    folder.mkdir()
    path = folder / "history.sqlite"
    write_damaged_history(path)
    with pytest.raises(MegapilotError) as caught:
        open_history(str(path), read_only=True)
    command = (caught.value.fix or "").split("`")[1]
    assert shlex.split(command) == ["megapilot", "history", "salvage", str(path)]
    salvaged = cli(*shlex.split(command)[1:])
    assert salvaged.exit_code == 0, salvaged.stderr
    with open_history(str(folder / "history.sqlite.recovered"), read_only=True) as history:
        assert history.runs() == []  # this damage took the runs' one page: the file opens, its loss is said
    assert "all (its pages cannot be reached)" in " ".join(salvaged.stdout.split())


def test_a_run_recorded_after_its_run_deck_was_imported_lands_and_replaces_the_deck_s_rows(history: History,
                                                                                           tmp_path):
    """A suite run whose row was left pending (the history unreachable when it ended) and whose run deck was
    imported meanwhile: `history record` failed whole on the deck's ids (`<run_id>/<cell>`), told as "cannot be
    used as the history (UNIQUE constraint failed)". Its rows land; the deck's row of the same cluster is replaced
    by the suite's, one of another cluster is left as it is."""
    from megapilot.store.measured import from_combo
    from tests.store.test_measured_rows import _combo, _result, _row

    result = _result(tmp_path, cluster="lab-a")
    combo = _combo(_row(TOKENS, 3650.0))
    other = combo.model_copy(update={"key": "MBS=2,GBS=8,PRECISION=BF16"})
    result.combos = [combo, other]
    deck_rows = [replace(row, origin="import", source="megatron_run_deck.json")
                 for c in (combo, other) if (row := from_combo(result, c, "2026-03-02T09:00:00Z")) is not None]
    history.record_measured([deck_rows[0], replace(deck_rows[1], cluster="lab-b")])
    history.record(result)
    assert [row.run_id for row in history.runs()] == [result.run_id]
    assert {(row.id, row.cluster, row.origin) for row in history.measured()} == {
        (deck_rows[0].id, "lab-a", "suite"), (deck_rows[1].id, "lab-b", "import")}


def test_runs_left_in_a_wal_file_of_a_read_only_folder_are_not_dropped_without_a_word(tmp_path):
    """A writer that stopped before its -wal was merged, its -shm gone, in a folder this user cannot write: the
    reader fell back to an immutable open, which reads the main file alone, and listed the history without the runs
    in the -wal. It is refused, naming the -wal and the two ways to read it; the fix's merge command works."""
    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / "history.sqlite"
    with open_history(str(path)) as history:
        history.record(make_suite_result("merged"))
    stop_before_merging = textwrap.dedent("""
        import os, sys
        from megapilot.store.history import open_history
        from megapilot.suite.results import SuiteResult
        history = open_history(sys.argv[1])
        history._db._connection.execute("PRAGMA wal_autocheckpoint = 0")
        history.record(SuiteResult.model_validate_json(sys.argv[2]))
        os._exit(0)  # no close: the -wal is left as a crash leaves it
    """)
    subprocess.run([sys.executable, "-c", stop_before_merging, str(path),
                    make_suite_result("in-wal", hour=1).model_dump_json()],
                   cwd=Path(__file__).parents[2], check=True, capture_output=True)
    (folder / "history.sqlite-shm").unlink()
    assert (folder / "history.sqlite-wal").stat().st_size > 0
    with read_only_folder(folder), pytest.raises(MegapilotError) as caught:
        open_history(str(path), read_only=True)
    assert caught.value.field == "--db" and f"{path}-wal holds writes not yet merged" in str(caught.value)
    merge = (caught.value.fix or "").split("`")[1]
    if shutil.which("sqlite3"):  # the merge the fix names, then the runs read in the read-only folder
        subprocess.run(["bash", "-c", merge], check=True, capture_output=True)
        with read_only_folder(folder), open_history(str(path), read_only=True) as history:
            assert [row.run_id for row in history.runs()] == ["in-wal", "merged"]


def test_a_reader_of_an_empty_file_reads_an_empty_history_and_writes_nothing_into_it(tmp_path):
    """An empty file (`touch history.sqlite`, a placeholder an admin made) was migrated by `history list`: a read
    command wrote a history into it, and in a read-only folder failed with "cannot be written"."""
    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / "history.sqlite"
    path.touch()
    with open_history(str(path), read_only=True) as history:
        assert history.runs() == [] and history.calibration() == [] and history.clusters() == []
    assert path.read_bytes() == b"" and sorted(p.name for p in folder.iterdir()) == ["history.sqlite"]
    with read_only_folder(folder), open_history(str(path), read_only=True) as history:
        assert history.runs() == [] and history.location == str(path)


@pytest.mark.parametrize("url", ["", "  "])
@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "reader"])
def test_an_empty_db_is_refused_not_read_as_the_default_history(tmp_path, monkeypatch, url, read_only):
    """`--db "$HISTORY"` with the variable unset recorded into the default history without a word ("" read as no
    --db), and `--db " "` read as "there is no history at  "."""
    monkeypatch.delenv(HISTORY_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MegapilotError) as caught:
        open_history(url, read_only=read_only)
    assert caught.value.field == "--db" and "empty" in str(caught.value)
    assert sorted(tmp_path.iterdir()) == []
