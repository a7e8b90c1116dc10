"""render_launch: a saved plan + launch options -> a checked launch script.

Order matters: every check runs before any text is produced, so a script that comes back is one
whose paths are absolute (and present for local launches), whose flags exist in the pinned
Megatron-LM, whose flag combinations Megatron accepts and whose layout fills the GPUs launched.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from megapilot.errors import MegapilotError
from megapilot.launch import heterogeneous
from megapilot.launch.checks import (
    check_absolute_path,
    check_environment,
    check_megatron_args,
    check_no_placeholder,
    check_world,
)
from megapilot.launch.environment import launch_environment
from megapilot.launch.flags import argument_notes, megatron_arg_sections
from megapilot.launch.megatron_args import SCRIPT_RELEASE_NAMES, ReleaseNames
from megapilot.launch.options import LaunchOptions, LaunchScript
from megapilot.launch.perf_flags import a2a_overlap_note, cuda_graphs_note, slurm_time_limit_minutes
from megapilot.launch.primus import primus_experiment, render_primus
from megapilot.launch.sections import ArgSection
from megapilot.launch.shell import q, write_file
from megapilot.launch.slurm import render_sbatch
from megapilot.launch.torchrun import render_torchrun
from megapilot.launch.versions import adapt_sections, resolve_flag_table, target_release
from megapilot.spec import SavedPlan

# Values sbatch reads from `#SBATCH` lines itself (no shell quoting possible there).
_SBATCH_SAFE = re.compile(r"^[A-Za-z0-9._%/:=@+,-]+$")
# A free-form option: one word, `-x` or `--name[=value]`; constraints may use & | [ ] ( ) * ! (sbatch reads them).
_SBATCH_OPTION = re.compile(r"^--?[A-Za-z][A-Za-z0-9-]*(?:=[A-Za-z0-9._%/:=@+,&|\[\]()*!-]+)?$")
# Flags that pick a GPU kernel rather than change the model; the embedded CPU trainer has no such kernels.
_GPU_KERNEL_FLAGS = frozenset({"--moe-grouped-gemm"})


def render_launch(plan: SavedPlan, options: LaunchOptions, names: ReleaseNames = SCRIPT_RELEASE_NAMES) -> LaunchScript:
    """Render the launch script (and Primus experiment file) for `plan`; raise MegapilotError if unsafe. `names`: how
    the command takes the release, the checkout and the entry point, as the fixes of errors about them say."""
    nodes = options.nodes or plan.cluster.num_nodes
    gpus_per_node = plan.cluster.gpus_per_node
    check_world(plan.parallel, nodes, gpus_per_node)
    _check_options(options, nodes, names)
    notes = _defaults_taken(options) + _placeholder_notes(plan, options)
    if options.cpu:
        notes += _cpu_notes(plan, options)
    elif options.entrypoint == "megapilot":
        notes.append("embedded trainer: the GPU kernel flags (TP overlap, fused cross entropy and permute, FP8 "
                     "param gather, ...) are left out; it implements none of them")
    if options.remote:
        notes.append("drafted for another machine (--remote): paths were checked for form only, not for existence "
                     "here, and no directory was created here")

    for note in (a2a_overlap_note(plan, options), cuda_graphs_note(options)):
        if note is not None:
            notes.append(note)
    if plan.training.uses_muon:
        notes.append(f"--optimizer {plan.training.optimizer} needs the emerging_optimizers package in the image "
                     "(Megatron-LM imports its Newton-Schulz from there); it cannot be checked from here")
    if options.launcher == "primus" and plan.cluster.gpu.vendor != "AMD":
        notes.append(f"Primus targets AMD Instinct GPUs (ROCm images); this plan is for {plan.cluster.gpu.name}")

    table = resolve_flag_table(options, names)
    sections = _sections_for_entrypoint(megatron_arg_sections(plan, options, table), options)
    notes += adapt_sections(sections, table)
    notes += argument_notes(plan, table, target_release(options, table))
    megatron_args = [token for section in sections for token in section.args]
    check_megatron_args(megatron_args, plan.cluster.gpu, table)
    if options.entrypoint == "megapilot":
        _check_trainer_accepts(megatron_args, gpu_available=not options.cpu, names=names)

    env = launch_environment(plan, options)
    check_environment(megatron_args, {v.name: None if v.unset else v.value for v in env}, plan.cluster.gpu,
                      cpu=options.cpu, table=table)
    files = _model_files(plan, options)  # written by the script itself too (every node runs it)
    prelude = [line for path, text in files.items()
               for line in [heterogeneous.COMMENT, *write_file(q(path), text, heterogeneous.HEREDOC_END), ""]]
    directories: list[str] = []
    if options.launcher == "torchrun":
        script = render_torchrun(plan, options, nodes, env, sections, prelude)
    elif options.launcher == "slurm":
        log_dir = _log_dir(options)
        script = render_sbatch(plan, options, nodes, env, sections, log_dir, prelude)
        directories.append(log_dir)
        notes.append(_slurm_log_note(log_dir, options))
    else:
        config_path = _primus_config_path(options)
        experiment = primus_experiment(plan, megatron_args, options.model_copy(update={"log_dir": _log_dir(options)}))
        files[config_path] = experiment
        script = render_primus(plan, options, nodes, env, experiment, config_path, prelude)
    check_no_placeholder("script", script)
    script = _allow_literal_dollars(script, megatron_args)
    return LaunchScript(
        script=script, launcher=options.launcher, megatron_args=megatron_args,
        env={var.name: var.value for var in env if not var.unset}, nodes=nodes, gpus_per_node=gpus_per_node,
        files=files, directories=directories, notes=notes, megatron_release=table.label(),
    )


def _model_files(plan: SavedPlan, options: LaunchOptions) -> dict[str, str]:
    """Files the model needs beside its flags: a model of per-layer shapes, its block configs."""
    if plan.model.layer_blocks is None:
        return {}
    return {heterogeneous.layer_config_path(options.script_path): heterogeneous.layer_config_json(plan.model)}


# ---- option checks -------------------------------------------------------------------------
def _check_options(o: LaunchOptions, nodes: int, names: ReleaseNames) -> None:
    local = _paths_checked_here(o, nodes)
    if o.data_path is not None:
        check_absolute_path("data_path", o.data_path, must_exist=local, kind="prefix")
    if o.tokenizer_model is not None and _is_path(o.tokenizer_model):
        check_absolute_path("tokenizer_model", o.tokenizer_model, must_exist=local)
    elif o.tokenizer_model is not None:
        check_no_placeholder("tokenizer_model", o.tokenizer_model)
    for field in ("vocab_file", "merge_file"):
        if getattr(o, field) is not None:
            check_absolute_path(field, getattr(o, field), must_exist=local, kind="file")
    for field in ("save", "tensorboard_dir", "log_dir", "script_path", "primus_config_path", "data_cache_path"):
        if getattr(o, field) is not None:
            check_absolute_path(field, getattr(o, field), must_exist=local, kind="parent")
    if o.load is not None:
        check_absolute_path("load", o.load, must_exist=local, kind="dir")
    _check_entrypoint(o, local, names)
    if o.launcher == "primus":
        check_absolute_path("primus_path", o.primus_path, must_exist=False)
    _check_container(o)
    _check_sbatch_values(o)
    for field in ("job_name", "network_interface", "ib_hca", "split"):
        if getattr(o, field) is not None:
            check_no_placeholder(field, getattr(o, field))


def _paths_checked_here(o: LaunchOptions, nodes: int) -> bool:
    """Do input paths have to exist on this machine? Never for --remote; else as asked, else for a
    single-node torchrun launch (the one launch that surely runs where it is drafted)."""
    if o.remote:
        return False
    if o.check_paths_exist is not None:
        return o.check_paths_exist
    return o.launcher == "torchrun" and nodes == 1


def _slurm_log_note(log_dir: str, o: LaunchOptions) -> str:
    where = f"SLURM writes each job's output to {log_dir}/%x-%j.out (%x = job name {o.job_name}, %j = job id)"
    if o.remote:
        return f"{where}; create {log_dir} on the cluster before sbatch (SLURM opens the file before the script runs)"
    return f"{where}; the folder must exist before sbatch (`megapilot script -o` creates it with the script)"


def _is_path(value: str) -> bool:
    """A tokenizer given as a path (vs. a Hugging Face id such as meta-llama/Llama-3.1-8B)."""
    return value.startswith(("/", ".", "~")) or value.endswith((".model", ".json"))


def _check_entrypoint(o: LaunchOptions, local: bool, names: ReleaseNames) -> None:
    if "/" in o.python:
        check_absolute_path("python", o.python, must_exist=local, kind="file")
    else:
        check_no_placeholder("python", o.python)
    if o.entrypoint == "megapilot" or o.launcher == "primus":
        return
    if o.megatron_path is None:
        raise MegapilotError("the megatron entry point needs the Megatron-LM checkout", field="megatron_path",
                             fix=names.no_checkout)
    check_absolute_path("megatron_path", o.megatron_path, must_exist=local, kind="dir")
    if local:
        check_absolute_path("megatron_path", o.megatron_path.rstrip("/") + "/pretrain_gpt.py",
                            must_exist=True, kind="file")


def _check_container(o: LaunchOptions) -> None:
    if o.container_mounts and not o.container_image:
        raise MegapilotError("container mounts without a container image", field="container_mounts",
                             fix="pass --container-image too, or drop the mounts")
    if o.container_image:
        check_no_placeholder("container_image", o.container_image)
        if any(ch.isspace() or ch in ",'\"$`" for ch in o.container_image):
            raise MegapilotError(f"{o.container_image!r} is not an image reference", field="container_image",
                                 fix="use registry/name:tag (or an absolute .sqsh path)")
    for mount in o.container_mounts:
        source, _, target = mount.partition(":")
        if not target or "," in mount:
            raise MegapilotError(f"{mount!r} is not SRC:DST", field="container_mounts",
                                 fix="give each mount as /abs/src:/abs/dst")
        check_absolute_path("container_mounts", source, must_exist=False)
        check_absolute_path("container_mounts", target.split(":")[0], must_exist=False)


def _check_sbatch_values(o: LaunchOptions) -> None:
    if o.launcher != "slurm":
        return
    for field in ("job_name", "time_limit", "partition", "account", "log_dir"):
        value = getattr(o, field)
        if value is not None and not _SBATCH_SAFE.match(value):
            raise MegapilotError(
                f"{value!r} cannot go on an #SBATCH line (sbatch does not read shell quoting)",
                field=field, fix="use letters, digits and . _ - / : only",
            )
    for option in o.sbatch_options:
        if not _SBATCH_OPTION.match(option):
            raise MegapilotError(
                f"{option!r} cannot go on an #SBATCH line (one option as sbatch takes it, no spaces or quotes)",
                field="sbatch_options", fix="write each as --name=value, e.g. --qos=high or --constraint=a100",
            )
    slurm_time_limit_minutes(o.time_limit)  # sbatch refuses a malformed --time only when the job is submitted
    if o.log_dir is None and o.script_path is None:
        raise MegapilotError("an sbatch script needs a directory for its output", field="log_dir",
                             fix="pass --log-dir /abs/dir or -o /abs/train.sbatch")
    if o.log_dir is None and not _SBATCH_SAFE.match(_log_dir(o)):
        # the output goes next to the script, whose folder may hold what an #SBATCH line cannot
        raise MegapilotError(
            f"the output folder next to the script, {_log_dir(o)!r}, cannot go on an #SBATCH line "
            "(sbatch does not read shell quoting)", field="log_dir",
            fix="pass --log-dir with letters, digits and . _ - / : only",
        )


# ---- derived values ------------------------------------------------------------------------
def _log_dir(o: LaunchOptions) -> str:
    if o.log_dir:
        return o.log_dir.rstrip("/")
    anchor = o.script_path or o.primus_config_path
    if anchor:
        return str(PurePosixPath(anchor).parent / "logs")
    return "/tmp/megapilot-logs"


def _primus_config_path(o: LaunchOptions) -> str:
    if o.primus_config_path:
        return o.primus_config_path
    if o.script_path:
        return str(PurePosixPath(o.script_path).with_suffix(".primus.yaml"))
    raise MegapilotError("the Primus experiment file needs a place", field="primus_config_path",
                         fix="pass -o /abs/train.sh (the YAML goes next to it) or --primus-config /abs/exp.yaml")


def _allow_literal_dollars(script: str, megatron_args: list[str]) -> str:
    """Tell shellcheck that single-quoted `$`/backticks in user values are meant literally (SC2016)."""
    if not any("$" in a or "`" in a for a in megatron_args):
        return script
    shebang, rest = script.split("\n", 1)
    return f"{shebang}\n# shellcheck disable=SC2016  # quoted values hold a literal $ or backtick on purpose\n{rest}"


def _defaults_taken(o: LaunchOptions) -> list[str]:
    notes = []
    if o.save and not o.load:
        notes.append(f"--load defaults to the --save directory ({o.save}): a requeued job resumes")
    if o.save and not o.tensorboard_dir:
        notes.append(f"TensorBoard logs go to {o.save.rstrip('/')}/tensorboard")
    if not o.save:
        notes.append("no --save directory: this run writes no checkpoints")
    if o.tokenizer_type == "ByteTokenizer":
        notes.append("byte tokenizer: the embedding has the byte vocabulary (256 + end-of-document), "
                     "not the plan's vocabulary size")
    return notes


def _placeholder_notes(plan: SavedPlan, o: LaunchOptions) -> list[str]:
    """Schedule values still at the drafting defaults: right for a smoke test, wrong for a real run.

    A value equal to TrainingSpec's default is named even if it was typed: the script cannot tell, and
    saying so once costs less than a production run that stops after 100 iterations.
    """
    t, defaults = plan.training, type(plan.training).model_fields
    placeholders = [f"{flag} {getattr(t, field)}" for flag, field in (("--train-iters", "train_iters"),
                                                                      ("--lr-warmup-iters", "lr_warmup_iters"))
                    if getattr(t, field) == defaults[field].default]
    if o.save and not o.save_interval:
        placeholders.append(f"--save-interval {t.train_iters} (= --train-iters: one checkpoint, at the end)")
    if not placeholders:
        return []
    return [f"placeholders for a real run's schedule, set them for your token budget: {', '.join(placeholders)}"]


def _sections_for_entrypoint(sections: list[ArgSection], o: LaunchOptions) -> list[ArgSection]:
    if o.entrypoint != "megapilot":
        return sections
    return [ArgSection(s.title, [a for a in s.args if a not in _GPU_KERNEL_FLAGS]) for s in sections]


def _check_trainer_accepts(megatron_args: list[str], *, gpu_available: bool, names: ReleaseNames) -> None:
    """The embedded trainer takes a subset of pretrain_gpt.py's flags; refuse the rest up front, then let
    the trainer's own argument check (torch-free) judge the combination, as it will at start-up."""
    # Imported here: only the embedded-trainer entry point needs the trainer's (torch-free) flag table.
    from megapilot.trainer.args import FLAGS
    from megapilot.trainer.config import build_config

    accepted = {f.name for f in FLAGS}
    refused = [a for a in megatron_args if a.startswith("--") and a not in accepted]
    if refused:
        raise MegapilotError(
            f"the embedded trainer does not implement {', '.join(refused)}", field="entrypoint",
            fix=f"{names.megatron_entrypoint} for this model",
        )
    try:
        build_config(megatron_args, gpu_available=gpu_available)
    except MegapilotError as exc:
        raise MegapilotError(f"the embedded trainer would refuse this script: {exc.problem}", field=exc.field,
                             fix=exc.fix) from None


def _cpu_notes(plan: SavedPlan, options: LaunchOptions) -> list[str]:
    """Refuse what cannot run on CPUs at all; say what a CPU render changes from the plan."""
    if options.launcher == "primus":
        raise MegapilotError("Primus runs on AMD GPUs only", field="cpu",
                             fix="use --launcher torchrun (or slurm) with --cpu")
    p = plan.parallel
    if p.cp > 1:
        raise MegapilotError(
            f"context parallelism (CP={p.cp}) needs a GPU: Megatron-Core runs it only in Transformer Engine's "
            "attention", field="cp", fix="use a layout with --cp 1 for a CPU run, or render for GPUs (no --cpu)")
    notes = [f"CPU run: fp32 compute over gloo instead of {plan.training.precision} on GPUs",
             ("CPU run: the GPU performance flags (TP overlap, fused kernels, FP8 param gather, manual GC, "
              "collective timeout) are left out")]
    if p.sequence_parallel:
        notes.append("CPU run: sequence parallelism left out (torch's LayerNorm/RMSNorm, used without "
                     "Transformer Engine, refuse it); activations are not split over TP ranks")
    if plan.model.moe is not None:
        notes.append("CPU run: MoE tokens dispatched with allgather (the alltoall dispatcher needs CUDA streams)")
    return notes
