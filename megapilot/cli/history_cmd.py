"""`megapilot history list|show|compare|calibration|import|record|salvage`: the runs `megapilot suite run` records.

`history import FILE...` adds measured runs from outside (JSON list or JSON Lines of `estimate --batch` cases with
`"measured"`, `"cluster"`, optional `"software"`; megapilot's and CVS's run decks) to a cluster's history: the
calibration `estimate --cluster`, `plan --cluster` and `suite run` use. `history calibration` adds, per cluster,
the corrections fitted on its runs and the held-out error with and without them.

`history record RUN_DIR` writes a suite run's row that could not reach the history when it ended (queued in
`RUN_DIR/history-pending.json`). `history salvage PATH` copies what a damaged SQLite history still holds into
PATH.recovered (megapilot.store.salvage).

The database is `--db` (a SQLite path or a postgresql:// URL), else $MEGAPILOT_HISTORY, else the SQLite
file in the user data dir. The commands that only read (list, show, compare, calibration) open it read-only and
refuse a --db that does not exist; the default file not made yet reads as an empty history. A RUN is a run id, a
unique prefix of one, or `latest`. Every command has `--json`: list prints an array of RunRow, show a RunDetail,
compare a RunComparison (megapilot.store.history), record `{"run": RunRow, "location"}` (the run as the history now
holds it, and the database, its password removed); calibration prints what its tables show,
`{"predicted_vs_measured": [CalibrationRow...], "clusters": [{"cluster", "groups": [...]}...]}`, and with
`--cluster` that one cluster's `{"cluster", "groups"}`; each group's `set_aside` names its runs the fit left out
(a measured step more than 20x from its layout's prediction: kept in the history, fitted on by nothing) and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from megapilot.cli.common import console, emit_json

if TYPE_CHECKING:
    from rich.table import Table

    from megapilot.estimate.history_calibration import GroupFit
    from megapilot.store.history import CalibrationRow, ComboRow, History, RunComparison, RunDetail, RunRow

history_app = typer.Typer(help="Past suite runs: list, show, compare, and how far predictions were off.",
                          no_args_is_help=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
DbOpt = Annotated[str | None, typer.Option(
    "--db", help="History database: a SQLite file or postgresql:// URL (default: $MEGAPILOT_HISTORY, else "
                 "history.sqlite in the user data dir).")]
RunArg = Annotated[str, typer.Argument(help="Run id, a unique prefix of one, or `latest`.", show_default=False)]

VERDICT_STYLES = {"PASS": "green", "WARN": "dark_orange", "FAIL": "red", "RECORD": "dim", "SKIPPED": "yellow",
                  "INTERRUPTED": "bold yellow"}
CHANGE_STYLES = {"better": "green", "worse": "red", "within band": "dim", "unchanged": "dim", "unknown": "dim"}


def register(app: typer.Typer) -> None:
    """Add `megapilot history` and its commands to the app."""
    app.add_typer(history_app, name="history")


def _open(db: str | None, *, read_only: bool = False) -> History:
    """The history; read_only for the commands that only read it: opened read-only, and a --db that does not
    exist is refused instead of made."""
    from megapilot.store.history import open_history

    return open_history(db, read_only=read_only)


@history_app.command("record")
def record_run(
    run_dir: Annotated[str, typer.Argument(help="Run directory of a suite run (holds suite.json).",
                                           show_default=False)],
    db: DbOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Record (or re-record) a suite run in the history, e.g. one whose row could not be written when it ran."""
    from pathlib import Path

    from megapilot.store.history import PENDING_NAME
    from megapilot.suite.results import read_suite_result

    directory = Path(run_dir)
    if directory.name == "suite.json" and directory.is_file():  # the run's suite.json named instead of its directory
        directory = directory.parent
    result = read_suite_result(directory)
    with _open(db) as history:
        history.record(result)
        location = history.location
        row = history.run(result.run_id).run
    (directory / PENDING_NAME).unlink(missing_ok=True)
    if as_json:
        emit_json({"run": row, "location": location})
        return
    console.print(f"recorded run {result.run_id} in {location}", highlight=False, markup=False)


@history_app.command("list")
def list_runs(
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many runs, newest first.")] = 20,
    model: Annotated[str | None, typer.Option("--model", help="Only runs of this model (exact name).")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Only runs on this GPU (any case).")] = None,
    db: DbOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """List recorded runs, newest first."""
    from megapilot.cli.common import require_positive

    require_positive("--limit", limit)
    with _open(db, read_only=True) as history:
        rows = history.runs(limit=limit, model=model, gpu=gpu)
        location = history.location
        clusters = [] if rows else history.clusters()
    if as_json:
        emit_json(rows)
        return
    if not rows:
        # imported measured runs calibrate estimates but are not runs of this list: say where they are
        measured = (f"; measured runs of cluster(s) {', '.join(clusters)} are listed by `megapilot history "
                    "calibration`" if clusters else "")
        console.print(f"no runs in {location}" + (" matching the filters" if model or gpu else "") + measured,
                      markup=False, highlight=False, soft_wrap=True)
        return
    console.print(_runs_table(rows, location))


@history_app.command("show")
def show_run(run: RunArg, db: DbOpt = None, as_json: JsonFlag = False) -> None:
    """One run: its card, and every combo's verdict, metrics and prediction."""
    with _open(db, read_only=True) as history:
        detail = history.run(run)
    if as_json:
        emit_json(detail)
        return
    _print_detail(detail)


@history_app.command("compare")
def compare_runs(run_a: RunArg, run_b: RunArg, db: DbOpt = None, as_json: JsonFlag = False) -> None:
    """Every metric of the combos both runs have: B against A, better or worse by the metric's direction."""
    with _open(db, read_only=True) as history:
        comparison = history.compare(run_a, run_b)
    if as_json:
        emit_json(comparison)
        return
    _print_comparison(comparison)


@history_app.command("calibration")
def calibration(db: DbOpt = None, as_json: JsonFlag = False,
                cluster: Annotated[str | None, typer.Option(
                    "--cluster", help="Show the corrections fitted on this cluster's runs (--json: that object).")
                ] = None) -> None:
    """How far predicted step time and tokens/s were from measured, by GPU and model family; per cluster, the
    corrections fitted on its runs and how much each improves the held-out error."""
    from megapilot.estimate.history_calibration import cluster_fits

    with _open(db, read_only=True) as history:
        rows = history.calibration()
        location = history.location
        if cluster:
            history.require_cluster(cluster)
        clusters = [cluster] if cluster else history.clusters()
        fits = {name: cluster_fits(history.calibration_runs(name)) for name in clusters}
    if as_json and cluster:
        emit_json(_cluster_json(cluster, fits[cluster]))
        return
    if cluster and not fits[cluster]:
        console.print(f"cluster {cluster} has no run that calibrates yet (measured and predicted, and not failed)",
                      markup=False, highlight=False)
        return
    if cluster:
        console.print(_cluster_table(cluster, fits[cluster]))
        _print_set_aside(fits[cluster])
        return
    if as_json:  # what the tables show: the suite combos' errors, then each cluster that has a fit
        emit_json({"predicted_vs_measured": rows,
                   "clusters": [_cluster_json(name, groups) for name, groups in fits.items() if groups]})
        return
    if not rows and not any(fits.values()):
        console.print(f"no combo in {location} has both a prediction and a measurement yet")
        return
    if rows:
        console.print(_calibration_table(rows))
    for name, groups in fits.items():
        if groups:
            console.print(_cluster_table(name, groups))
            _print_set_aside(groups)


def _print_set_aside(groups: list[GroupFit]) -> None:
    """The runs a cluster's fits left out (kept in the history), each with why: under the table that counts them out."""
    for group in groups:
        for aside in group.set_aside:
            console.print(f"set aside {aside.run_id} ({group.gpu} / {group.precision} / {group.family}): {aside.why}",
                          markup=False, highlight=False, soft_wrap=True)


@history_app.command("import")
def import_runs(
    files: Annotated[list[Path], typer.Argument(help="JSON list, JSON Lines, or run deck files.", show_default=False)],
    cluster: Annotated[str | None, typer.Option("--cluster", help="Cluster of records that name none.")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="Sequence length of records that give none "
                                                                   "(CVS run decks).")] = None,
    db: DbOpt = None, as_json: JsonFlag = False,
) -> None:
    """Add measured runs from outside to a cluster's history; a bad record is refused alone, with one line."""
    from megapilot.cli.common import err_console, require_positive
    from megapilot.store.importer import Refused, import_files

    require_positive("--seq-len", seq_len)  # the flag's own error, not one per record under the record's key
    outcome = import_files(list(files), cluster=cluster, defaults={"seq_len": seq_len})
    if not outcome.kept and outcome.refused:  # nothing to write: no history is created or opened for it
        for refused in outcome.refused:
            err_console.print(f"refused {refused.line()}", markup=False, highlight=False)
        if as_json:
            emit_json({"imported": [], "already_recorded": [],
                       "refused": [{"record": r.record, "field": r.field, "problem": r.problem}
                                   for r in outcome.refused]})
        else:
            console.print(f"imported nothing ({len(outcome.refused)} refused)", markup=False, highlight=False)
        raise typer.Exit(2)
    with _open(db) as history:
        written = history.record_measured(outcome.kept)
        location = history.location
    record_of = {row.id: name for name, row in zip(outcome.names, outcome.kept, strict=True)}
    refusals = [*outcome.refused, *(Refused(record_of[row.id], "id", f"{problem} (give the record its own id)")
                                    for row, problem in written.refused)]
    for refused in refusals:
        err_console.print(f"refused {refused.line()}", markup=False, highlight=False)
    if as_json:
        emit_json({"imported": [{"id": r.id, "cluster": r.cluster, "model": r.model, "gpu": r.gpu,
                                 "predicted_step_time_s": r.predicted_step_time_s,
                                 "measured_step_time_s": r.measured_step_time_s,
                                 "replaced": r.id in written.replaced} for r in written.kept],
                   "refused": [{"record": r.record, "field": r.field, "problem": r.problem} for r in refusals],
                   "already_recorded": list(written.already)})
    else:
        by_cluster: dict[str, int] = {}
        for row in written.kept:
            by_cluster[row.cluster] = by_cluster.get(row.cluster, 0) + 1
        counts = ", ".join(f"{n} into {name}" for name, n in sorted(by_cluster.items())) or "nothing"
        replaced = f"{len(written.replaced)} recorded before: replaced; " if written.replaced else ""
        already = (f"{len(written.already)} already recorded by the suite run itself: left as they are; "
                   if written.already else "")
        console.print(f"imported {counts} ({replaced}{already}{len(refusals)} refused) in {location}", markup=False,
                      highlight=False)
    if refusals and not written.kept:
        raise typer.Exit(2)


@history_app.command("salvage")
def salvage(
    path: Annotated[Path, typer.Argument(help="The damaged SQLite history (the file the error named).",
                                         show_default=False)],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Where the salvaged history goes "
                                                                       "(default: PATH.recovered).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Copy the rows still readable from a damaged SQLite history into a new file (the damaged one is only read)."""
    from megapilot.store.salvage import salvage_history

    done = salvage_history(path, output)
    if as_json:
        emit_json({"source": str(done.source), "target": str(done.target), "copied": done.copied,
                   "lost": done.lost, "rebuilt_versions": done.rebuilt_versions,
                   "tables": [{"table": t.table, "copied": t.copied, "unreadable": t.unreadable,
                               "orphans": t.orphans} for t in done.tables]})
        return
    from rich.table import Table

    table = Table(title=f"salvaged {done.source} -> {done.target}")
    for column in ("table", "rows copied", "unreadable", "dropped with their lost run"):
        table.add_column(column, justify="left" if column == "table" else "right")
    for t in done.tables:
        unreadable = "all (its pages cannot be reached)" if t.unreadable is None else f"{t.unreadable:,}"
        table.add_row(t.table, f"{t.copied:,}", unreadable, f"{t.orphans:,}")
    console.print(table)
    if done.rebuilt_versions:
        console.print("the schema version rows were lost: rebuilt from the tables the schema holds", markup=False,
                      highlight=False)
    console.print(f"use it with --db {done.target} (or move {done.source} aside and this file into its place)",
                  markup=False, highlight=False, soft_wrap=True)


def _cluster_json(cluster: str, groups: list[GroupFit]) -> dict[str, object]:
    return {"cluster": cluster, "groups": [_fit_json(group) for group in groups]}


def _fit_json(group: GroupFit) -> dict[str, object]:
    held = group.held_out
    return {"gpu": group.gpu, "precision": group.precision, "family": group.family, "runs": group.runs,
            "corrections": {"compute": group.corrections.compute, "scaleup_comm": group.corrections.scaleup_comm,
                            "scaleout_comm": group.corrections.scaleout_comm,
                            "overhead_s": group.corrections.overhead_s,
                            "microbatch_overhead_s": group.corrections.microbatch_overhead_s},
            "held_out_median_pct": _pct100(held.median), "held_out_p90_pct": _pct100(held.p90),
            "uncalibrated_median_pct": _pct100(held.uncalibrated_median),
            "uncalibrated_p90_pct": _pct100(held.uncalibrated_p90),
            "held_out_median_pct_by_correction": {k: _pct100(v) for k, v in group.median_by_correction.items()},
            "set_aside": [{"id": aside.run_id, "why": aside.why} for aside in group.set_aside]}


def _pct100(value: float) -> float | None:
    return None if value != value else round(100 * value, 2)  # NaN (no held-out run): null


# ---- rendering ------------------------------------------------------------------------------------

# Tables are sized for an 80-column terminal: little chrome, identifiers and numbers never wrapped.

# How a compared field is named where two runs differ in it.
FIELD_LABELS = {"gpu": "GPU", "gpus_per_node": "GPUs per node", "gbs": "global batch", "seq_length": "sequence length"}
QUANTITY_LABELS = {"step_time_ms": "step time", "tokens_per_s_per_gpu": "tokens/s/GPU"}


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} %"


def _verdict(verdict: str) -> str:
    return f"[{VERDICT_STYLES.get(verdict, 'white')}]{verdict}[/]"


def _table(title: str, columns: tuple[str, ...], *, wrap: tuple[str, ...] = ()) -> Table:
    """A table with a rule under the header only; columns not named in `wrap` keep their text on one line."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for column in columns:
        wraps = column in wrap
        table.add_column(column, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    return table


def _runs_table(rows: list[RunRow], location: str) -> Table:
    from rich.markup import escape

    table = _table(f"runs in {location}", ("run", "started (UTC)", "verdict", "model", "GPUs", "failed", "duration"),
                   wrap=("model",))
    for row in rows:
        table.add_row(escape(row.run_id), row.started_at.strftime("%Y-%m-%d %H:%M"), _verdict(row.verdict),
                      escape(row.model), f"{row.nodes}x{row.gpus_per_node} {escape(row.gpu)}",
                      f"{row.failed_combos}/{row.combos}",
                      f"{row.duration_s:,.0f} s" + ("" if row.finished else " (unfinished)"))
    return table


def _print_detail(detail: RunDetail) -> None:
    from rich.markup import escape

    run = detail.run
    console.print(f"[bold]{escape(run.run_id)}[/]  {_verdict(run.verdict)}  {escape(run.suite_name)}"
                  + ("" if run.finished else "  [yellow]unfinished[/]"))
    console.print(f"{escape(run.model)} on {run.nodes}x{run.gpus_per_node} {escape(run.gpu)}, {escape(run.backend)} "
                  f"via {escape(run.executor)}; started {run.started_at:%Y-%m-%d %H:%M:%S} UTC, "
                  f"{run.duration_s:,.0f} s")
    console.print(f"run dir {escape(run.run_dir)}; megapilot {escape(run.megapilot_version or '?')}"
                  + (f" ({escape(run.git_commit)})" if run.git_commit else ""))
    if run.reason:
        console.print(f"reason: {escape(run.reason)}")
    for combo in detail.combos:
        _print_combo(combo)


def _print_combo(combo: ComboRow) -> None:
    from rich.markup import escape

    from megapilot.store.regress import metric_info

    console.print()
    console.print(f"[bold]{escape(combo.key)}[/]  {_verdict(combo.verdict)}  {escape(combo.layout)}"
                  + (f"  {escape(combo.reason)}" if combo.reason else ""))
    if not combo.metrics:
        return
    predicted = _predicted_by_metric(combo)
    table = _table("", ("metric", "value", "unit", "gate", "predicted"), wrap=("gate",))
    for metric in combo.metrics:
        table.add_row(escape(metric_info(metric.name).label), _fmt(metric.value), escape(metric.unit),
                      escape(metric.threshold or ""), _fmt(predicted.get(metric.name)))
    console.print(table)


def _predicted_by_metric(combo: ComboRow) -> dict[str, float | None]:
    """The prediction of each metric that measures a predicted quantity (step time, tokens/s, ...)."""
    from megapilot.store.regress import METRICS

    if combo.prediction is None:
        return {}
    return {metric.name: getattr(combo.prediction, f"predicted_{METRICS[metric.name].quantity}")
            for metric in combo.metrics if metric.name in METRICS and METRICS[metric.name].quantity}


def _print_comparison(comparison: RunComparison) -> None:
    from rich.markup import escape

    a, b = comparison.run_a, comparison.run_b
    # each run's one verdict beside its id: "better" figures of a run that FAILED (or stopped) are not a better run
    console.print(f"B = {escape(b.run_id)} {_verdict(b.verdict)} against A = {escape(a.run_id)} {_verdict(a.verdict)}",
                  soft_wrap=True)
    for combo in (None, *dict.fromkeys(d.combo for d in comparison.differences if d.combo is not None)):
        named = [d for d in comparison.differences if d.combo == combo]
        if named:
            where = "the runs" if combo is None else escape(combo)
            console.print(f"[yellow]{where} differ:[/] " + "; ".join(
                f"{FIELD_LABELS.get(d.field, d.field)} {escape(d.value_a)} (A) vs {escape(d.value_b)} (B)"
                for d in named), soft_wrap=True)
    if not comparison.deltas:
        console.print("no combo in both runs has a metric to compare")
    else:
        console.print(_delta_table(comparison))
    for label, keys in (("only in A", comparison.combos_only_in_a), ("only in B", comparison.combos_only_in_b)):
        if keys:
            console.print(f"{label}: {escape(', '.join(keys))}")


def _delta_table(comparison: RunComparison) -> Table:
    from rich.markup import escape

    table = _table("", ("combo", "metric", "A", "B", "change", "verdict"), wrap=("metric",))
    previous = None
    for delta in comparison.deltas:
        combo = "" if delta.combo == previous else escape(delta.combo)  # each key once, over its rows
        previous = delta.combo
        style = CHANGE_STYLES[delta.change]
        table.add_row(combo, escape(delta.label), _fmt(delta.value_a), _fmt(delta.value_b), _pct(delta.delta_pct),
                      f"[{style}]{delta.change}[/]")
    return table


def _calibration_table(rows: list[CalibrationRow]) -> Table:
    from rich.markup import escape

    table = _table("predicted vs measured: error = (predicted - measured) / measured",
                   ("GPU", "model family", "quantity", "combos", "median |error|", "mean error"))
    for row in rows:
        table.add_row(escape(row.gpu), escape(row.model_family), QUANTITY_LABELS[row.quantity], str(row.count),
                      f"{row.median_abs_error_pct:.1f} %", _pct(row.mean_signed_error_pct))
    return table


def _cluster_table(cluster: str, groups: list[GroupFit]) -> Table:
    from rich.markup import escape

    table = _table(f"cluster {cluster}: corrections fitted on its runs; held-out median |error| (leave-one-out)",
                   ("GPU/prec/family", "runs", "compute", "comm up/out", "overhead (step + mb)", "uncal.",
                    "calib.", "best alone"))
    for g in groups:
        c = g.corrections
        known = {name: value for name, value in g.median_by_correction.items() if value == value}
        best = min(known, key=known.__getitem__) if known else None
        alone = f"{best} {100 * known[best]:.1f} %" if best else ""
        table.add_row(escape(f"{g.gpu} / {g.precision} / {g.family}"), str(g.runs), f"x{c.compute:.2f}",
                      f"x{c.scaleup_comm:.2f}/x{c.scaleout_comm:.2f}",
                      f"{1000 * c.overhead_s:.1f} + {1000 * c.microbatch_overhead_s:.1f}/mb ms",
                      _held(g.held_out.uncalibrated_median), _held(g.held_out.median), alone or "-")
    return table


def _held(value: float) -> str:
    return "-" if value != value else f"{100 * value:.1f} %"
