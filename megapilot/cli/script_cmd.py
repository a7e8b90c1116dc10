"""`megapilot script`: write a checked launch script (torchrun, SLURM sbatch or AMD Primus) for a plan.

The plan comes from `--plan plan.json` (written by `megapilot plan --save`) or from layout flags
(`--model --gpu --gpus --gbs --seq-len --tp ...`), resolved by `megapilot.estimate.build_case` exactly as
`megapilot estimate` resolves them (same flags, defaults and errors). The GPU and its count left out
are filled from the saved profile, and the output says so. The script is a draft: this command never runs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from megapilot.cli.budget_options import NO_RUN_BUDGET, RunBudgetFlags, budget_options, schedule_from_budget
from megapilot.cli.common import console, emit_json, err_console, print_assumptions
from megapilot.cli.layout_options import (
    NO_FEATURES,
    NOTHING_GIVEN,
    FeatureFlags,
    LayoutFlags,
    feature_options,
    layout_options,
)
from megapilot.errors import MegapilotError

if TYPE_CHECKING:
    from megapilot.launch import LaunchOptions, LaunchScript
    from megapilot.spec import SavedPlan
    from megapilot.store.profile import Profile

LAUNCHERS = ("torchrun", "slurm", "primus")
ENTRYPOINTS = ("megatron", "megapilot")
GPUS_NOTE = "Default: --nodes x GPUs per node, else the profile's."


@budget_options(RunBudgetFlags)
@feature_options()
@layout_options(notes={"gpus": GPUS_NOTE})
def script(
    plan_file: Annotated[Path | None, typer.Argument(
        metavar="[PLAN]", show_default=False, help="Saved plan JSON, as --plan gives it.")] = None,
    plan: Annotated[Path | None, typer.Option("--plan", help="Saved plan JSON (`megapilot plan --save`).")] = None,
    layout: LayoutFlags = NOTHING_GIVEN,  # the layout flags (instead of --plan)
    features: FeatureFlags = NO_FEATURES,  # the model's run features (with --plan: only the dispatcher)
    train_iters: Annotated[int | None, typer.Option(help="Training iterations (overrides the plan's).")] = None,
    budget: RunBudgetFlags = NO_RUN_BUDGET,  # --tokens: --train-iters and --save-interval follow from the budget
    # ---- launch
    launcher: Annotated[str, typer.Option(help="torchrun, slurm or primus.")] = "torchrun",
    nodes: Annotated[int | None, typer.Option(help="Nodes to launch (default: the plan's).")] = None,
    data_path: Annotated[str | None, typer.Option(help="Absolute Megatron dataset prefix (no .bin/.idx).")] = None,
    mock_data: Annotated[bool, typer.Option("--mock-data", help="Synthetic data instead of --data-path.")] = False,
    tokenizer_model: Annotated[str | None, typer.Option(help="Absolute tokenizer path or HF model id.")] = None,
    tokenizer_type: Annotated[str | None, typer.Option(help="Megatron tokenizer type (default: inferred).")] = None,
    vocab_file: Annotated[str | None, typer.Option(help="GPT-2 BPE vocab file (absolute).")] = None,
    merge_file: Annotated[str | None, typer.Option(help="GPT-2 BPE merges file (absolute).")] = None,
    save: Annotated[str | None, typer.Option(help="Absolute checkpoint directory (also --load).")] = None,
    load: Annotated[str | None, typer.Option(help="Resume from here (default: --save).")] = None,
    save_interval: Annotated[int | None, typer.Option(help="Iterations between checkpoints.")] = None,
    tensorboard_dir: Annotated[str | None, typer.Option(help="Absolute TensorBoard directory.")] = None,
    entrypoint: Annotated[str, typer.Option(
        help="megatron (pretrain_gpt.py) or megapilot (embedded trainer).")] = "megatron",
    megatron_path: Annotated[str | None, typer.Option(
        help="Absolute Megatron-LM checkout; on this machine, its own arguments.py decides the flags.")] = None,
    megatron_version: Annotated[str | None, typer.Option(
        help="Megatron-LM release the script is for, e.g. 0.14 or core_v0.16.0 (default: the newest table).")] = None,
    python: Annotated[str | None, typer.Option(
        help="Python with torch (default python3; this one for megapilot).")] = None,
    cpu: Annotated[bool, typer.Option(
        "--cpu", help="CPU run (gloo, fp32) for tiny models with the embedded trainer.")] = False,
    container_image: Annotated[str | None, typer.Option(help="pyxis/enroot image (SLURM).")] = None,
    container_mount: Annotated[list[str] | None, typer.Option(help="SRC:DST mount, repeatable (SLURM).")] = None,
    rendezvous: Annotated[str, typer.Option(help="Multi-node torchrun: static or c10d.")] = "static",
    master_port: Annotated[int, typer.Option(help="Rendezvous port.")] = 29611,
    network_interface: Annotated[str | None, typer.Option(help="NCCL/GLOO_SOCKET_IFNAME.")] = None,
    ib_hca: Annotated[str | None, typer.Option(help="NCCL_IB_HCA.")] = None,
    job_name: Annotated[str, typer.Option(help="Job name (SLURM, rendezvous id, Primus experiment).")] = "megapilot",
    time_limit: Annotated[str, typer.Option("--time", help="SLURM time limit.")] = "04:00:00",
    partition: Annotated[str | None, typer.Option(help="SLURM partition.")] = None,
    account: Annotated[str | None, typer.Option(help="SLURM account.")] = None,
    log_dir: Annotated[str | None, typer.Option(help="Absolute log directory (default: next to the script).")] = None,
    primus_path: Annotated[str, typer.Option(help="Absolute Primus checkout.")] = "/workspace/Primus",
    primus_config: Annotated[str | None, typer.Option(help="Where the Primus experiment YAML goes.")] = None,
    remote: Annotated[bool, typer.Option(
        "--remote", help="Drafted for another machine: paths checked for form only, no folder created here.")] = False,
    profile: Annotated[Path | None, typer.Option(help="Profile file (default: the saved user profile).")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the script here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the script and its arguments as JSON.")] = False,
) -> None:
    """Write a checked launch script for a plan (a draft: review it, this command never runs it)."""
    from megapilot.cli.common import load_profile_checked, require_at_most, require_positive
    from megapilot.estimate.cases import cuda_graphs_from
    from megapilot.launch import LaunchOptions, render_launch
    from megapilot.spec.training import MAX_TRAIN_ITERS

    if plan_file is not None and plan is not None and plan_file != plan:
        raise MegapilotError(f"two plans given: {plan_file} and --plan {plan}", field="--plan",
                             fix="give the plan once, as the argument or as --plan")
    plan = plan or plan_file
    user_profile = load_profile_checked(profile)
    if output is not None:
        _check_output(output.expanduser().absolute())  # before the work of rendering, and naming -o
    notes: list[str] = []
    assumed: list[str] = []  # profile values read and layout defaults taken: one line of output, `assumed` in JSON
    if plan is not None:
        from megapilot.cli.common import planned_model

        _refuse_layout_with_plan(layout, features)
        saved = _read_plan(plan)
        model = planned_model(plan, saved)
    else:
        from megapilot.catalog import resolve_model

        saved = _plan_from_flags(user_profile, notes, layout, features, nodes=nodes, assumed=assumed)
        model = resolve_model(str(layout.model)).to_dict()  # what --model became and where from
    if mock_data and data_path is not None:
        raise MegapilotError("--mock-data and --data-path exclude each other", field="--data-path",
                             fix="pass --data-path PREFIX for real data, or --mock-data alone")
    require_positive("--train-iters", train_iters)
    require_at_most("--train-iters", train_iters, MAX_TRAIN_ITERS, "T5: 1 million steps")
    fills = _profile_fills(user_profile, data_path=data_path, mock_data=mock_data,
                           tokenizer_model=tokenizer_model, vocab_file=vocab_file, save=save,
                           tokenizer_type=tokenizer_type)
    train_iters, save_interval = schedule_from_budget(budget, saved, train_iters, save_interval, notes,
                                                      saving=fills["save"] is not None)
    if train_iters is not None:
        saved = saved.model_copy(update={"training": saved.training.model_copy(update={"train_iters": train_iters})})

    assumed += fills.pop("_notes")  # type: ignore[arg-type]  # the fills keep their notes list here
    script_path = str(output.expanduser().absolute()) if output is not None else None
    options = _options(
        LaunchOptions, launcher=_choice("launcher", launcher, LAUNCHERS), nodes=nodes, mock_data=mock_data,
        tokenizer_type=tokenizer_type, merge_file=merge_file, load=load, save_interval=save_interval,
        tensorboard_dir=tensorboard_dir, entrypoint=_choice("entrypoint", entrypoint, ENTRYPOINTS),
        megatron_path=megatron_path, megatron_version=megatron_version,
        python=python or _default_python(entrypoint), cpu=cpu,
        container_image=container_image, container_mounts=tuple(container_mount or ()), rendezvous=rendezvous,
        master_port=master_port, network_interface=network_interface, ib_hca=ib_hca, job_name=job_name,
        time_limit=time_limit, partition=partition, account=account, log_dir=log_dir, primus_path=primus_path,
        primus_config_path=primus_config, script_path=script_path, remote=remote,
        moe_flex_dispatcher=features.moe_flex_dispatcher or saved.moe_flex_dispatcher,
        moe_a2a_overlap=features.moe_a2a_overlap or saved.moe_a2a_overlap,
        cuda_graphs=cuda_graphs_from(features.case_features()) or saved.cuda_graphs, **fills,
    )
    launch = render_launch(saved, options)
    if output is not None and not remote:
        launch = _make_directories(launch)
    launch = launch.model_copy(update={"notes": assumed + notes + launch.notes})
    if output is not None:
        _write(Path(script_path), launch, force)  # type: ignore[arg-type]  # set whenever output is
    if json_output:
        emit_json(launch.to_json() | {"assumed": assumed, "model": model})
        return
    _print_summary(saved, launch, Path(script_path) if script_path else None, assumed, cpu=cpu)


def _default_python(entrypoint: str) -> str:
    """The embedded trainer lives in this installation, so its interpreter runs it; else the image's python3."""
    import sys

    return sys.executable if entrypoint == "megapilot" else "python3"


def _choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise MegapilotError(f"{value!r} is not one of {', '.join(allowed)}", field=field,
                             fix=f"use --{field} {allowed[0]}")
    return value


def _refuse_layout_with_plan(layout: LayoutFlags, features: FeatureFlags) -> None:
    """A plan file fixes the model, hardware and layout; a layout flag beside it would be silently ignored. The MoE
    dispatcher and the all-to-all overlap are launch choices: given, they replace the plan's."""
    given = layout.given() + features.model_changes()
    if given:
        flags = ", ".join(given)
        raise MegapilotError(f"{flags} cannot change a saved plan", field="--plan",
                             fix=f"drop {flags}, or drop --plan and give the layout as flags "
                                 "(or re-plan with `megapilot plan ... --save`)")


def _options(cls: type[LaunchOptions], **fields: object) -> LaunchOptions:
    from pydantic import ValidationError

    from megapilot.cli.common import validation_error

    try:
        return cls.model_validate(fields)
    except ValidationError as exc:
        flags = {"time_limit": "--time", "container_mounts": "--container-mount",
                 "primus_config_path": "--primus-config", "script_path": "--output"}
        raise validation_error(exc, flags={name: flags.get(name, "--" + name.replace("_", "-"))
                                           for name in cls.model_fields}) from None


# ---- where the plan comes from -----------------------------------------------------------------
def _read_plan(path: Path) -> SavedPlan:
    from megapilot.cli.common import load_plan_file

    return load_plan_file(path)


def _plan_from_flags(profile: Profile, notes: list[str], given: LayoutFlags, features: FeatureFlags,
                     nodes: int | None, assumed: list[str]) -> SavedPlan:
    """Layout flags -> specs through `build_case`, as `megapilot estimate` resolves them.

    Only what estimate has no notion of is filled here: the GPU and its count from the saved
    profile (noted), and `--nodes N` as N x GPUs per node.
    """
    from megapilot.cli.estimate_cmd import defaults_assumed
    from megapilot.estimate import CaseFlags, case_from
    from megapilot.spec import SavedPlan, validate_layout

    if given.model is None:
        raise MegapilotError("no plan given", field="plan", fix="pass --plan plan.json or --model NAME with a layout")
    layout = given.case_flags() | features.case_flags()
    for name in ("gpu", "gpus_per_node"):
        if layout[name] is None:
            layout[name] = _from_profile(profile, name, assumed)
    if layout["gpus"] is None and nodes:
        per_node = layout["gpus_per_node"]
        layout["gpus"] = nodes * (per_node if isinstance(per_node, int) and per_node else
                                  _default_gpus_per_node(layout["gpu"]))
    if layout["gpus"] is None:
        layout["gpus"] = _from_profile(profile, "gpus", assumed)
    flags = CaseFlags.parse(layout)
    case = case_from(flags)
    assumed += defaults_assumed(flags, case)
    notes += validate_layout(case.model, case.cluster, case.training, case.parallel)
    return SavedPlan(model=case.model, cluster=case.cluster, training=case.training, parallel=case.parallel,
                     moe_flex_dispatcher=features.moe_flex_dispatcher,  # type: ignore[arg-type]  # build_case checked it
                     moe_a2a_overlap=features.moe_a2a_overlap, cuda_graphs=case.options.cuda_graphs)


def _default_gpus_per_node(gpu: object) -> int:
    """The node size build_case picks for this GPU (8; 4 on GB200/GB300 trays)."""
    if gpu is None:
        return 8
    from megapilot.catalog.gpus import get_gpu
    from megapilot.spec.hardware import default_gpus_per_node

    return default_gpus_per_node(get_gpu(str(gpu)))


def _from_profile(profile: Profile, field: str, notes: list[str]) -> object:
    value = getattr(profile, field, None)
    if value is not None:
        notes.append(profile.default_note(field))
    return value


def _profile_fills(profile: Profile, *, data_path: str | None, mock_data: bool, tokenizer_model: str | None,
                   vocab_file: str | None, save: str | None, tokenizer_type: str | None = None) -> dict[str, object]:
    """Data, tokenizer and checkpoint paths: flags first, then the saved profile (noted). A tokenizer type that
    reads no model file (ByteTokenizer, NullTokenizer, GPT-2 BPE) takes none from the profile."""
    from megapilot.launch.options import TOKENIZERS_WITHOUT_MODEL

    notes: list[str] = []
    if data_path is None and not mock_data:
        data_path = _from_profile(profile, "data_path", notes)  # type: ignore[assignment]  # the profile's str | None
    if tokenizer_model is None and vocab_file is None and not (mock_data and data_path is None) \
            and tokenizer_type not in TOKENIZERS_WITHOUT_MODEL:
        tokenizer_model = _from_profile(profile, "tokenizer", notes)  # type: ignore[assignment]  # the profile's str | None
    if save is None:
        save = _from_profile(profile, "save_dir", notes)  # type: ignore[assignment]  # the profile's str | None
    return {"data_path": data_path, "tokenizer_model": tokenizer_model, "vocab_file": vocab_file,
            "save": save, "_notes": notes}


# ---- output ------------------------------------------------------------------------------------
def _check_output(path: Path) -> None:
    """-o must name a file in an existing directory."""
    if path.is_dir():
        raise MegapilotError(f"{path} is a directory", field="--output",
                             fix=f"name the script file, e.g. -o {path / 'train.sh'}")
    if path.parent.exists() and not path.parent.is_dir():
        raise MegapilotError(f"{path.parent} is a file, not a directory", field="--output",
                             fix="choose a path in an existing directory")
    if not path.parent.exists():
        raise MegapilotError(f"directory {path.parent} does not exist", field="--output",
                             fix=f"create it first (mkdir -p {path.parent}) or choose another -o path")


def _make_directories(launch: LaunchScript) -> LaunchScript:
    """Create the folders the launch needs before it starts (SLURM opens its --output file before the
    script runs), with the script it is written beside; say so in the notes."""
    for directory in launch.directories:
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MegapilotError(f"cannot create {directory} ({exc.strerror or exc})", field="--log-dir",
                                 fix="pass a writable --log-dir, or --remote when drafting for another machine") \
                from None
    created = [f"created {directory} for the job's logs" for directory in launch.directories]
    return launch.model_copy(update={"notes": launch.notes + created})


def _write(path: Path, launch: LaunchScript, force: bool) -> None:
    _check_output(path)
    targets = [path, *(Path(p) for p in launch.files)]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not force:
        raise MegapilotError(f"{', '.join(existing)} already exists", field="--output",
                             fix="choose another -o path or pass --force to overwrite")
    try:
        path.write_text(launch.script)
        path.chmod(0o755)
        for extra, text in launch.files.items():
            Path(extra).parent.mkdir(parents=True, exist_ok=True)
            Path(extra).write_text(text)
    except OSError as exc:
        raise MegapilotError(f"cannot write {exc.filename or path} ({exc.strerror or exc})", field="--output",
                             fix="choose a writable -o path") from None


def _print_summary(plan: SavedPlan, launch: LaunchScript, path: Path | None, assumed: list[str], *,
                   cpu: bool) -> None:
    from rich.table import Table

    if path is None:  # the script itself goes to stdout untouched (`megapilot script ... > train.sh`)
        import sys

        sys.stdout.write(launch.script)
        sys.stdout.flush()
    p = plan.parallel
    table = Table(title=f"launch script: {plan.model.name}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("launcher", launch.launcher)
    if cpu:  # the plan carries a stand-in GPU; what runs is CPU ranks, as the script's header says
        table.add_row("ranks", f"{launch.nodes} node(s) x {launch.gpus_per_node} CPU ranks")
    else:
        table.add_row("GPUs", f"{launch.nodes} node(s) x {launch.gpus_per_node} {plan.cluster.gpu.name}")
    table.add_row("layout", p.shell_block(plan.training.global_batch_size))
    table.add_row("Megatron args", f"{sum(a.startswith('--') for a in launch.megatron_args)} flags, "
                                   f"checked against Megatron-LM {launch.megatron_release}")
    table.add_row("environment", ", ".join(launch.env))
    for extra in launch.files:
        table.add_row("also wrote" if path else "experiment file", extra)
    if path is not None:
        table.add_row("script", str(path))
    err_console.print(table) if path is None else console.print(table)
    for note in launch.notes:
        if note not in assumed:  # those are stated on the one `assumed:` line below
            (err_console if path is None else console).print(f"note: {note}", highlight=False)
    target = str(path) if path else "train.sh"
    # `megapilot run` executes locally; an sbatch script is meant for the SLURM controller.
    run_hint = (f"`sbatch {target}`" if launch.launcher == "slurm"
                else f"`megapilot run {target}` or bash {target} on each node")
    save_hint = "" if path else "save it (`megapilot script ... > train.sh` or -o train.sh), "
    (err_console if path is None else console).print(f"{save_hint}review, then run with {run_hint}", highlight=False)
    print_assumptions(assumed)


def register(app: typer.Typer) -> None:
    """Add `megapilot script`."""
    app.command("script")(script)
