"""`megapilot run`: run a launch script or a saved plan, follow it, and say how it ended.

Exit codes: 0 only when the run COMPLETED (exit 0 and the final iteration logged); 1 when it
failed, hung, timed out or was cancelled; 2 for a user error (missing script, bad plan...);
128 + N when stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP): the run's whole process tree is
stopped first, its result still printed.

`run --plan plan.json` renders the plan as a torchrun script for the embedded trainer, run by this
Python. `--device auto` (the default) renders for CPUs — gloo, fp32, without what the trainer refuses
there (sequence parallelism, the alltoall dispatcher) — unless a GPU is seen (`nvidia-smi`,
`rocm-smi`, `/dev/nvidia0`, `/dev/kfd`; torch is not imported). Data is Megatron's mock data unless
`--data-path PREFIX` (from `megapilot data prepare`, read with the byte tokenizer) is given;
`--train-iters` also sets how many iterations the plan trains. A plan's run is predicted before it starts (its GPU,
or this machine's CPU, measured, when rendered for CPUs) and the prediction printed beside the measured step with
where it departs (`--json`: `predicted` and `prediction_departure` beside the JobResult).

A plan's run is a measured run of its cluster, like a suite combo: its prediction is calibrated on that cluster's
runs in the history (`--cluster-name`; `local` when it runs on this machine's CPU), and when it ends its measured
step is recorded there beside that prediction, so that the next `estimate --cluster`, `plan --cluster` or suite
calibrates on it too (`--no-history`: neither).

A launch script is predicted from its own flags (the model, layout and world size `diagnose` reads from it; on this
machine's CPU when it runs over gloo, else on the GPU its header names): the prediction and where the run departs
from it are printed as for a plan, or the reason there is none (`--json`: `prediction_note`); what the prediction
assumed where the flags leave it open (a torchrun that starts a rank per GPU: the GPU type's node) is printed first, as
`diagnose --script` notes it (`--json`: `prediction_assumptions`). The job's record (job.json) keeps the ranks per node
the script states, none where its torchrun counts them. A script's run is not recorded in the history: it names no
cluster, and its flags may describe a model megapilot does not know exactly (use --plan).
"""

from __future__ import annotations

import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from megapilot.cli.common import console, emit_json, err_console
from megapilot.errors import MegapilotError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from megapilot.diagnose.flags import RunConfig
    from megapilot.estimate.history_calibration import MeasuredRun
    from megapilot.execute.base import JobResult, JobSpec, JobStatus, Launcher, ProgressCallback
    from megapilot.launch import LaunchScript
    from megapilot.logs import RunSummary
    from megapilot.spec import Prediction, SavedPlan

DEVICES = ("auto", "cpu", "gpu")
PLAN_TOKENIZERS = ("ByteTokenizer", "NullTokenizer")
EXIT_RUN_FAILED = 1
EXIT_INTERRUPTED = 130


def run(
    script: Annotated[Path | None, typer.Argument(
        help="Bash launch script to run (e.g. one written by `megapilot script`).", show_default=False)] = None,
    plan: Annotated[Path | None, typer.Option(
        "--plan", help="Saved plan (`megapilot plan --save`), rendered for the embedded trainer.")] = None,
    executor: Annotated[str, typer.Option(help="Where to run: a registered executor that needs no cluster file "
                                                "(local, slurm; ssh runs through `suite run --cluster`).")] = "local",
    run_dir: Annotated[Path, typer.Option(help="Parent directory of the run's files.")] = Path("runs"),
    combo: Annotated[str | None, typer.Option(
        help="Name of this run inside --run-dir (default: script/plan name + time).")] = None,
    hang_timeout_s: Annotated[float | None, typer.Option(
        help="Hung after this many seconds without a new iteration (default: adaptive, k x step time).")] = None,
    hang_factor: Annotated[float, typer.Option(help="k of the adaptive hang rule.")] = 10.0,
    startup_timeout_s: Annotated[float, typer.Option(help="Allowance before the first iteration line.")] = 900.0,
    timeout_s: Annotated[float | None, typer.Option(help="Wall-clock limit of the whole run.")] = None,
    train_iters: Annotated[int | None, typer.Option(
        help="Final iteration to expect (default: the plan's, or the total the log prints); "
             "with --plan also the iterations trained.")] = None,
    device: Annotated[str, typer.Option(
        help="With --plan: render for " + ", ".join(DEVICES) + " (auto: gpu when nvidia-smi, rocm-smi, /dev/nvidia0 "
             "or /dev/kfd is present, else cpu).")] = "auto",
    data_path: Annotated[Path | None, typer.Option(
        help="With --plan: dataset prefix (from `megapilot data prepare`; default: Megatron's mock data).")] = None,
    tokenizer_type: Annotated[str | None, typer.Option(
        help="With --plan and --data-path: " + " or ".join(PLAN_TOKENIZERS) + " (default ByteTokenizer; "
             "NullTokenizer reads pre-tokenized ids below the plan's vocabulary).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the JobResult as JSON.")] = False,
    db: Annotated[str | None, typer.Option("--db", help="History database: a SQLite path or postgresql:// URL "
                                                        "(default: the user data dir, or $MEGAPILOT_HISTORY).")] = None,
    no_history: Annotated[bool, typer.Option(
        "--no-history", help="With --plan: neither calibrate the prediction on the history nor record the run there."
    )] = False,
    cluster_name: Annotated[str | None, typer.Option(
        "--cluster-name", help="With --plan: record (and calibrate) the run under this cluster (default: `local` "
                               "when it runs on this machine's CPU; a GPU run needs one to be recorded).")] = None,
) -> None:
    """Run a launch script or a plan locally; exit 0 only when training reached its final iteration."""
    plan_data = _PlanData(device=device, data_path=data_path, tokenizer_type=tokenizer_type)
    job, notes, launch = _job_from_flags(script, plan, executor, run_dir, combo, hang_timeout_s, hang_factor,
                                         startup_timeout_s, timeout_s, train_iters, plan_data)
    recorder = _Recorder.open(plan, plan_data, db, cluster_name) if plan is not None and not no_history else None
    if recorder is None and plan is not None and not no_history:
        notes = [*notes, "not recorded in the history: a run on GPUs is recorded under its cluster "
                         "(--cluster-name NAME)"]
    prediction: Prediction | None
    assumptions: list[str] = []
    if plan is not None:
        prediction, no_prediction = _plan_prediction(plan, plan_data, recorder), None
    else:
        assert launch is not None  # a launch script's flags, read with its job
        prediction, no_prediction = _script_prediction(launch)
        assumptions = launch.assumptions(prediction)
    # notes are said once the run has started: a run directory it cannot use is then one error line alone
    result, interrupted = _run_and_follow(job, executor, show_progress=not json_output,
                                          notes=[] if json_output else notes + assumptions)
    log = _read_log(result, with_timers=prediction is not None and bool(result.step_time_s))
    departure = _departure(prediction, result, log)
    numerics = _numerics_warning(result, log)
    recorded = recorder.record(result, prediction) if recorder is not None and prediction is not None else None
    if json_output:
        extra: dict[str, object] = {"prediction_note": no_prediction} if prediction is None else {
            "predicted": prediction.model_dump(mode="json"), "prediction_departure": departure, "history": recorded}
        if assumptions:  # what a script's prediction assumed, as `diagnose --script --json` gives it in `notes`
            extra["prediction_assumptions"] = assumptions
        if plan is not None:  # a launch script names no model megapilot could resolve
            from megapilot.cli.common import planned_model

            extra["model"] = planned_model(plan, _load_plan(plan))
        emit_json(result.model_dump(mode="json") | extra | ({"warnings": [numerics]} if numerics else {}))
    else:
        _print_result(result)
        if numerics:
            err_console.print(f"warning: {numerics}", highlight=False, markup=False, soft_wrap=True)
        if prediction is not None and prediction.step_time_ms is not None:
            console.print(f"predicted step {prediction.step_time_ms / 1000:.3f} s on {prediction.device}"
                          + (f": {departure}" if departure else ""), highlight=False, soft_wrap=True)
        elif prediction is not None or no_prediction:
            why = no_prediction or (prediction.note if prediction is not None else "")
            console.print(f"no prediction: {why}", highlight=False, markup=False, soft_wrap=True)
        if recorded is not None:
            console.print(recorded["message"], highlight=False, markup=False, soft_wrap=True)
    if interrupted:
        from megapilot.execute.interrupt import received_signal

        signum = received_signal()
        raise typer.Exit(128 + signum if signum is not None else EXIT_INTERRUPTED)
    if not result.ok:
        raise typer.Exit(EXIT_RUN_FAILED)


def _plan_prediction(plan: Path, plan_data: _PlanData, recorder: _Recorder | None = None) -> Prediction:
    """What megapilot predicts for the plan's run before it starts: on the plan's GPU, or on this machine's CPU
    (measured) when the plan is rendered for CPUs; calibrated on the cluster's runs when the run is recorded."""
    from megapilot.suite.predicted import predict_combo

    saved_plan = _load_plan(plan)
    runs = recorder.calibration_runs() if recorder is not None else ()
    return predict_combo(saved_plan, None if plan_data.on_cpu else saved_plan.cluster.gpu, runs)


@dataclass(frozen=True)
class _ScriptFlags:
    """A launch script's flags, read once: the ranks per node its torchrun starts (for the job's record) and the
    run they describe (for its prediction), or why they describe none megapilot can price."""

    ranks_per_node: int | None = None
    config: RunConfig | None = None
    unpriced: str | None = None  # why config is None
    launcher_counts_ranks: bool = False  # torchrun's `--nproc-per-node gpu|auto|cpu`: a count the script leaves open

    @classmethod
    def read(cls, script: Path) -> _ScriptFlags:
        from megapilot.diagnose.flags import ranks_per_node, read_flags, run_config, torchrun_counted_ranks

        try:
            flags = read_flags(script=script)
        except MegapilotError as exc:  # a value the flag reader refuses: the script still runs as written
            return cls(unpriced=f"its flags describe no run megapilot can price ({exc})")
        assert flags is not None  # a script always gives flags (perhaps none of the model's)
        counted = torchrun_counted_ranks(flags) is not None
        try:
            ranks = ranks_per_node(flags)
        except MegapilotError:  # not a number torchrun takes: the script still runs as written
            ranks = None
        try:
            return cls(ranks, run_config(flags), launcher_counts_ranks=counted)
        except MegapilotError as exc:
            return cls(ranks, unpriced=f"its flags describe no run megapilot can price ({exc})",
                       launcher_counts_ranks=counted)

    def job_ranks(self) -> dict[str, int | None]:
        """The job's `gpus_per_node`: the number the script states; none (null in job.json) where its torchrun counts
        them itself, a count no executor knows (the prediction's assumed count is said as a note, never recorded as
        what ran: a record is what calibrates the next prediction); the default (1) where the script says nothing."""
        if self.launcher_counts_ranks:
            return {"gpus_per_node": None}
        return {"gpus_per_node": self.ranks_per_node} if self.ranks_per_node else {}

    def assumptions(self, prediction: Prediction | None) -> list[str]:
        """What the prediction of the script's run assumed (its flags left open), as `diagnose --script` says it."""
        return list(self.config.notes) if prediction is not None and self.config is not None else []


def _script_prediction(script: _ScriptFlags) -> tuple[Prediction | None, str | None]:
    """What megapilot predicts for a launch script's run, from the model, layout and world size its flags give (on
    this machine's CPU when it runs over gloo, else on the GPU its header names); or None and why there is none."""
    from megapilot.diagnose.flags import launch_nodes
    from megapilot.spec import ClusterSpec, SavedPlan
    from megapilot.suite.predicted import predict_combo

    config = script.config
    if config is None:
        return None, script.unpriced
    if config.model is None or config.training is None or config.parallel is None:
        return None, "its flags do not say the whole model (layers, hidden size, heads, sequence length)"
    on_cpu = config.flags.get("--distributed-backend") == "gloo"
    if config.gpu is None and not on_cpu:
        return None, ("it names no GPU megapilot knows (the header `megapilot script` writes names one); "
                      "`megapilot estimate` with --gpu predicts it")
    nodes = launch_nodes(config.flags)  # run_config said how it read them (an elastic MIN:MAX: its MAX)
    if config.world_size % nodes:
        return None, f"{config.world_size} ranks do not split over {nodes} nodes"
    try:
        from megapilot.catalog.host import host_cpu

        device = host_cpu(ranks_per_node=config.world_size // nodes) if on_cpu else config.gpu
        assert device is not None
        plan = SavedPlan(model=config.model, training=config.training, parallel=config.parallel,
                         cluster=ClusterSpec(gpu=device, num_nodes=nodes, gpus_per_node=config.world_size // nodes))
    except (MegapilotError, ValueError) as exc:
        return None, f"its flags describe no run megapilot can price ({exc})"
    prediction = predict_combo(plan, device, calibrate=False)  # the CPU as its ranks see it, measured above
    if prediction.step_time_ms is None:
        return None, prediction.note or "the estimator gave no step time"
    return prediction, None


@dataclass(frozen=True)
class _Recorder:
    """Where a plan's run is recorded: the history, the cluster and the plan."""

    db: str | None
    cluster: str
    plan_path: Path

    @classmethod
    def open(cls, plan: Path, plan_data: _PlanData, db: str | None, cluster_name: str | None) -> _Recorder | None:
        """None when the run has no cluster to be recorded under (a GPU run without --cluster-name)."""
        cluster = cluster_name or ("local" if plan_data.on_cpu else None)
        if cluster is None:
            return None
        from megapilot.store.history import open_history

        open_history(db).close()  # a history that cannot be opened is said before the run, not after it
        return cls(db, cluster, plan)

    def calibration_runs(self) -> tuple[MeasuredRun, ...]:
        from megapilot.store.history import open_history

        with open_history(self.db, read_only=True) as history:
            return history.calibration_runs(self.cluster)

    def record(self, result: JobResult, prediction: Prediction) -> dict[str, object] | None:
        """The run's measured step beside its prediction, in the history; what was written (None: nothing)."""
        from megapilot.store.history import open_history
        from megapilot.store.measured import from_plan_run

        if not result.step_time_s:
            return None
        started = (result.started_at or datetime.now()).strftime("%Y%m%d-%H%M%S")
        run_id = f"run/{result.combo}@{started}"  # a combo name is unique in its --run-dir only
        row = from_plan_run(run_id, self.cluster, _load_plan(self.plan_path), prediction, result.step_time_s,
                            completed=result.ok, recorded_at=datetime.now().astimezone().isoformat())
        if row is None:
            return None
        try:
            with open_history(self.db) as history:
                written = history.record_measured([row])
                location = history.location
        except MegapilotError as exc:  # the run's own result is still printed: a history that failed loses only this
            err_console.print(f"warning: the run was not recorded in the history: {exc}", highlight=False,
                              markup=False)
            return None
        if written.refused:  # its id is another cluster's run (or an imported one): that run is kept as it was
            (_, why), = written.refused
            err_console.print(f"warning: the run was not recorded in the history: {why}; record it under another "
                              "--run-dir or combo name", highlight=False, markup=False)
            return None
        how = "calibrates the next predictions" if row.calibrates else "did not complete: listed, calibrates nothing"
        return {"id": run_id, "cluster": self.cluster, "location": location,
                "message": f"recorded as {run_id} under cluster {self.cluster} in {location} ({how})"}


@dataclass(frozen=True)
class _LogReading:
    """What `run` reads from its log once the run has ended, in one pass: the summary (its NaN count) and, when the
    run is set against a prediction, each Megatron timer's per-iteration time (where it departs)."""

    summary: RunSummary | None
    timers_ms: dict[str, float]


def _read_log(result: JobResult, *, with_timers: bool) -> _LogReading | None:
    """The run's log read once, records not kept (its size is the run's, a multi-rank log's chatter included): the
    bulk summary pass, with timers its timer lines parsed too, for the one consumer that needs them (the departure
    from the prediction); the summary is the same either way."""
    if not result.logs:
        return None
    from megapilot.logs import TimerRecord, parse_logs

    timers: list[TimerRecord] = []
    summary = parse_logs(list(result.logs), summary_only=True, on_timer=timers.append if with_timers else None).summary
    if not with_timers:
        return _LogReading(summary, {})
    from megapilot.suite.metrics import timers_ms

    return _LogReading(summary, timers_ms(timers))


def _departure(prediction: Prediction | None, result: JobResult, log: _LogReading | None) -> str | None:
    """By how much, and in which component (Megatron's timers in the log), the run departs from the prediction."""
    if prediction is None or not result.step_time_s:
        return None
    from megapilot.suite.predicted import departure

    found = departure(prediction, result.step_time_s * 1000, log.timers_ms if log is not None else {})
    return found.sentence if found is not None else None


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("run")(run)


# ---- from flags to a JobSpec ---------------------------------------------------------------

@dataclass(frozen=True)
class _PlanData:
    """How `run --plan` renders its plan: for which device, on which data."""

    device: str = "auto"
    data_path: Path | None = None
    tokenizer_type: str | None = None

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu" or (self.device == "auto" and not gpu_present())

    def check(self, with_plan: bool) -> None:
        if self.device not in DEVICES:
            raise MegapilotError(f"unknown device {self.device!r}", field="device",
                                 fix="use one of: " + ", ".join(DEVICES))
        if not with_plan and (self.data_path is not None or self.tokenizer_type is not None or self.device != "auto"):
            raise MegapilotError("--device, --data-path and --tokenizer-type shape a rendered plan", field="plan",
                                 fix="use them with --plan plan.json (a launch script carries its own)")
        if self.tokenizer_type is not None and self.tokenizer_type not in PLAN_TOKENIZERS:
            raise MegapilotError(f"unknown tokenizer {self.tokenizer_type!r} for the embedded trainer",
                                 field="tokenizer_type", fix="use one of: " + ", ".join(PLAN_TOKENIZERS))
        if self.tokenizer_type is not None and self.data_path is None:
            raise MegapilotError("a tokenizer reads --data-path; mock data needs none", field="tokenizer_type",
                                 fix="add --data-path PREFIX, or drop --tokenizer-type")


def _refuse_what_bash_cannot_run(script: Path) -> None:
    """A saved plan, a Primus experiment or a binary given where the launch script goes: bash would run a plan's
    lines as commands and fail on the first ('version:: command not found'), after the run had started."""
    try:
        head = script.read_bytes()[:4096]
    except OSError as exc:
        raise MegapilotError(f"cannot read {script} ({exc.strerror})", field="script",
                             fix="pass a readable bash launch script") from None
    text = head.decode("utf-8", errors="replace").lstrip()
    if text.startswith("{"):
        raise MegapilotError(f"{script} is JSON (a saved plan?), not a bash launch script", field="script",
                             fix=f"run a saved plan with --plan: megapilot run --plan {script}")
    if script.suffix in (".yaml", ".yml"):
        raise MegapilotError(f"{script} is YAML (a Primus experiment?), not a bash launch script", field="script",
                             fix="run the launch script that names it (`megapilot script --launcher primus` writes "
                                 "both)")
    if b"\0" in head:
        raise MegapilotError(f"{script} is a binary file, not a bash launch script", field="script",
                             fix="pass the path of a bash launch script (e.g. one from `megapilot script`)")


def _job_from_flags(script: Path | None, plan: Path | None, executor: str, run_dir: Path, combo: str | None,
                    hang_timeout_s: float | None, hang_factor: float, startup_timeout_s: float,
                    timeout_s: float | None, train_iters: int | None,
                    plan_data: _PlanData = _PlanData()) -> tuple[JobSpec, list[str], _ScriptFlags | None]:
    """The job to run, notes on how a plan was rendered, and a launch script's flags (None for a plan)."""
    from pydantic import ValidationError

    from megapilot.cli.common import require_positive, validation_error
    from megapilot.execute.base import HangPolicy, job_spec_or_error
    from megapilot.execute.registry import executor_class

    capabilities = executor_class(executor, field="--executor").capabilities
    if capabilities.needs_node_list:
        raise MegapilotError(f"the {executor} executor needs the nodes of a cluster file", field="--executor",
                             fix="run it as a suite: megapilot suite run suite.json --cluster cluster.json")
    if (script is None) == (plan is None):
        raise MegapilotError("give a launch script or --plan, not both and not neither", field="script",
                             fix="megapilot run train.sh, or megapilot run --plan plan.json")
    plan_data.check(with_plan=plan is not None)
    for flag, value in (("--timeout-s", timeout_s), ("--train-iters", train_iters),
                        ("--hang-timeout-s", hang_timeout_s),
                        ("--startup-timeout-s", startup_timeout_s)):
        require_positive(flag, value)
    try:
        hang = HangPolicy(startup_s=startup_timeout_s, factor=hang_factor, fixed_window_s=hang_timeout_s)
    except ValidationError as exc:
        flags = {"startup_s": "--startup-timeout-s", "factor": "--hang-factor", "fixed_window_s": "--hang-timeout-s"}
        raise validation_error(exc, flags=flags) from None
    common = dict(run_dir=run_dir, hang=hang, timeout_s=timeout_s, cwd=Path.cwd())
    if script is not None:
        if not script.is_file():
            raise MegapilotError(f"{script} does not exist or is not a file", field="script",
                                 fix="pass the path of a bash launch script (e.g. one from `megapilot script`)")
        _refuse_what_bash_cannot_run(script)
        launch_flags = _ScriptFlags.read(script)
        # the script decides its ranks per node: a record of the default (1) would misstate the run (job.json)
        return _job_spec(job_spec_or_error, combo=_default_combo(script.stem) if combo is None else combo,
                         script=script,
                         train_iters=train_iters, **launch_flags.job_ranks(), **common), [], launch_flags
    assert plan is not None
    saved_plan = _load_plan(plan)
    if train_iters is not None:
        saved_plan = saved_plan.model_copy(
            update={"training": saved_plan.training.model_copy(update={"train_iters": train_iters})})
    name = _default_combo(plan.stem) if combo is None else combo  # an empty --combo is refused, not replaced
    launch = _render_plan(saved_plan, plan_data, capabilities.launcher, run_dir / name)
    job = _job_spec(
        job_spec_or_error, combo=name, script_text=launch.script, nodes=launch.nodes,
        gpus_per_node=launch.gpus_per_node, train_iters=saved_plan.training.train_iters, **common,
    )
    return job, launch.notes, None


def _job_spec(make: Callable[..., JobSpec], **fields: object) -> JobSpec:
    """The JobSpec, its errors naming this command's flags (`--combo`, not `job.combo`) and saying what to do."""
    try:
        return make(**fields)
    except MegapilotError as exc:
        name = (exc.field or "").removeprefix("job.")
        if name not in fields or exc.field == name:
            raise
        flag = "--" + name.replace("_", "-")
        raise MegapilotError(exc.problem, field=flag, fix=exc.fix or f"pass a valid {flag}") from None


def _default_combo(stem: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in stem).strip("-.") or "run"
    return f"{safe}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _load_plan(path: Path) -> SavedPlan:
    from megapilot.cli.common import load_plan_file

    return load_plan_file(path)


def _render_plan(saved_plan: SavedPlan, plan_data: _PlanData, launcher: Launcher = "torchrun",
                 job_dir: Path | None = None) -> LaunchScript:
    """The plan as a script for the embedded trainer, run by this Python: on CPUs (gloo, fp32, what the trainer
    refuses there left out) when no GPU is present, on mock data unless --data-path is given. A torchrun script,
    or an sbatch script where the executor submits to SLURM (its output next to the job)."""
    from megapilot.launch import LaunchOptions, render_launch

    cpu = plan_data.on_cpu
    data: dict[str, object] = {"mock_data": True}
    if plan_data.data_path is not None:
        data = {"data_path": str(plan_data.data_path.expanduser().absolute()),
                "tokenizer_type": plan_data.tokenizer_type or "ByteTokenizer"}
    if launcher == "slurm" and job_dir is not None:
        data.update(log_dir=str(job_dir.absolute()), exclusive=not cpu, remote=True)
    options = LaunchOptions(launcher=launcher, entrypoint="megapilot", python=sys.executable, cpu=cpu,
                            **data)  # type: ignore[arg-type]  # path fields by name; pydantic checks them
    return render_launch(saved_plan, options)


def gpu_present() -> bool:
    """Whether this machine has an NVIDIA or AMD GPU, judged without importing torch (CLI start-up stays
    fast): a vendor tool on PATH or a device node."""
    tools = ("nvidia-smi", "rocm-smi", "amd-smi")
    device_nodes = ("/dev/nvidia0", "/dev/kfd")
    return any(shutil.which(tool) for tool in tools) or any(Path(node).exists() for node in device_nodes)


# ---- running and following ---------------------------------------------------------------

def _run_and_follow(job: JobSpec, executor_name: str = "local", *, show_progress: bool,
                    notes: Sequence[str] = ()) -> tuple[JobResult, bool]:
    """Submit, say the notes, follow with a progress bar, and return (result, interrupted)."""
    from megapilot.execute.interrupt import stop_on_signals, stop_reason
    from megapilot.execute.registry import make_executor

    executor = make_executor(executor_name)
    with stop_on_signals():  # from the submit on: a signal before the first poll also stops the run and says so
        try:
            handle = executor.submit(job)
        except MegapilotError as exc:  # the job's directory: said with the flag that names it
            flag = _SUBMIT_FLAGS.get(exc.field or "")
            if flag is None:
                raise
            raise MegapilotError(exc.problem, field=flag, fix=exc.fix) from None
        except OSError as exc:  # its files could not be written (a full disk): the executor stopped what it started
            raise _run_dir_error(exc, job, started=False) from None
        try:
            for note in notes:
                err_console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
            if show_progress:
                from rich.markup import escape

                err_console.print(f"[bold]running[/] {escape(job.combo)}: log {escape(str(executor.logs(handle)[0]))}",
                                  highlight=False)
            with _progress_display(show_progress) as on_progress:
                return executor.wait(handle, on_progress=on_progress), False
        except KeyboardInterrupt as exc:
            # wait() has stopped the run and recorded by which signal; one that came before wait() stops it here
            executor.cancel(handle, stop_reason(exc))
            return executor.result(handle), True
        except OSError as exc:  # its record could not be written (a full disk): wait() has stopped the run
            raise _run_dir_error(exc, job, started=True) from None


# the fields a job's directory is refused by, as this command's flags name them
_SUBMIT_FLAGS = {"run_dir": "--run-dir", "combo": "--combo", "job.run_dir": "--run-dir", "job.combo": "--combo",
                 "executor": "--executor"}


def _run_dir_error(exc: OSError, job: JobSpec, *, started: bool) -> MegapilotError:
    """A run whose files cannot be written in its directory: one line naming --run-dir and the fix."""
    from megapilot.files import DiskFullError, is_disk_full

    # an OSError's filename may be the copied script, not what could not be written: the job's directory is named
    why = str(exc) if isinstance(exc, DiskFullError) else f"{job.job_dir}: {exc.strerror or exc}"
    fix = ("free space on that file system, or pass a --run-dir on another one" if is_disk_full(exc)
           else "pass a --run-dir you may write")
    stopped = "; the run was stopped" if started else ""
    return MegapilotError(f"cannot write the run's files: {why}{stopped}", field="--run-dir", fix=fix)


@contextmanager
def _progress_display(enabled: bool) -> Iterator[ProgressCallback | None]:
    """A rich progress bar on iterations (on stderr, so stdout stays clean); yields the callback."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[step]}"),
        TimeElapsedColumn(), console=err_console, transient=True,
    )
    task = progress.add_task("starting", total=None, step="")

    def on_progress(status: JobStatus) -> None:
        step = f"{status.step_time_s:.2f} s/it" if status.step_time_s else ""
        progress.update(task, description=status.state.value.lower(), total=status.train_iters,
                        completed=status.iteration or 0, step=step)

    with progress:
        yield on_progress


# ---- output --------------------------------------------------------------------------------

_STATE_STYLE = {"COMPLETED": "bold green", "RUNNING": "bold", "PENDING": "bold"}


def _numerics_warning(result: JobResult, log: _LogReading | None) -> str | None:
    """A run that reached its last iteration with NaN steps finished, but its numerics did not: said beside the exit
    code, which keeps meaning 'training reached its final iteration'."""
    summary = log.summary if log is not None else None
    if summary is None or not summary.nan_iterations:
        return None
    log_path = result.logs[0]
    return (f"{summary.nan_iterations} iteration(s) had a NaN/Inf loss or gradient (Megatron skipped them): the "
            f"run finished but its numerics did not; `megapilot diagnose {log_path}` says why")


def _print_result(result: JobResult) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"run {result.combo}", show_header=False, title_justify="left")
    table.add_column("field", style="dim")
    table.add_column("value", overflow="fold")
    style = _STATE_STYLE.get(result.state.value, "bold red")
    table.add_row("state", f"[{style}]{result.state.value}[/]")
    reached = "—" if result.iterations_reached is None else str(result.iterations_reached)
    table.add_row("iterations", f"{reached} / {result.train_iters or '?'}")
    table.add_row("exit code", "—" if result.exit_code is None else str(result.exit_code))
    if result.reason:
        table.add_row("reason", Text(result.reason))  # log lines and paths: text, never markup
    if result.step_time_s:
        table.add_row("step time", f"{result.step_time_s:.3f} s")
    table.add_row("duration", f"{result.duration_s:.1f} s")
    table.add_row("log", Text(str(result.logs[0])) if result.logs else "—")
    table.add_row("job dir", Text(str(result.job_dir)))
    console.print(table)
