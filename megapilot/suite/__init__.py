"""The validation suite: CVS Megatron configs accepted as-is, the lifecycle, sweeps, gates, baselines.

Modules:
    results     typed results (SuiteResult, ComboResult, StageResult, MetricRow, Verdict): what the
                report, run deck, JUnit and history read
    thresholds  CVS's cell-keyed threshold specs and the gate of each kind
    config      the CVS Megatron config schema (+ megapilot's own block) and the CVS cluster file
    gates       metrics from every node's log, and their verdicts
    lifecycle   the stages in CVS's pinned order, run through an executor
"""
