"""`megapilot plan` (search parallel layouts) and `megapilot profile set|show` (saved first-run inputs)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from megapilot.cli.budget_options import NO_BUDGET, BudgetFlags, budget_options
from megapilot.cli.estimate_cmd import HISTORY_DB_HELP
from megapilot.cli.layer_table import LAYERS_HELP, print_layers
from megapilot.cli.layout_field import with_default
from megapilot.cli.layout_fields import LAYOUT_OPTIONS
from megapilot.cli.layout_options import (
    FP8_RECIPE_HELP,
    GBS_HELP,
    MEGATRON_SPELLINGS,
    MODEL_HELP,
    NO_FEATURES,
    PRECISION_HELP,
    SEQ_LEN_HELP,
    FeatureFlags,
    Gpu,
    Gpus,
    GpusPerNode,
    feature_options,
    one_spelling,
    unlisted_option,
)
from megapilot.errors import MegapilotError

if TYPE_CHECKING:
    from megapilot.catalog import ResolvedModel
    from megapilot.estimate import EstimateOptions
    from megapilot.estimate.layer_report import LayerGroup
    from megapilot.plan import PlanResult
    from megapilot.plan.budget import BudgetedPlan
    from megapilot.spec import ClusterSpec, ModelSpec, TrainingSpec
    from megapilot.store.profile import Profile

# Options that `plan` and `profile set|show` share (typer reads an option's declaration, so one serves each); the
# hardware ones are `estimate`'s and `script`'s too (`layout_options`).
PROFILE_OPTION = typer.Option(None, "--profile",
                              help="Profile TOML (default: $MEGAPILOT_PROFILE or the user config dir).")
JSON_OPTION = typer.Option(False, "--json", help="Machine output.")


_LAYOUT_OPTION = {option.name: option for option in LAYOUT_OPTIONS}  # by field: a pin says what its field means


def _pin(name: str, *decls: str) -> Any:  # typer's OptionInfo, typed Any by typer itself
    """A `plan` option that fixes one dimension of the search (left out: the planner chooses), under its short
    name and Megatron-LM's (`--tp`, `--tensor-model-parallel-size`), as `estimate` and `script` take it, with the
    layout field's description for its help; `decls` where it is declared otherwise (`--fsdp/--no-fsdp`)."""
    names = decls or (f"--{name.replace('_', '-')}", *MEGATRON_SPELLINGS.get(name, ()))
    return typer.Option(None, *names, help=with_default(_LAYOUT_OPTION[name].description, "searched"))


@dataclass
class _Inputs:
    """The plan's hardware inputs after flags and profile defaults are merged."""

    gpu: str
    gpus: int
    gpus_per_node: int | None
    notes: list[str]


def _merge_profile(profile_file: Path | None, gpu: str | None, gpus: int | None,
                   gpus_per_node: int | None) -> _Inputs:
    """Flags win; a flag left out is taken from the profile, with a note saying so."""
    from megapilot.cli.common import load_profile_checked
    from megapilot.estimate.cases import missing_inputs_error

    profile = load_profile_checked(profile_file)
    notes: list[str] = []
    merged = {"gpu": gpu, "gpus": gpus, "gpus_per_node": gpus_per_node}
    for name, value in list(merged.items()):
        if value is None and getattr(profile, name) is not None:
            merged[name] = getattr(profile, name)
            notes.append(profile.default_note(name))
    missing = [name for name in ("gpu", "gpus") if merged[name] is None]
    if missing:
        stored = " ".join(f"--{name} ..." for name in missing)
        raise missing_inputs_error(missing, fix=f"pass {' and '.join(f'--{name}' for name in missing)} or store "
                                                f"{'them' if len(missing) > 1 else 'it'} with "
                                                f"`megapilot profile set {stored}`")
    return _Inputs(str(merged["gpu"]), int(merged["gpus"]), merged["gpus_per_node"], notes)  # type: ignore[arg-type]  # int | None from the profile


@dataclass(frozen=True)
class _Specs:
    """What the search runs on: the model as the run's features make it, the cluster, the batch and optimizer,
    and the estimator's run options (the MoE dispatcher)."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    options: EstimateOptions
    resolved: ResolvedModel  # what --model became and where it came from


def _build_specs(
    model_name: str, inputs: _Inputs, seq_len: int, gbs: int, precision: str, fp8_recipe: str | None = None,
    features: FeatureFlags = NO_FEATURES,
) -> _Specs:
    from megapilot.catalog import resolve_model
    from megapilot.catalog.gpus import cluster_of
    from megapilot.errors import MegapilotError
    from megapilot.estimate import run_options, with_features
    from megapilot.estimate.cases import build_training, check_cuda_graphs
    from megapilot.spec import ParallelConfig

    given = features.case_features()
    resolved = resolve_model(model_name)
    model = with_features(resolved.spec, given)
    cluster = cluster_of(inputs.gpu, inputs.gpus, inputs.gpus_per_node)
    try:
        training = build_training(seq_len=seq_len, gbs=gbs, precision=precision, fp8_recipe=fp8_recipe,
                                  optimizer=features.optimizer, grad_reduce_in_bf16=features.grad_reduce_in_bf16)
    except MegapilotError as exc:  # named by the flag as plan's other refusals are (--seq-len, not seq_len)
        flag = f"--{exc.field.replace('_', '-')}" if exc.field else None
        raise MegapilotError(exc.problem, field=flag, fix=exc.fix) from None
    cluster.gpu.check_precision(training.precision, training.fp8_recipe)
    options = run_options(model, given, cluster)
    if options.cuda_graphs is not None:  # what the model refuses, before any layout (the search keeps the rest)
        check_cuda_graphs(model, ParallelConfig.for_world(cluster.world_size, recompute="none"), training, options)
    return _Specs(model, cluster, training, options, resolved)


# Options whose default the output states when it was used (the search's answer depends on them).
_STATED_DEFAULTS = (("seq_len", "seq-len"), ("gbs", "GBS"), ("precision", "precision"))


def _defaults_used(ctx: typer.Context, values: dict[str, object]) -> list[str]:
    """`seq-len 4096 (default)` for each stated option the user left out (the parser knows which)."""
    from typer.core import _click

    return [f"{label} {values[name]} (default)" for name, label in _STATED_DEFAULTS
            if ctx.get_parameter_source(name) is _click.core.ParameterSource.DEFAULT]


def _naming_defaults(error: MegapilotError, defaults: list[str]) -> MegapilotError:
    """An error about a value the user never typed says it was a default (`seq_length=4096` from nowhere puzzles)."""
    if not defaults:
        return error
    said = f"{error.field or ''} {error.problem}".lower()
    named = [d for d in defaults if d.split()[0].replace("-", "_").lower() in said
             or (d.startswith("seq-len") and "seq_length" in said) or (d.startswith("GBS") and "batch" in said)]
    if not named:
        return error
    fix = "; ".join(part for part in (error.fix, "pass the value with its flag") if part)
    return MegapilotError(f"{error.problem} (from {', '.join(named)})", field=error.field, fix=fix)


@budget_options()
@feature_options()
def plan_command(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", help=MODEL_HELP),
    gpu: Gpu = None,
    gpus: Gpus = None,
    gpus_per_node: GpusPerNode = None,
    seq_len: int = typer.Option(4096, "--seq-len", help=SEQ_LEN_HELP),
    gbs: int = typer.Option(1024, "--gbs", help=GBS_HELP),
    precision: str = typer.Option("bf16", "--precision", help=f"{PRECISION_HELP}."),
    fp8_recipe: str | None = typer.Option(None, "--fp8-recipe", help=FP8_RECIPE_HELP),
    top: int = typer.Option(5, "--top", help="How many layouts to show."),
    tp: int | None = _pin("tp"),
    pp: int | None = _pin("pp"),
    vpp: int | None = _pin("vpp"),
    vpp_unlisted: int | None = unlisted_option("vpp"),
    cp: int | None = _pin("cp"),
    cp_comm_type: str | None = typer.Option(None, "--cp-comm-type", help=with_default(
        _LAYOUT_OPTION["cp_comm_type"].description, "a2a on a model with attention sinks, else p2p")),
    ep: int | None = _pin("ep"),
    etp: int | None = _pin("etp"),
    mbs: int | None = _pin("mbs"),
    recompute: str | None = _pin("recompute"),
    recompute_modules: str | None = _pin("recompute_modules"),
    fsdp: bool | None = _pin("fsdp", "--fsdp/--no-fsdp"),
    features: FeatureFlags = NO_FEATURES,  # the run the layouts are searched for (MTP, token drop, optimizer, ...)
    budget: BudgetFlags = NO_BUDGET,  # --tokens 15.6T: rank by time to train (megapilot.plan.budget)
    headroom: float = typer.Option(
        0.0, "--headroom",
        help="Share of each GPU's HBM a planned layout leaves free beyond the estimate's own overhead allowance "
             "(CUDA context, NCCL buffers, 10 % of activations); default 0, e.g. 0.05."),
    save: Path | None = typer.Option(None, "--save", help="Write the winner as a plan file (JSON)."),
    profile: Path | None = PROFILE_OPTION,
    as_json: bool = JSON_OPTION,
    cluster: str | None = typer.Option(None, "--cluster", help="Calibrate the figures on this cluster's measured "
                                                               "runs in the history."),
    calibration: str = typer.Option("history", "--calibration", help="history (with --cluster) or none."),
    db: str | None = typer.Option(None, "--db", help=HISTORY_DB_HELP),
    layers: bool = typer.Option(False, "--layers", help=f"{LAYERS_HELP} For the top layout."),
) -> None:
    """Search every legal parallel layout and rank them by predicted tokens/s/GPU; layouts within the estimate's own
    calibrated error of the fastest are ordered as the public recipes prefer (the reasons name the rule)."""
    from megapilot.cli.common import console, emit_json, print_assumptions, require_positive
    from megapilot.errors import MegapilotError
    from megapilot.estimate.cases import parse_recompute_modules
    from megapilot.plan import Pins, plan
    from megapilot.spec.validate import FP32_GRADIENTS_ASSUMED, bf16_gradients_would_change, overlaps_assumed

    vpp = one_spelling("vpp", vpp, vpp_unlisted)
    # A zero or negative size is refused here: the search would divide by it or silently ignore the pin.
    for flag, value in (("--gpus", gpus), ("--gpus-per-node", gpus_per_node), ("--seq-len", seq_len), ("--gbs", gbs),
                        ("--tp", tp), ("--pp", pp), ("--vpp", vpp), ("--cp", cp), ("--ep", ep), ("--etp", etp),
                        ("--mbs", mbs)):
        require_positive(flag, value)
    # Each pin is checked as its layout field is (type, bounds, choices: the spec's), before any input is resolved.
    pins = Pins(tp=tp, pp=pp, vpp=vpp, cp=cp, cp_comm_type=cp_comm_type, ep=ep, etp=etp, mbs=mbs, recompute=recompute,
                recompute_modules=parse_recompute_modules(recompute_modules), fsdp=fsdp)
    inputs = _merge_profile(profile, gpu, gpus, gpus_per_node)
    defaults = _defaults_used(ctx, {"seq_len": seq_len, "gbs": gbs, "precision": precision})
    try:
        specs = _build_specs(model, inputs, seq_len, gbs, precision, fp8_recipe, features)
        result = plan(specs.model, specs.cluster, specs.training, top=top, pins=pins, options=specs.options,
                      headroom_fraction=headroom)
        budgeted = _budgeted(result, budget, specs.options)
        result = budgeted.plan if budgeted else result
    except MegapilotError as exc:
        raise _naming_defaults(exc, defaults) from None
    if bf16_gradients_would_change(specs.training, specs.cluster.gpu):
        defaults.append(FP32_GRADIENTS_ASSUMED)
    if (overlaps := overlaps_assumed(specs.cluster.gpu, specs.training.precision)) is not None:
        defaults.append(overlaps)
    if specs.model.moe is not None and features.moe_flex_dispatcher is None:
        defaults.append(f"alltoall MoE dispatcher inside the {specs.cluster.gpu.scaleup_fabric} domain, flex beyond it "
                        "where a backend runs (default)")
    if calibration not in ("history", "none"):
        raise MegapilotError(f"unknown calibration {calibration!r}", field="--calibration", fix="use history or none")
    groups = _top_layer_groups(result, specs) if layers else ()
    calibrations: list[dict[str, Any] | None] = [None] * len(result.candidates)
    if cluster is not None and calibration == "history":
        result, calibrations = _calibrated(result, cluster, db)
    if save is not None:
        _save_plan(result, save, features)
    assumed = defaults + inputs.notes
    if as_json:
        document = (replace(budgeted, plan=result) if budgeted else result).to_json()
        if cluster is not None and calibration == "history":
            for candidate, about in zip(document["candidates"], calibrations, strict=True):  # type: ignore[call-overload]  # a list of dicts
                candidate["calibration_from_history"] = about
        emit_json({**document, "model": specs.resolved.to_dict(), "defaults": assumed,
                   "saved": str(save) if save else None}
                  | ({"layers": [group.to_json() for group in groups]} if layers else {}))
        return
    console.print(f"model: {specs.resolved.describe()}", highlight=False)
    _render(result, save)
    if layers:
        print_layers(groups)
    if budgeted is not None:
        from megapilot.cli.budget_options import print_budget_ranking

        print_budget_ranking(replace(budgeted, plan=result))
    if any(calibrations):
        from megapilot.cli.common import console
        from megapilot.cli.estimate_cmd import cluster_calibration_note

        about = calibrations[0] or {}
        # applied, #1's calibration line above already names the cluster's calibration: said once, not twice
        said = (f"the figures are calibrated on cluster {cluster} (the calibration line above)" if about["applied"]
                else cluster_calibration_note(about))
        console.print(f"{said}; the ranking is the planner's, by the uncalibrated figures", markup=False,
                      highlight=False, soft_wrap=True)
    print_assumptions(assumed)


def _top_layer_groups(result: PlanResult, specs: _Specs) -> tuple[LayerGroup, ...]:
    """The per-layer terms of the top layout (the physics model's, before any cluster calibration)."""
    from megapilot.estimate.cases import Case
    from megapilot.estimate.layer_report import layer_groups

    return layer_groups(Case(specs.model, specs.cluster, specs.training, result.candidates[0].parallel,
                             options=specs.options))


def _budgeted(result: PlanResult, budget: BudgetFlags, options: EstimateOptions) -> BudgetedPlan | None:
    """With a budget, the candidates ranked by time to train, each with its run."""
    from megapilot.plan.budget import rank_by_time_to_train

    request = budget.request(gpu=result.cluster.gpu)
    return None if request is None else rank_by_time_to_train(result, request, options)


def _calibrated(result: PlanResult, cluster: str, db: str | None = None
                ) -> tuple[PlanResult, list[dict[str, Any] | None]]:
    """Each candidate's figures calibrated on the cluster's runs (the planner's order kept)."""
    from types import SimpleNamespace

    from megapilot.cli.estimate_cmd import ClusterCalibrator
    from megapilot.estimate.history_calibration import calibrate_estimate

    runs = ClusterCalibrator(db=db).runs(cluster)
    candidates = []
    calibrations: list[dict[str, Any] | None] = []
    for candidate in result.candidates:
        case = SimpleNamespace(model=result.model, cluster=result.cluster, training=result.training,
                               parallel=candidate.parallel)
        estimate, about = calibrate_estimate(case, candidate.estimate, runs, cluster)
        candidates.append(candidate.model_copy(update={"estimate": estimate}))
        calibrations.append(about)
    return result.model_copy(update={"candidates": candidates}), calibrations


def _save_plan(result: PlanResult, path: Path, features: FeatureFlags) -> None:
    """The winner as a plan file, with the dispatcher, all-to-all overlap and CUDA graphs it was costed with (the launch
    script writes them)."""
    from megapilot.errors import MegapilotError
    from megapilot.estimate.cases import cuda_graphs_from

    saved = result.to_saved_plan()
    saved = saved.model_copy(update={"moe_flex_dispatcher": features.moe_flex_dispatcher or saved.moe_flex_dispatcher,
                                     "moe_a2a_overlap": features.moe_a2a_overlap,
                                     "cuda_graphs": cuda_graphs_from(features.case_features())})
    try:
        path.write_text(saved.model_dump_json(indent=2) + "\n")
    except OSError as exc:
        raise MegapilotError(f"cannot write {path} ({exc.strerror})", field="--save",
                             fix="pass a path in a writable directory") from None


def _render(result: PlanResult, saved: Path | None) -> None:
    from rich.table import Table

    from megapilot.cli.common import cluster_label, console
    from megapilot.estimate.units import format_duration
    from megapilot.plan.reasons import bubble_share, exposed_comm_share, layout_label

    c = result.cluster
    t = result.training
    optimizer = "" if t.optimizer == "adam" else f", {t.optimizer}"
    gradients = ", bf16 gradients" if t.grad_reduce_in_bf16 else ""
    table = Table(title=f"{result.model.name} on {cluster_label(c)} — seq {t.seq_length:,}, "
                        f"GBS {t.global_batch_size:,}, {t.precision}{optimizer}{gradients}")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("layout", overflow="fold", min_width=14)  # the one column that may fold
    # Two-line headings keep the table inside an 80-column terminal.
    for column in ("memory\nGiB / cap", "step\ntime", "tokens/s\n/GPU", "MFU\n%", "bubble\n%", "exposed\ncomm %"):
        table.add_column(column, justify="right", no_wrap=True)
    for index, cand in enumerate(result.candidates, start=1):
        est = cand.estimate
        dispatcher = f" flex:{cand.moe_flex_dispatcher}" if cand.moe_flex_dispatcher else ""
        table.add_row(str(index), layout_label(cand.parallel) + dispatcher,
                      f"{est.memory_gib.total:.1f} / {est.memory_gib.capacity:.0f}", format_duration(est.step_time_s),
                      f"{est.tokens_per_s_per_gpu:,.0f}", f"{est.mfu * 100:.1f}",
                      f"{bubble_share(est) * 100:.1f}", f"{exposed_comm_share(est) * 100:.1f}")
    console.print(table)
    console.print("[bold]Why #1:[/]")
    for reason in result.best.reasons:
        console.print(f"  • {reason}", highlight=False, soft_wrap=True)
    calibration = result.best.estimate.calibration  # how far the numbers above were off on published runs like it
    if calibration and not any(calibration in reason for reason in result.best.reasons):  # a note may say it already
        console.print(calibration, markup=False, highlight=False, soft_wrap=True)
    best = result.best.estimate
    if best.tokens_per_s_per_gpu_p10 is not None and best.tokens_per_s_per_gpu_p90 is not None:
        console.print(f"80 % interval of #1: {best.tokens_per_s_per_gpu_p10:,.0f}-{best.tokens_per_s_per_gpu_p90:,.0f}"
                      f" tokens/s/GPU ({best.interval_basis})", markup=False, highlight=False, soft_wrap=True)
    others = result.why_the_others()
    if others:
        console.print("[bold]Why the others lost:[/]")
        for line in others:
            console.print(f"  • {line}", highlight=False, soft_wrap=True)
    rules = {k: v for k, v in result.rejected.items() if not k.startswith("dominated")}
    dominated = sum(v for k, v in result.rejected.items() if k.startswith("dominated"))
    cut = "; ".join(f"{k} ({v})" for k, v in list(rules.items())[:4]) or "none"  # every pin held, nothing cut
    console.print(f"[dim]{result.layouts_costed} layouts estimated, {result.memory_checks} memory checks, "
                  f"{result.layouts_fitting} fit; {dominated} dominated options skipped; cut by rule: {cut}[/]",
                  highlight=False, soft_wrap=True)
    console.print(f"\n{result.shell()}\n[dim]# {result.product_check()}[/]", highlight=False)
    if saved:
        console.print(f"[green]plan saved to {saved}[/]", highlight=False)


# ---- profile ----------------------------------------------------------------------------------

profile_app = typer.Typer(help="Saved first-run inputs that later commands use as defaults.", no_args_is_help=True)


@profile_app.command("set")
def profile_set(
    gpu: Gpu = None,
    gpus: Gpus = None,
    gpus_per_node: GpusPerNode = None,
    data_path: str | None = typer.Option(None, "--data-path", help="Megatron --data-path prefix."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="Tokenizer model or HF name."),
    save_dir: str | None = typer.Option(None, "--save-dir", help="Checkpoint directory."),
    profile: Path | None = PROFILE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Store (merge) first-run inputs in the profile."""
    from megapilot.catalog import get_gpu
    from megapilot.cli.common import load_profile_checked, require_positive
    from megapilot.errors import MegapilotError
    from megapilot.store.profile import save_profile

    require_positive("--gpus", gpus)
    require_positive("--gpus-per-node", gpus_per_node)
    if profile is not None and profile.exists():
        load_profile_checked(profile)  # a broken profile file is named before it is merged into
    if gpu is not None:
        gpu = get_gpu(gpu).alias  # refuse unknown GPUs now, not at the next plan
    try:
        saved = save_profile(profile, gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node, data_path=data_path,
                             tokenizer=tokenizer, save_dir=save_dir)
    except OSError as exc:
        raise MegapilotError(f"cannot write {exc.filename or profile} ({exc.strerror or exc})", field="--profile",
                             fix="pass a writable path with --profile FILE") from None
    _show(saved, as_json)


@profile_app.command("show")
def profile_show(
    profile: Path | None = PROFILE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Print the saved profile and where it lives."""
    from megapilot.cli.common import load_profile_checked
    from megapilot.store.profile import profile_path

    loaded = load_profile_checked(profile)
    if loaded.source is None:
        loaded = loaded.model_copy(update={"source": str(profile_path(profile))})
    _show(loaded, as_json)


def _show(profile: Profile, as_json: bool) -> None:
    from pathlib import Path as _Path

    from megapilot.cli.common import console, emit_json

    exists = _Path(profile.source).is_file() if profile.source else False
    if as_json:
        emit_json({"path": profile.source, "exists": exists, "profile": profile.values()})
        return
    from rich.table import Table

    table = Table(title=f"profile {profile.source}" + ("" if exists else " (not written yet)"))
    table.add_column("field")
    table.add_column("value")
    for name, value in profile.values().items():
        table.add_row(name, str(value))
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("plan")(plan_command)
    app.add_typer(profile_app, name="profile")
