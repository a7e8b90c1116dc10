"""`megapilot history list|show|compare|calibration` through the real entry point: tables, the pinned --json
schemas, run ids by prefix and `latest`, and user errors (exit 2, one line naming the fix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.spec import Prediction
from megapilot.store.history import HISTORY_ENV, open_history
from megapilot.suite.results import Verdict
from tests.store.test_history import (
    CELL,
    STEP,
    TOKENS,
    make_combo,
    make_suite_result,
    read_only_folder,
    write_damaged_history,
)

IMPORTED = Path(__file__).resolve().parents[1] / "data" / "history_import" / "published_rows.jsonl"

RUN_KEYS = {"run_id", "started_at", "ended_at", "duration_s", "verdict", "reason", "suite_name", "model",
            "model_family", "gpu", "nodes", "gpus_per_node", "layout", "precision", "backend", "executor",
            "config_hash",
            "run_dir", "megapilot_version", "git_commit", "finished", "combos", "failed_combos"}
COMBO_KEYS = {"key", "verdict", "reason", "layout", "nodes", "gpus_per_node", "tp", "pp", "cp", "ep", "vpp", "mbs",
              "gbs", "precision", "seq_length", "duration_s", "job_state", "metrics", "prediction"}
METRIC_KEYS = {"name", "value", "unit", "verdict", "threshold"}
DELTA_KEYS = {"combo", "metric", "label", "unit", "value_a", "value_b", "delta_pct", "change"}
CALIBRATION_KEYS = {"gpu", "model_family", "quantity", "count", "median_abs_error_pct", "mean_signed_error_pct"}


@pytest.fixture
def db(tmp_path, monkeypatch) -> str:
    """A history with three runs of one cell (the last one slower) and one on another GPU; $MEGAPILOT_HISTORY
    points at it, so commands without --db read it."""
    path = str(tmp_path / "history.sqlite")
    monkeypatch.setenv(HISTORY_ENV, path)
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: table cells are not wrapped mid-word
    predicted = Prediction(step_time_ms=750.0, tokens_per_s_per_gpu=1050.0)
    with open_history(path) as history:
        history.record(make_suite_result("20250301-aaa", hour=0, combos=[make_combo(predicted=predicted)]))
        history.record(make_suite_result("20250302-bbb", hour=1, combos=[make_combo(predicted=predicted)]))
        history.record(make_suite_result("20250303-ccc", hour=2, verdict=Verdict.FAIL, combos=[
            make_combo(tokens=900.0, step_ms=880.0, predicted=predicted),
            make_combo("MBS=4,GBS=64,PRECISION=BF16", verdict=Verdict.FAIL, tokens=None, tflops=None, step_ms=None,
                       reason="out of memory on rank 3")]))
        history.record(make_suite_result("20250304-h100", hour=3, gpu="H100", family="llama"))
    return path


def test_list_json_is_newest_first_with_the_pinned_keys(cli, db):
    rows = cli("history", "list", "--json").json()
    assert [r["run_id"] for r in rows] == ["20250304-h100", "20250303-ccc", "20250302-bbb", "20250301-aaa"]
    assert all(set(row) == RUN_KEYS for row in rows)
    assert rows[1]["verdict"] == "FAIL" and rows[1]["failed_combos"] == 1 and rows[1]["combos"] == 2


def test_list_filters_and_limit(cli, db):
    assert [r["run_id"] for r in cli("history", "list", "--gpu", "h100", "--json").json()] == ["20250304-h100"]
    assert len(cli("history", "list", "--limit", "2", "--json").json()) == 2
    assert cli("history", "list", "--model", "no-such-model", "--json").json() == []


def test_list_table_shows_runs(cli, db):
    result = cli("history", "list")
    assert result.exit_code == 0
    assert "20250303-ccc" in result.stdout and "FAIL" in result.stdout and "MI300X" in result.stdout


def test_the_configured_history_before_its_first_run_lists_nothing(cli, tmp_path, monkeypatch):
    """What the demo asks before its first suite run: $MEGAPILOT_HISTORY names a file no run has made yet."""
    monkeypatch.setenv(HISTORY_ENV, str(tmp_path / "demo" / "history.sqlite"))
    result = cli("history", "list", "--limit", "1", "--json")
    assert result.exit_code == 0 and result.json() == []
    assert not (tmp_path / "demo").exists()


def test_db_flag_wins_over_the_environment(cli, db, tmp_path):
    other = tmp_path / "other.sqlite"
    open_history(str(other)).close()
    assert cli("history", "list", "--db", str(other), "--json").json() == []
    empty = cli("history", "list", "--db", str(other))
    assert empty.exit_code == 0 and "no runs in" in empty.stdout


def test_show_by_prefix_and_latest(cli, db):
    detail = cli("history", "show", "20250303", "--json").json()
    assert set(detail) == {"run", "combos"} and set(detail["run"]) == RUN_KEYS
    assert detail["run"]["run_id"] == "20250303-ccc"
    assert all(set(combo) == COMBO_KEYS for combo in detail["combos"])
    cell = next(c for c in detail["combos"] if c["key"] == CELL)
    assert all(set(metric) == METRIC_KEYS for metric in cell["metrics"])
    assert {m["name"]: m["value"] for m in cell["metrics"]}[TOKENS] == 900.0
    prediction = cell["prediction"]
    assert prediction["predicted_step_time_ms"] == 750.0 and prediction["measured_step_time_ms"] == 880.0
    assert cli("history", "show", "latest", "--json").json()["run"]["run_id"] == "20250304-h100"


def test_show_table_names_combos_and_reasons(cli, db):
    result = cli("history", "show", "20250303-ccc")
    assert result.exit_code == 0
    assert "out of memory on rank 3" in result.stdout and "tokens/s/GPU" in result.stdout


def test_compare_json_and_table(cli, db):
    payload = cli("history", "compare", "20250302", "20250303", "--json").json()
    assert set(payload) == {"run_a", "run_b", "differences", "deltas", "combos_only_in_a", "combos_only_in_b"}
    assert payload["differences"] == []  # one setup run twice
    assert all(set(delta) == DELTA_KEYS for delta in payload["deltas"])
    by_metric = {d["metric"]: d for d in payload["deltas"]}
    assert by_metric[TOKENS]["change"] == "worse" and by_metric[TOKENS]["delta_pct"] == pytest.approx(-10.0)
    assert by_metric[STEP]["change"] == "worse" and by_metric[STEP]["delta_pct"] == pytest.approx(10.0)
    assert payload["combos_only_in_b"] == ["MBS=4,GBS=64,PRECISION=BF16"]
    table = cli("history", "compare", "20250302", "20250303")
    assert table.exit_code == 0 and "worse" in table.stdout and "-10.0 %" in table.stdout


def test_compare_says_each_runs_verdict_at_the_top(cli, db):
    """Figures compared with a run that failed are not a better or worse run: its verdict is said first."""
    first_line = cli("history", "compare", "20250302", "20250303").stdout.splitlines()[0]
    assert first_line == "B = 20250303-ccc FAIL against A = 20250302-bbb PASS"


def test_calibration_json_and_table(cli, db):
    rows = cli("history", "calibration", "--json").json()["predicted_vs_measured"]
    assert all(set(row) == CALIBRATION_KEYS for row in rows)
    step = next(r for r in rows if r["gpu"] == "MI300X" and r["quantity"] == "step_time_ms")
    assert step["count"] == 3 and step["model_family"] == "llama"
    assert step["mean_signed_error_pct"] == pytest.approx(((750 / 800 - 1) * 2 + (750 / 880 - 1)) / 3 * 100)
    table = cli("history", "calibration")
    assert table.exit_code == 0 and "step time" in table.stdout and "tokens/s/GPU" in table.stdout


def test_calibration_json_carries_the_cluster_fits_its_table_shows(cli, tmp_path):
    path = str(tmp_path / "imported.sqlite")
    assert cli("history", "import", str(IMPORTED), "--db", path).exit_code == 0
    table = cli("history", "calibration", "--db", path)
    assert table.exit_code == 0 and "cluster nvidia-dgx-gb200" in table.stdout and "GB200 / fp8 / dense" in table.stdout
    payload = cli("history", "calibration", "--db", path, "--json").json()
    assert payload["predicted_vs_measured"] == []  # imported runs are no suite combos
    [cluster] = payload["clusters"]
    assert cluster["cluster"] == "nvidia-dgx-gb200"
    assert [(g["gpu"], g["precision"], g["family"], g["runs"]) for g in cluster["groups"]] == [
        ("GB200", "fp8", "dense", 4)]
    # --cluster prints that one object, as before
    assert cli("history", "calibration", "--db", path, "--cluster", "nvidia-dgx-gb200", "--json").json() == cluster


def test_calibration_of_an_empty_history_says_so(cli, tmp_path):
    open_history(str(tmp_path / "empty.sqlite")).close()
    result = cli("history", "calibration", "--db", str(tmp_path / "empty.sqlite"))
    assert result.exit_code == 0 and "no combo" in result.stdout


@pytest.mark.parametrize("args", [("show", "no-such-run"), ("compare", "20250301", "nope"), ("show", "2025030")],
                         ids=["unknown", "unknown-in-compare", "ambiguous-prefix"])
def test_bad_run_ids_exit_2_naming_the_id(cli, db, args):
    result = cli("history", *args, "--json")
    assert result.exit_code == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert repr(args[-1]) in result.stderr


def test_unknown_run_id_says_how_to_list_ids(cli, db):
    result = cli("history", "show", "no-such-run")
    assert result.exit_code == 2 and "megapilot history list" in result.stderr


def test_a_database_path_that_is_a_directory_exits_2(cli, tmp_path):
    result = cli("history", "list", "--db", str(tmp_path))
    assert result.exit_code == 2 and "--db" in result.stderr and "directory" in result.stderr


def test_a_zero_limit_exits_2(cli, db):
    result = cli("history", "list", "--limit", "0")
    assert result.exit_code == 2 and "--limit" in result.stderr


READS = [("list",), ("show", "latest"), ("compare", "latest", "latest"), ("calibration",), ("calibration", "--json")]
READ_IDS = ["list", "show", "compare", "calibration", "calibration-json"]


def _one_line_error(result) -> str:
    assert result.exit_code == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


@pytest.mark.parametrize("args", READS, ids=READ_IDS)
def test_reading_a_db_that_does_not_exist_exits_2_and_creates_nothing(cli, tmp_path, args):
    missing = tmp_path / "no" / "such" / "history.sqlite"
    error = _one_line_error(cli("history", *args, "--db", str(missing)))
    assert "--db" in error and f"no history at {missing}" in error and "megapilot suite run" in error
    assert not (tmp_path / "no").exists()


def test_reading_the_default_history_not_made_yet_says_no_runs_and_creates_nothing(cli, tmp_path, monkeypatch):
    monkeypatch.delenv(HISTORY_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    result = cli("history", "list")
    assert result.exit_code == 0 and "no runs in" in result.stdout
    assert cli("history", "calibration", "--json").json() == {"predicted_vs_measured": [], "clusters": []}
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("args", [*READS, ("import", str(IMPORTED))], ids=[*READ_IDS, "import"])
def test_a_damaged_history_exits_2_naming_it_damaged_and_is_not_written(cli, tmp_path, args):
    path = tmp_path / "history.sqlite"
    damaged = write_damaged_history(path)
    error = _one_line_error(cli("history", *args, "--db", str(path)))
    assert "--db" in error and str(path) in error and "damaged" in error and "malformed" in error
    assert "fix:" in error and "backup" in error
    assert path.read_bytes() == damaged


def test_a_history_in_a_read_only_folder_reads_and_import_says_it_is_not_writable(cli, tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / "history.sqlite"
    with open_history(str(path)) as history:
        history.record(make_suite_result("20250301-aaa", combos=[make_combo(predicted=Prediction(step_time_ms=750.0))]))
    with read_only_folder(folder):
        assert [row["run_id"] for row in cli("history", "list", "--db", str(path), "--json").json()] == ["20250301-aaa"]
        assert cli("history", "show", "latest", "--db", str(path), "--json").json()["run"]["run_id"] == "20250301-aaa"
        assert cli("history", "calibration", "--db", str(path), "--json").json()["predicted_vs_measured"]
        error = _one_line_error(cli("history", "import", str(IMPORTED), "--db", str(path)))
        assert "--db" in error and "not writable" in error and "pass a file path" not in error


def _table_row(stdout: str, label: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if label in line)
    return line.split(label, 1)[1].split()


def test_a_cpu_runs_throughput_and_mfu_show_as_not_measured(cli, tmp_path, monkeypatch):
    """A CPU run's log prints TFLOP/s/GPU 0.0 (the MFU of a zero is 0): "-" in show and compare, null in --json."""
    from tests.store.test_history import MFU, TFLOPS, cpu_combo

    path = str(tmp_path / "history.sqlite")
    monkeypatch.setenv("COLUMNS", "200")
    with open_history(path) as history:
        history.record(make_suite_result("cpu-a", gpu="CPU", combos=[cpu_combo()]))
        history.record(make_suite_result("cpu-b", gpu="CPU", hour=1, combos=[cpu_combo(tokens=1100.0)]))
    compared = cli("history", "compare", "cpu-a", "cpu-b", "--db", path)
    assert _table_row(compared.stdout, "TFLOP/s/GPU") == ["-", "-", "-", "unknown"]
    assert _table_row(compared.stdout, "MFU %") == ["-", "-", "-", "unknown"]
    deltas = {d["metric"]: d for d in cli("history", "compare", "cpu-a", "cpu-b", "--db", path, "--json").json()[
        "deltas"]}
    assert deltas[TFLOPS]["value_a"] is None and deltas[TFLOPS]["value_b"] is None and deltas[MFU]["value_b"] is None
    shown = cli("history", "show", "cpu-b", "--db", path)
    assert _table_row(shown.stdout, "TFLOP/s/GPU")[0] == "-"
    assert _table_row(shown.stdout, "MFU %") == ["-", "%", "55"]  # measured nothing, predicted 55 %
    [combo] = cli("history", "show", "cpu-b", "--db", path, "--json").json()["combos"]
    assert {m["name"]: m["value"] for m in combo["metrics"]}[TFLOPS] is None
    assert combo["prediction"]["measured_tflops_per_gpu"] is None and combo["prediction"]["measured_mfu_pct"] is None


def test_a_history_of_imported_runs_only_says_where_they_are_listed(cli, tmp_path):
    path = str(tmp_path / "imported.sqlite")
    assert cli("history", "import", str(IMPORTED), "--db", path).exit_code == 0
    listed = cli("history", "list", "--db", path)
    assert listed.exit_code == 0 and "no runs in" in listed.stdout
    assert "measured runs of cluster(s) nvidia-dgx-gb200 are listed by `megapilot history calibration`" in " ".join(
        listed.stdout.split())


def test_a_cluster_of_one_run_shows_no_held_out_calibrated_error(cli, tmp_path):
    """One run: nothing is held out, so its calibrated held-out error is '-' and null, not the plain model's error
    printed again as if a fit had been checked on it; the uncalibrated error is the same figure in both."""
    path = str(tmp_path / "one.sqlite")
    one = tmp_path / "one.jsonl"
    one.write_text(IMPORTED.read_text().splitlines()[0] + "\n")
    assert cli("history", "import", str(one), "--db", path).exit_code == 0
    [group] = cli("history", "calibration", "--db", path, "--cluster", "nvidia-dgx-gb200", "--json").json()["groups"]
    assert group["runs"] == 1 and group["held_out_median_pct"] is None and group["held_out_p90_pct"] is None
    assert set(group["held_out_median_pct_by_correction"].values()) == {None}
    row = _table_row(cli("history", "calibration", "--db", path).stdout, "GB200")
    assert row[-4:] == [f"{group['uncalibrated_median_pct']:.1f}", "%", "-", "-"]


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_calibration_of_a_cluster_not_in_the_history_exits_2_naming_the_clusters_it_has(cli, db, as_json):
    """A misspelt --cluster used to print 'no combo ... has both a prediction and a measurement' (exit 0), or a
    cluster with no groups in --json, as if that cluster had no runs yet."""
    assert cli("history", "import", str(IMPORTED)).exit_code == 0
    result = cli("history", "calibration", "--cluster", "nvidia-dgx-gb2000", *(["--json"] if as_json else []))
    assert result.exit_code == 2 and result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "--cluster: no measured run of cluster 'nvidia-dgx-gb2000'" in result.stderr
    assert "use one of: nvidia-dgx-gb200" in result.stderr


def test_calibration_of_one_cluster_shows_what_its_json_holds(cli, db):
    """With --cluster the table is that cluster's, as its --json is; the suite combos' errors were printed above
    it, figures its --json does not hold."""
    assert cli("history", "import", str(IMPORTED)).exit_code == 0
    shown = cli("history", "calibration", "--cluster", "nvidia-dgx-gb200")
    assert shown.exit_code == 0 and "cluster nvidia-dgx-gb200" in shown.stdout
    assert "predicted vs measured" not in shown.stdout and "MI300X" not in shown.stdout


def test_compare_names_what_differs_between_runs_of_other_setups(cli, db):
    """Runs of another GPU, model or layout were compared metric by metric ('better', +100 %) with no word that they
    are different setups; runs with no combo in common printed an empty table."""
    with open_history(db) as history:
        history.record(make_suite_result("20250305-qwen", hour=4, model="qwen3-30b-a3b", family="qwen",
                                         combos=[make_combo("TP=2", tp=2)]))
        history.record(make_suite_result("20250306-tp2", hour=5, combos=[make_combo(tp=2)]))
    payload = cli("history", "compare", "20250302", "20250304-h100", "--json").json()
    assert payload["differences"] == [{"combo": None, "field": "gpu", "value_a": "MI300X", "value_b": "H100"}]
    table = cli("history", "compare", "20250302", "20250304-h100")
    assert "the runs differ: GPU MI300X (A) vs H100 (B)" in table.stdout and "tokens/s/GPU" in table.stdout
    layouts = cli("history", "compare", "20250302", "20250306-tp2", "--json").json()["differences"]
    assert layouts == [{"combo": CELL, "field": "layout", "value_a": "TP=1,PP=1,CP=1,EP=1,DP=8",
                        "value_b": "TP=2,PP=1,CP=1,EP=1,DP=4"}]
    other = cli("history", "compare", "20250302", "20250305-qwen")
    assert other.exit_code == 0
    assert "the runs differ: model llama3.1-8b (A) vs qwen3-30b-a3b (B)" in other.stdout
    assert "no combo in both runs has a metric to compare" in other.stdout and "verdict" not in other.stdout
    assert f"only in A: {CELL}" in other.stdout and "only in B: TP=2" in other.stdout


def test_a_run_compared_with_itself_exits_2(cli, db):
    result = cli("history", "compare", "latest", "20250304", "--json")
    assert result.exit_code == 2 and result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "RUN_B: '20250304' is the run A names (20250304-h100)" in result.stderr


def test_record_takes_the_runs_suite_json_as_well_as_its_directory(cli, tmp_path):
    """`history record RUN_DIR/suite.json` said the file 'has no suite.json'."""
    from tests.report.factory import write_run_dir

    run_dir = tmp_path / "run"
    result = write_run_dir(run_dir)
    path = str(tmp_path / "h.sqlite")
    recorded = cli("history", "record", str(run_dir / "suite.json"), "--db", path)
    assert recorded.exit_code == 0, recorded.stderr
    assert cli("history", "show", "latest", "--db", path, "--json").json()["run"]["run_id"] == result.run_id


def test_record_json_is_the_recorded_run_as_list_prints_it_and_where(cli, tmp_path):
    """`history record` had no --json (every command has one): a script recording a pending run could not read
    what was written where."""
    from megapilot.store.history import PENDING_NAME
    from tests.report.factory import write_run_dir

    run_dir = tmp_path / "run"
    result = write_run_dir(run_dir)
    (run_dir / PENDING_NAME).write_text("{}")
    path = str(tmp_path / "h.sqlite")
    recorded = cli("history", "record", str(run_dir), "--db", path, "--json")
    assert recorded.exit_code == 0, recorded.stderr
    payload = recorded.json()
    assert set(payload) == {"run", "location"} and set(payload["run"]) == RUN_KEYS
    assert payload["run"] == cli("history", "list", "--db", path, "--json").json()[0]
    assert payload["run"]["run_id"] == result.run_id and payload["location"] == path
    assert not (run_dir / PENDING_NAME).exists()


def test_an_empty_run_id_is_refused_as_empty(cli, db):
    """'' is a prefix of every id: it was refused as matching every run ('type more of the run id')."""
    result = cli("history", "show", "")
    assert result.exit_code == 2 and "RUN: the run id is empty" in result.stderr


def test_an_import_whose_every_record_is_refused_creates_no_history(cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "model": "tiny"}\n')  # no GPU, no step time: refused by field
    target = tmp_path / "new" / "history.sqlite"
    result = cli("history", "import", str(bad), "--db", str(target))
    assert result.exit_code == 2 and "refused" in result.stderr and "imported nothing (1 refused)" in result.stdout
    assert not target.parent.exists()


def test_calibration_names_a_recorded_run_it_set_aside_and_why(cli, tmp_path):
    """A `megapilot run` whose step is 500x its prediction (it timed one warm-up step) stays in the history, but the
    cluster's fit leaves it out: its table counts one run and says which one it set aside, as its --json does."""
    from megapilot.store.measured import from_plan_run
    from megapilot.suite.predicted import predict_combo
    from tests.store.test_measured import _plan

    plan = _plan(mbs=1)
    predicted = predict_combo(plan, plan.cluster.gpu)
    step_s = predicted.uncalibrated_step_time_ms / 1000
    rows = [from_plan_run(run_id, "lab", plan, predicted, factor * step_s, completed=True, recorded_at=run_id)
            for run_id, factor in (("run/a@1", 1.2), ("run/warmup@2", 500.0))]
    path = str(tmp_path / "h.sqlite")
    with open_history(path) as history:
        history.record_measured([row for row in rows if row is not None])
    [group] = cli("history", "calibration", "--db", path, "--cluster", "lab", "--json").json()["groups"]
    assert group["runs"] == 1 and [aside["id"] for aside in group["set_aside"]] == ["run/warmup@2"]
    assert "500 times the" in group["set_aside"][0]["why"]
    shown = cli("history", "calibration", "--db", path, "--cluster", "lab")
    assert shown.exit_code == 0 and "set aside run/warmup@2" in " ".join(shown.stdout.split())


@pytest.mark.parametrize("spelling", ["NVIDIA-DGX-GB200", " nvidia-dgx-gb200  "])
def test_a_cluster_is_found_under_any_spelling_of_its_name(cli, tmp_path, spelling):
    """Runs imported under nvidia-dgx-gb200 calibrate `estimate --cluster` and `history calibration --cluster` given
    another case or stray spaces (matched exactly, they read as a cluster with no runs and exited 2)."""
    path = str(tmp_path / "imported.sqlite")
    assert cli("history", "import", str(IMPORTED), "--db", path).exit_code == 0
    about = cli("estimate", "--model", "llama3.1-8b", "--gpu", "gb200", "--gpus", "16", "--mbs", "2", "--gbs", "256",
                "--seq-len", "8192", "--precision", "fp8", "--cluster", spelling, "--db", path,
                "--json").json()["calibration_from_history"]
    assert about["applied"] and about["runs_used"]
    [group] = cli("history", "calibration", "--db", path, "--cluster", spelling, "--json").json()["groups"]
    assert group["runs"] == 4


# What reading the history needs: its rows, the verdict types and the metric table. The suite's results and
# outcome policy, the findings, the layout types and the estimator (0.5 CPU-s to import together) only serve
# recording a suite run, importing runs and the calibration.
HISTORY_READS_WITHOUT = ("megapilot.suite.results", "megapilot.suite.outcome", "megapilot.suite.gates",
                         "megapilot.diagnose", "megapilot.estimate", "megapilot.spec", "megapilot.logs")


@pytest.mark.parametrize("args", [["history", "list"], ["history", "list", "--json"], ["history", "show", "latest"],
                                  ["history", "compare", "20250301", "latest", "--json"]])
def test_reading_the_history_loads_no_suite_result_or_estimator(db, args):
    """Checked in a fresh interpreter (this test process has imported everything already)."""
    import subprocess
    import sys

    probe = ("import contextlib, io, sys\n"
             "from megapilot.cli.app import main\n"
             "out = io.StringIO()\n"
             "try:\n"
             "    with contextlib.redirect_stdout(out):\n"
             f"        main({args!r})\n"
             "except SystemExit as exc:\n"
             "    assert not exc.code, exc.code\n"
             "assert '20250304-h100' in out.getvalue() or '20250301-aaa' in out.getvalue(), out.getvalue()\n"
             "print(' '.join(sorted(sys.modules)))\n")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            timeout=60).stdout.split()
    assert [m for m in loaded if m.startswith(HISTORY_READS_WITHOUT)] == []


def test_history_salvage_writes_a_history_says_what_it_lost_and_never_overwrites(cli, tmp_path):
    path = tmp_path / "history.sqlite"
    write_damaged_history(path)
    done = cli("history", "salvage", str(path), "--json")
    assert done.exit_code == 0, done.stderr
    report = done.json()
    assert report["target"] == f"{path}.recovered" and report["lost"] > 0
    assert next(t for t in report["tables"] if t["table"] == "runs")["unreadable"] is None  # its one page is gone
    listed = cli("history", "list", "--db", report["target"])
    assert listed.exit_code == 0 and "no runs in" in listed.stdout
    again = cli("history", "salvage", str(path))
    assert again.exit_code == 2 and "--output" in again.stderr and "Traceback" not in again.stderr
    missing = cli("history", "salvage", str(tmp_path / "none.sqlite"))
    assert missing.exit_code == 2 and "PATH" in missing.stderr
