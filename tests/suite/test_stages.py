from megapilot.suite import lifecycle
from megapilot.suite.stages import COMBO_STAGES, EARLY_STAGES, NON_BLOCKING_STAGES, STAGES


def test_stages_run_early_then_per_combo_then_results_and_teardown_in_cvs_order():
    assert STAGES == EARLY_STAGES + COMBO_STAGES + ("results", "teardown")
    assert set(NON_BLOCKING_STAGES) <= set(EARLY_STAGES)


def test_the_lifecycle_runs_the_stages_named_here():
    assert lifecycle.STAGES is STAGES and lifecycle.COMBO_STAGES is COMBO_STAGES
