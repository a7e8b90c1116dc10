"""A cluster's name is one concept wherever it is written or looked up: `history import` trimmed it, `suite run` and
`megapilot run` stored `--cluster-name` as typed, and every lookup (`estimate`/`plan --cluster`, the suite's
calibration, `history calibration --cluster`) matched it exactly, so "Lab-H100 " from a suite run, "Lab-H100" from an
import and `--cluster lab-h100` were three clusters. `cluster_key` is how two spellings are told the same."""

from __future__ import annotations

import pytest

from megapilot.errors import MegapilotError
from megapilot.store.history import open_history
from megapilot.store.measured import cluster_key, cluster_name, from_plan_run
from megapilot.suite.predicted import predict_combo
from tests.store.test_measured import _plan


def test_spellings_of_one_cluster_share_one_key() -> None:
    assert cluster_name("  Lab-H100 ") == "Lab-H100" and cluster_name("lab  h100\t") == "lab h100"
    assert cluster_key("Lab-H100 ") == cluster_key("lab-h100") == cluster_key(" LAB-H100")
    assert cluster_key("lab-h100") != cluster_key("lab-h200") and cluster_key("lab h100") != cluster_key("labh100")


def _row(run_id: str, cluster: str, step_factor: float = 1.2):
    plan = _plan(mbs=1)
    predicted = predict_combo(plan, plan.cluster.gpu)
    row = from_plan_run(run_id, cluster, plan, predicted, step_factor * predicted.uncalibrated_step_time_ms / 1000,
                        completed=True, recorded_at=run_id)
    assert row is not None
    return row


def test_a_run_is_stored_under_its_cluster_s_name_trimmed() -> None:
    assert _row("run/a@1", " Lab-H100  ").cluster == "Lab-H100"


def test_runs_recorded_under_spellings_of_one_cluster_are_one_cluster_however_it_is_looked_up(tmp_path) -> None:
    with open_history(str(tmp_path / "h.sqlite")) as history:
        history.record_measured([_row("run/a@1", "Lab-H100 ")])
        history.record_measured([_row("run/b@2", "lab-h100", 1.3)])
        assert history.clusters() == ["Lab-H100"]  # the first spelling recorded is the one kept
        assert {row.cluster for row in history.measured()} == {"Lab-H100"}
        for spelling in ("Lab-H100", "lab-h100", " LAB-H100 "):
            assert [row.id for row in history.measured(spelling)] == ["run/a@1", "run/b@2"]
            assert [run.run_id for run in history.calibration_runs(spelling)] == ["run/a@1", "run/b@2"]
            history.require_cluster(spelling)
        with pytest.raises(MegapilotError, match="lab-h200"):
            history.require_cluster("lab-h200")


def test_a_run_recorded_again_under_another_spelling_of_its_cluster_replaces_itself(tmp_path) -> None:
    """The same id of the same origin and cluster is recorded again, not refused as another cluster's run."""
    with open_history(str(tmp_path / "h.sqlite")) as history:
        history.record_measured([_row("run/a@1", "Lab-H100")])
        written = history.record_measured([_row("run/a@1", "lab-h100 ", 1.3)])
        assert written.refused == () and written.replaced == ("run/a@1",)
        [row] = history.measured("lab-h100")
        assert row.cluster == "Lab-H100"
        refused = history.record_measured([_row("run/a@1", "lab-h200")])
        assert [row.id for row, _ in refused.refused] == ["run/a@1"]  # another cluster's run: refused, as before
