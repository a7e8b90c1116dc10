"""`megapilot estimate`: memory, step time, throughput and MFU of one layout (or a batch of them).

`--json` prints the `EstimateResult` schema: params {total, active, embedding}, flops_per_step,
memory_gib {weights, gradients, optimizer, activations, overhead, total, capacity, stage}, fits,
step_time_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu, time_breakdown_s {compute, recompute,
tp_comm, cp_comm, ep_comm, pp_comm, pp_bubble, cpu_offload, dp_comm, optimizer}, warnings, bubble_fraction,
exposed_comm_fraction, flop_convention (`--flop-convention megatron_full_attention` counts the
attention core over the full s x s matrix, as Megatron-Core <= 0.11 and older NeMo did), calibration (the
published runs behind the estimate: its calibrated family/GPU/precision or the nearest, with the median |error|
there, or a caveat when none checks it), and beside the figures `defaults` (what was assumed for the flags left out,
the pipeline split computed where none was given: the `assumed:` line) and `notes` (the dispatcher priced where the
expert group leaves the NVLink domain, what CUDA graphs were priced as), as the table says them.

`--batch cases.jsonl`: one JSON object per line whose keys are the long flag names, spelled either way
(`seq-len` or `seq_len`; `{"model": "llama3.1-70b", "gpu": "h100", "gpus": 64, "tp": 4, "gbs": 1024,
"seq-len": 4096}`), with an optional `id` the answer carries back. Prints a list in line order: each
row is `{"line", "id"?}` plus the estimate above, or `{"line", "id"?, "error", "field", "fix"}` for a
bad line; exits 1 when any line failed (the list still holds every line).

`--cluster NAME` (batch key `cluster`) calibrates the estimate on that cluster's measured runs in the history
(`megapilot history import`, every `suite run`): the figures above become the calibrated ones, `calibration` states
the cluster's calibration, and `calibration_from_history` keeps the uncalibrated figures with the published runs'
calibration of them, the corrections, the runs used (with their weights), the error band (p90 of the held-out
|error|) and, when the calibration made held-out runs worse, why it was not applied.
`--calibration none` turns it off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from megapilot.case_flags import SPLIT_FIELDS
from megapilot.cli.budget_options import NO_BUDGET, BudgetFlags, budget_json, budget_options, print_budget
from megapilot.cli.common import cluster_label, console, emit_json, print_assumptions
from megapilot.cli.layer_table import LAYERS_HELP, print_layers
from megapilot.cli.layout_options import NO_FEATURES, FeatureFlags, LayoutFlags, feature_options, layout_options
from megapilot.errors import MegapilotError

if TYPE_CHECKING:
    from megapilot.estimate import Case, CaseFlags
    from megapilot.estimate.layer_report import LayerGroup
    from megapilot.spec import EstimateResult

EXIT_SOME_ROWS_FAILED = 1
REQUIRED = "Required (unless --batch)."


def register(app: typer.Typer) -> None:
    """Add `estimate` to the app."""
    app.command("estimate")(estimate)


# The same --db as `history`, `run` and `suite run`: a history imported with --db calibrates from that one.
HISTORY_DB_HELP = ("With --cluster: the history database, a SQLite path or postgresql:// URL (default: the user data "
                   "dir, or $MEGAPILOT_HISTORY).")


@budget_options()
@feature_options()
@layout_options(required_note=REQUIRED)
def estimate(
    layout: LayoutFlags,
    features: FeatureFlags = NO_FEATURES,
    budget: BudgetFlags = NO_BUDGET,  # --tokens 15.6T: the whole run (megapilot.estimate.budget)
    force_tp_across_nodes: Annotated[
        bool, typer.Option("--force-tp-across-nodes", help="Cost a TP group larger than a node instead of refusing.")
    ] = False,
    flop_convention: Annotated[
        str, typer.Option(help="megatron (causal, current) | megatron_full_attention (core <= 0.11, NeMo < 2025-08).")
    ] = "megatron",
    batch: Annotated[Path | None, typer.Option(
        help="JSONL file, one case per line: keys are the flag names (seq-len or seq_len), plus an optional id. "
             "Exit 1 when any line failed.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    cluster: Annotated[str | None, typer.Option(
        "--cluster", help="Calibrate on this cluster's measured runs in the history (batch key: cluster).")] = None,
    calibration: Annotated[str, typer.Option(
        "--calibration", help="history (with --cluster) or none: the uncalibrated model.")] = "history",
    db: Annotated[str | None, typer.Option("--db", help=HISTORY_DB_HELP)] = None,
    layers: Annotated[bool, typer.Option("--layers", help=LAYERS_HELP)] = False,
) -> None:
    """Estimate memory, step time, tokens/s and MFU of one parallel layout (or of each line of --batch)."""
    if calibration not in ("history", "none"):
        raise MegapilotError(f"unknown calibration {calibration!r}", field="--calibration", fix="use history or none")
    calibrator = ClusterCalibrator(enabled=calibration == "history", db=db)
    if batch is not None:
        if budget.given:
            raise MegapilotError("the budget options price one layout, not a --batch", field="tokens",
                                 fix="drop --tokens and the budget options, or --batch")
        if layers:
            raise MegapilotError("--layers breaks down one layout, not a --batch", field="--layers",
                                 fix="drop --layers, or --batch")
        if stray := layout.given() + features.given() + (["--force-tp-across-nodes"] if force_tp_across_nodes else []):
            # each line is a whole case: a flag beside --batch would be ignored unsaid
            raise MegapilotError(f"{', '.join(stray)} would be ignored: each --batch line gives its own case",
                                 field="--batch", fix="put them into the lines (as keys), or drop --batch")
        rows = run_batch(batch, flop_convention, calibrator=calibrator, cluster=cluster)
        emit_json([row.to_json() for row in rows]) if json_output else _print_batch(rows)
        if any(row.error is not None for row in rows):
            raise typer.Exit(EXIT_SOME_ROWS_FAILED)
        return
    if layers and calibration == "history" and cluster is not None:
        raise MegapilotError("--layers shows the physics model's terms, which a cluster's calibration rescales as a "
                             "whole", field="--layers", fix="drop --cluster, or --layers")
    from megapilot.estimate import CaseFlags, estimate_case

    flags = CaseFlags.parse(layout.case_flags() | features.case_flags()
                            | {"force_tp_across_nodes": force_tp_across_nodes})
    case, result = estimate_case(flags, flop_convention)
    uncalibrated = result
    result, about = calibrator.apply(case, result, cluster)
    request = budget.request(gpu=case.cluster.gpu)
    run = None
    if request is not None:
        from megapilot.plan.budget import ClusterCorrection, run_budget

        correction = None
        if about and about.get("applied") and about.get("band_pct") is not None:  # the cluster's runs decide
            correction = ClusterCorrection(result.step_time_s / uncalibrated.step_time_s, about["band_pct"] / 100,
                                           f"calibrated on cluster {cluster}: {about['reason']}")
        run = run_budget(request, case.model, case.cluster, case.training, case.parallel, case.options,
                         correction)
    from megapilot.catalog import resolve_model

    resolved = resolve_model(flags.model)  # what --model became and where from (an alias, a hub id offline)
    groups = _layer_groups(case) if layers else ()
    # the graphs' gain is the model's own: against the eager run the model prices, before a cluster's calibration
    notes = [note for note in (dispatcher_note(flags, case), cuda_graphs_note(case, uncalibrated)) if note is not None]
    if json_output:  # what the table's reader is told beside the figures, a tool is too (as `plan --json` does)
        emit_json({**result.model_dump(mode="json"), "model": resolved.to_dict()}
                  | ({"calibration_from_history": about} if about else {}) | budget_json(run)
                  | ({"layers": [group.to_json() for group in groups]} if layers else {})
                  | {"defaults": defaults_assumed(flags, case), "notes": notes})
    else:
        _print_result(result, case, cluster_calibration_note(about) if about else None)
        for note in notes:
            console.print(note, markup=False, highlight=False, soft_wrap=True)
        if layers:
            print_layers(groups)
        console.print(f"model: {resolved.describe()}", highlight=False)
        if run is not None:
            print_budget(run)
        print_assumptions(defaults_assumed(flags, case))


class ClusterCalibrator:
    """Applies a cluster's calibration from the history (opened once, each cluster's runs read once)."""

    def __init__(self, *, enabled: bool = True, db: str | None = None):
        self.enabled = enabled
        self.db = db  # the history --cluster reads (None: $MEGAPILOT_HISTORY, else the user data dir)
        self._runs: dict[str, tuple[Any, ...]] = {}

    def runs(self, cluster: str) -> tuple[Any, ...]:
        if cluster not in self._runs:
            from megapilot.store.history import open_history

            with open_history(self.db, read_only=True) as history:
                history.require_cluster(cluster, field="cluster")  # under any spelling of its name
                self._runs[cluster] = history.calibration_runs(cluster)
        return self._runs[cluster]

    def apply(self, case: Case, result: EstimateResult, cluster: str | None
              ) -> tuple[EstimateResult, dict[str, Any] | None]:
        if cluster is None or not self.enabled:
            return result, None
        from megapilot.estimate.history_calibration import calibrate_estimate

        return calibrate_estimate(case, result, self.runs(cluster), cluster)


def cluster_calibration_note(about: dict[str, Any]) -> str:
    """The line beside figures that `calibrate_estimate` treated, saying what the figures do not use: applied, the
    uncalibrated model's figures and the published runs' calibration behind them (the cluster's calibration is the
    result's own `calibration` line); not applied, the cluster's calibration and why, the published runs' being
    the one in force."""
    if not about["applied"]:
        return (f"not used: cluster {about['cluster']}'s calibration: {about['reason']}; the figures are the "
                "uncalibrated model's")
    uncalibrated = about["uncalibrated"]
    published = uncalibrated.get("calibration")
    behind = f", and the published runs' calibration of it: {published.removeprefix('calibration: ')}" \
        if published else ""
    return (f"not used: the uncalibrated model's {uncalibrated['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, step "
            f"{uncalibrated['step_time_s']:.3f} s{behind}")


def _assumed_size(name: str, value: int | None, tp: int) -> str:
    """One layout size the estimate took. ETP left unset follows TP (Megatron's default), so it is said that way,
    not as "None"; a MoE layout's with EP > 1 is Megatron-Bridge's 1 (`cases.MOE_DEFAULT_ETP`), said with why where
    Megatron-LM's would differ."""
    if name != "etp":
        return f"{name.upper()}={value}"
    if value is None:
        return "ETP=TP"
    return f"ETP={value}" + (" (Megatron-Bridge's with EP > 1, as every published MoE recipe ran; Megatron-LM's own "
                             "would be TP)" if tp > 1 else "")


def defaults_assumed(flags: CaseFlags, case: Case) -> list[str]:
    """What the estimate took for the flags left out, read back from the resolved case (so it cannot drift
    from `case_from`'s defaults)."""
    from megapilot.spec.validate import FP32_GRADIENTS_ASSUMED, bf16_gradients_would_change, overlaps_assumed

    p, given = case.parallel, flags.given()
    dims: list[tuple[str, int | None]] = [("tp", p.tp), ("pp", p.pp), ("vpp", p.vpp), ("cp", p.cp), ("mbs", p.mbs)]
    if case.model.moe is not None:
        dims += [("ep", p.ep), ("etp", p.etp)]
    assumed = [_assumed_size(name, value, p.tp) for name, value in dims if name not in given]
    if "gpus_per_node" not in given:
        assumed.append(f"{case.cluster.gpus_per_node} GPUs per node")
    if "precision" not in given:
        assumed.append(case.training.precision)
    if bf16_gradients_would_change(case.training, case.cluster.gpu):
        assumed.append(FP32_GRADIENTS_ASSUMED)
    if "recompute" not in given:
        assumed.append("no recompute" if p.recompute == "none" else f"{p.recompute} recompute")
    if (overlaps := overlaps_assumed(case.cluster.gpu, case.training.precision, p)) is not None:
        assumed.append(overlaps)
    if "sequence_parallel" not in given and p.tp > 1:
        assumed.append("sequence parallel on")
    if case.model.moe is not None and "moe_flex_dispatcher" not in given:
        assumed.append("alltoall MoE dispatcher")
    if "cp_comm_type" not in given and p.cp > 1:
        assumed.append("a2a CP (attention sinks or a sliding window: Transformer Engine runs them under CP only so)"
                       if p.cp_comm_type == "a2a" else f"{p.cp_comm_type} CP ring")
    said = [f"{', '.join(assumed)} (defaults)"] if assumed else []
    if not given & set(SPLIT_FIELDS) and not p.pipeline_split.is_even:
        said.append(f"pipeline layout {p.pipeline_split.label()}: the balanced split, as none was given and the "
                    f"layers do not divide over PP {p.pp} x VPP {p.vpp} (Megatron needs one: pass it, or "
                    "--pp-layout balanced)")
    return said


def dispatcher_note(flags: CaseFlags, case: Case) -> str | None:
    """Where the expert group leaves the NVLink domain and no dispatcher was named, the line saying that this
    estimate prices Megatron's default alltoall dispatcher there while `plan` prices the flex one (where a
    backend runs): each keeps its default (the calibration rests on them), so the line names the flag that
    prices what `plan` assumes, and the all-to-all overlap beside it where Megatron allows it on this layout (the
    25.09 DeepSeek-V3 recipe on 1,024 H100 ran both: as typed it is predicted 36 % slow, with both 22 % fast)."""
    from megapilot.estimate.cases import cross_domain_flex_backend
    from megapilot.estimate.moe_terms import a2a_overlap_runs, ep_leaves_domain

    p, cluster = case.parallel, case.cluster
    if case.model.moe is None or "moe_flex_dispatcher" in flags.given() or not ep_leaves_domain(cluster, p):
        return None
    backend = cross_domain_flex_backend(case.model, cluster)
    if backend is None:  # no flex backend runs here: plan keeps alltoall too
        return None
    overlap = "" if "moe_a2a_overlap" in flags.given() or not a2a_overlap_runs(
        case.model, case.training, case.parallel, case.options) else (
        "; --moe-a2a-overlap hides what is left behind another micro-batch's compute (off in Megatron, as here; the "
        "published recipes that spread experts over nodes run both)")
    return (f"dispatcher: the expert group (EP {p.ep} x ETP {p.expert_tp} = {p.ep * p.expert_tp} GPUs) leaves the "
            f"{cluster.scaleup_domain_gpus}-GPU NVLink domain and is priced with Megatron's default alltoall "
            f"dispatcher; --moe-flex-dispatcher {backend} prices the flex dispatcher `plan` assumes there{overlap}")


def cuda_graphs_note(case: Case, result: EstimateResult) -> str | None:
    """With CUDA graphs, what they were priced as and what they change against the same run eager: the captured
    kernels save the launch gap a graph saves; the graphs' own memory (static inputs and outputs, their pool) is not
    in the memory figure. `result` is the model's own estimate of the case, not a cluster's calibration of it: the
    eager run it is set against is the model's too (a calibrated step against an uncalibrated eager one stated the
    calibration's correction as the graphs' gain)."""
    from dataclasses import replace

    from megapilot.estimate import step_time
    from megapilot.estimate.latency import GRAPH_SAVES_PER_KERNEL_S

    graphs = case.options.cuda_graphs
    if graphs is None:
        return None
    eager = step_time(case.model, case.cluster, case.training, case.parallel, replace(case.options, cuda_graphs=None))
    gain = eager.step_time_s / result.step_time_s - 1
    return (f"CUDA graphs: {graphs.describe()}; each captured kernel saves the {GRAPH_SAVES_PER_KERNEL_S * 1e6:.1f} us "
            f"of launch gap a graph takes off (its ramp and drain stay), {gain:+.1%} tokens/s against the same run "
            "eager; the graphs' static buffers are not in the memory figure")


# ---- --batch -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchRow:
    """The answer to one input line: its line number, the `id` it carried, and a result or an error."""

    line: int
    id: object = None
    result: EstimateResult | None = None
    error: MegapilotError | None = None
    calibration: dict[str, Any] | None = None

    def to_json(self) -> dict[str, object]:
        label: dict[str, object] = {"line": self.line} | ({"id": self.id} if self.id is not None else {})
        if self.error is not None:
            return label | self.error.to_dict()
        assert self.result is not None  # a row holds one of the two
        return label | self.result.model_dump(mode="json") | (
            {"calibration_from_history": self.calibration} if self.calibration else {})


def run_batch(path: Path, flop_convention: str = "megatron", *, calibrator: ClusterCalibrator | None = None,
              cluster: str | None = None) -> list[BatchRow]:
    """Estimate every line of a JSONL file; a bad line yields its error row, not a failed batch."""
    from megapilot.cli.common import read_text_file

    text = read_text_file(path, flag="batch", what="a JSONL file", fix="pass a readable JSONL file")
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise MegapilotError(f"{path} holds no case", field="batch", fix='write one {"model": ...} object per line')
    _refuse_other_files(path, text, lines)
    calibrator = calibrator or ClusterCalibrator(enabled=False)
    return [_one_line(line, number, flop_convention, calibrator, cluster)
            for number, line in enumerate(lines, start=1) if line.strip()]


def _refuse_other_files(path: Path, text: str, lines: list[str]) -> None:
    """A file none of whose lines is a JSON object is no batch with bad lines but another file (a pretty-printed
    JSON such as a saved plan or a config.json, a CSV): one error, not a row of `not valid JSON` per line."""
    def is_object(line: str) -> bool:
        try:
            return isinstance(json.loads(line), dict)
        except json.JSONDecodeError:
            return False

    filled = [line for line in lines if line.strip()]
    if any(is_object(line) for line in filled):
        return
    try:
        whole: object = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    kind = "object" if isinstance(whole, dict) else "list" if isinstance(whole, list) else "value"
    found = (f"one JSON {kind} over {len(filled)} lines" if whole is not None and len(filled) > 1
             else f"none of its {len(filled)} line{'s' if len(filled) > 1 else ''} a JSON object")
    raise MegapilotError(f"{path} is not a JSONL batch: {found}", field="batch",
                         fix='write each case as one {"model": ..., "gpu": ..., ...} object on its own line')


def _one_line(line: str, number: int, flop_convention: str, calibrator: ClusterCalibrator,
              cluster: str | None) -> BatchRow:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        return BatchRow(number, error=MegapilotError(f"not valid JSON ({exc.msg})", field="batch",
                                                     fix="one JSON object per line"))
    if not isinstance(raw, dict):
        return BatchRow(number, error=MegapilotError("must be a JSON object of flags", field="batch",
                                                     fix='write {"model": ...} per line'))
    from megapilot.estimate import CaseFlags, estimate_case

    case_id = raw.pop("id", None)
    line_cluster = raw.pop("cluster", None) or cluster
    try:
        case, result = estimate_case(CaseFlags.parse(_flag_names(raw)), flop_convention)
        result, about = calibrator.apply(case, result, str(line_cluster) if line_cluster else None)
        return BatchRow(number, case_id, result=result, calibration=about)
    except MegapilotError as exc:
        return BatchRow(number, case_id, error=exc)


def _flag_names(raw: dict[str, object]) -> dict[str, Any]:
    """Keys as on the command line (`seq-len`, `--seq-len`) or as Python names (`seq_len`), one spelling each."""
    flags: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).lstrip("-").replace("-", "_")
        if name in flags:
            raise MegapilotError(f"{key!r} is given twice (as {name!r} too)", field=name,
                                 fix="give each flag once, in either spelling")
        flags[name] = value
    return flags


# ---- human output --------------------------------------------------------------------------------


def _interval_text(result: EstimateResult) -> str:
    """' (80 %: 9,100-11,800)' after the tokens/s, or '' when the estimate carries no interval."""
    low, high = result.tokens_per_s_per_gpu_p10, result.tokens_per_s_per_gpu_p90
    return "" if low is None or high is None else f" (80 %: {low:,.0f}-{high:,.0f})"


def _layer_groups(case: Case) -> tuple[LayerGroup, ...]:
    from megapilot.estimate.layer_report import layer_groups

    return layer_groups(case)


def _tflops_text(tflops: float) -> str:
    """Whole TFLOP/s for a GPU; two significant digits below 10 (a CPU's 0.1 would print as 0)."""
    return f"{tflops:,.0f}" if tflops >= 10 else f"{tflops:.2g}"


def _print_result(result: EstimateResult, case: Case, calibration_note: str | None = None) -> None:
    """The figures, then their calibration and (`calibration_note`) the one a cluster's runs offered beside it."""
    from rich.table import Table

    from megapilot.estimate.units import format_count, format_duration

    memory = result.memory_gib
    verdict = "[green]fits[/]" if result.fits else "[bold red]does NOT fit[/]"
    if not result.fits and memory.total <= memory.capacity:  # the GPU holds it: the offloaded part does not fit
        verdict += " [bold red]in host memory[/]:"
    console.print(
        f"[bold]{case.model.name}[/] on {cluster_label(case.cluster)}: {verdict} "
        f"{memory.total:.1f} / {memory.capacity:.0f} GiB · {format_duration(result.step_time_s)}/step · "
        f"{result.tokens_per_s_per_gpu:,.0f} tok/s/GPU{_interval_text(result)} · "
        f"{_tflops_text(result.tflops_per_gpu)} TFLOP/s/GPU · MFU {result.mfu:.1%}"
    )
    table = Table(show_header=True, header_style="bold")
    table.add_column("memory (GiB, most-loaded GPU)")
    table.add_column("", justify="right")
    table.add_column("step time")
    table.add_column("", justify="right")
    parts = ("weights", "gradients", "optimizer", "activations", "overhead")
    mem_rows = [(part, f"{getattr(memory, part):.2f}") for part in parts]
    mem_rows += [("total", f"{memory.total:.2f}"), ("capacity", f"{memory.capacity:.0f}")]
    time_rows = [(term, format_duration(seconds)) for term, seconds in result.time_breakdown_s.items() if seconds > 0]
    time_rows.append(("step", format_duration(result.step_time_s)))
    for i in range(max(len(mem_rows), len(time_rows))):
        left = mem_rows[i] if i < len(mem_rows) else ("", "")
        right = time_rows[i] if i < len(time_rows) else ("", "")
        table.add_row(*left, *right)
    console.print(table)
    split = case.parallel.pipeline_split
    if not split.is_even:  # a balanced layout was computed here: show the string Megatron takes
        stages = case.parallel.pipeline_stages(case.model.num_layers, case.model.mtp_num_layers)
        console.print(f"pipeline split: {split.label()} (layers per rank: "
                      f"{', '.join(map(str, stages.rank_layer_counts()))})", markup=False, highlight=False)
    # Read as attributes: the estimator sets them beyond the schema's required fields (extra="allow").
    convention = getattr(result, "flop_convention", "megatron")
    bubble, exposed = getattr(result, "bubble_fraction", 0.0), getattr(result, "exposed_comm_fraction", 0.0)
    console.print(
        f"params {format_count(result.params.total)} (active {format_count(result.params.active)}) · "
        f"model FLOPs/step {result.flops_per_step:.3e} ({convention} convention) · "
        f"bubble {bubble:.1%} · exposed comm {exposed:.1%}"
    )
    if result.calibration and result.calibration not in result.warnings:  # a caveat prints once, as a warning
        console.print(result.calibration, markup=False, highlight=False)
    if calibration_note:  # right under the calibration line, so the two are read together
        console.print(calibration_note, markup=False, highlight=False, soft_wrap=True)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


def _print_batch(rows: list[BatchRow]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from megapilot.estimate.units import format_duration

    table = Table(title="estimates")
    for column in ("line", "id", "fits", "GiB", "step", "tok/s/GPU", "TFLOP/s", "MFU", "error"):
        table.add_column(column, justify="left" if column in ("id", "error") else "right")
    for row in rows:
        label = (str(row.line), "" if row.id is None else escape(str(row.id)))
        if row.error is not None:
            table.add_row(*label, "", "", "", "", "", "", escape(f"{row.error.field}: {row.error.problem}"))
            continue
        r = row.result
        assert r is not None  # a row holds one of the two
        table.add_row(
            *label, "yes" if r.fits else "[red]no[/]", f"{r.memory_gib.total:.1f}", format_duration(r.step_time_s),
            f"{r.tokens_per_s_per_gpu:,.0f}", f"{r.tflops_per_gpu:.0f}", f"{r.mfu:.1%}", "",
        )
    console.print(table)
