"""How a suite run is told, finished or interrupted: the `--json` document and the terminal table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict
from rich.markup import escape
from rich.table import Table

from megapilot.suite.outcome import RunStatus, run_outcome
from megapilot.suite.results import MetricRow, SuiteResult, Verdict

if TYPE_CHECKING:
    from rich.console import Console

OUTCOME_STYLE = {RunStatus.PASS: "bold green", RunStatus.WARN: "bold dark_orange", RunStatus.FAIL: "bold red",
                 RunStatus.RECORD: "dim", RunStatus.SKIPPED: "yellow", RunStatus.INTERRUPTED: "bold yellow"}
VERDICT_STYLE = {Verdict.PASS: "green", Verdict.FAIL: "bold red", Verdict.RECORD: "dim", Verdict.SKIPPED: "yellow",
                 Verdict.INTERRUPTED: "bold yellow"}


class RowJson(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    value: float | None
    unit: str
    threshold: str | None
    verdict: str
    reason: str


def _rows(rows: list[MetricRow]) -> list[dict[str, object]]:
    return [RowJson(name=r.name, value=r.value, unit=r.unit, threshold=r.threshold, verdict=r.verdict.value,
                    reason=r.reason).model_dump() for r in rows]


def result_json(result: SuiteResult) -> dict[str, object]:
    """The stable `megapilot suite run --json` schema: verdict first, then stages, combos, run directory."""
    outcome = run_outcome(result)
    return {
        "verdict": outcome.status.value,
        "reason": outcome.summary,
        "finished": result.finished,
        "exit_code": outcome.exit_code,
        # what the gates said of what ran; an interrupted run's verdict is INTERRUPTED, its finished rows' this
        "gates_verdict": (result.verdict if result.finished else result.finished_verdict()).value,
        "run_id": result.run_id,
        "run_dir": result.run_dir,
        "stages": [{"name": s.name, "combo": s.combo, "verdict": s.verdict.value, "reason": s.reason,
                    "duration_s": s.duration_s, "rows": _rows(s.checks)} for s in result.stages],
        "combos": [{"key": c.key, "verdict": c.verdict.value, "reason": c.reason, "backend": c.backend,
                    "directory": c.directory, "metrics": _rows(c.metrics),
                    "predicted": c.predicted.model_dump() if c.predicted else None,
                    "job": c.job.model_dump() if c.job else None,
                    "findings": [f.to_dict() for f in c.findings]} for c in result.combos],
        "regressions": [r.model_dump() for r in result.regressions],
        "not_started": result.not_started(),
    }


def print_summary(result: SuiteResult, console: Console) -> None:
    """Stages and combos with their verdicts, then each FAIL row with its reason, on the CLI's console."""
    name = result.card.suite_name
    title = f"{name} — {result.run_id}" if "suite" in name.lower() else f"suite {name} — {result.run_id}"
    table = Table(title=title, show_lines=False)
    for column in ("stage", "combo", "verdict", "time (s)", "reason"):
        table.add_column(column, overflow="fold")
    for stage in result.stages:
        style = VERDICT_STYLE[stage.verdict]
        table.add_row(stage.name, escape(stage.combo or ""), f"[{style}]{stage.verdict.value}[/]",
                      f"{stage.duration_s:.1f}", escape(_clipped(stage.reason)))
    console.print(table)
    for combo in result.combos:
        failed = [r for r in combo.metrics if r.verdict is Verdict.FAIL]
        for row in failed:
            console.print(f"[bold red]FAIL[/] {escape(combo.key)} {escape(row.name)} = {escape(_reading(row))}"
                          + (f" (gate {escape(row.threshold)})" if row.threshold else "")
                          + f": {escape(row.reason)}", highlight=False, soft_wrap=True)
    for regression in result.regressions:
        marker = "[bold red]regression[/]" if regression.worse else "[green]improvement[/]"
        console.print(f"{marker} {escape(regression.combo)}: {escape(regression.message)}", highlight=False)
    outcome = run_outcome(result)
    style = OUTCOME_STYLE[outcome.status]
    console.print(f"\n[{style}]{outcome.status.value}[/] — {escape(outcome.summary)}"
                  f"\nrun directory: {escape(result.run_dir)}", highlight=False, soft_wrap=True)


# The stage table's reason column holds this much of a reason (a failed stage's may quote pages of output); the
# whole reason is in suite.json and the report.
REASON_CHARS = 200


def _clipped(text: str) -> str:
    """The reason, or its first REASON_CHARS characters ending in an ellipsis: a reason cut short says so."""
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1].rstrip() + "\u2026"


def _reading(row: MetricRow) -> str:
    """The value as the gate's reason prints it (`179.729 ms`, not 179.72857142857146), or that there was none."""
    if row.value is None:
        return "not measured"
    return f"{row.value:g} {row.unit}".rstrip()


__all__ = ["print_summary", "result_json"]
