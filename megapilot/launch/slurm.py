"""The SLURM launcher: an sbatch script that starts one torchrun per node with `srun`.

`#SBATCH` lines are read by sbatch itself, not by the shell, so their values cannot be quoted; they
are restricted to characters that need no quoting (checked in render.py).
"""

from __future__ import annotations

import math

from megapilot.launch.environment import EnvVar
from megapilot.launch.options import LaunchOptions
from megapilot.launch.sections import ArgSection
from megapilot.launch.shell import bash_array, env_block, header, megatron_args_array, q, strict_mode
from megapilot.launch.torchrun import entrypoint_words
from megapilot.launch.versions import resolve_flag_table
from megapilot.spec import SavedPlan


def sbatch_directives(nodes: int, gpus_per_node: int, options: LaunchOptions, log_dir: str) -> list[str]:
    """What the job asks SLURM for: GPUs the way the cluster takes them, or for CPU ranks CPUs and memory."""
    lines = [
        f"#SBATCH --job-name={options.job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if options.cpu:
        # One task per node runs torchrun, which starts a rank per CPU asked for.
        lines.append(f"#SBATCH --cpus-per-task={gpus_per_node}")
        if options.cpu_memory_gib is not None:
            lines.append(f"#SBATCH --mem={math.ceil(options.cpu_memory_gib)}G")
    elif options.gpu_request == "gres":
        lines.append(f"#SBATCH --gres=gpu:{gpus_per_node}")
    elif options.gpu_request == "gpus-per-node":
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    if options.exclusive:
        lines.append("#SBATCH --exclusive")
    lines += [
        f"#SBATCH --time={options.time_limit}",
        f"#SBATCH --output={log_dir}/%x-%j.out",
    ]
    if options.partition:
        lines.append(f"#SBATCH --partition={options.partition}")
    if options.account:
        lines.append(f"#SBATCH --account={options.account}")
    lines += [f"#SBATCH {option}" for option in options.sbatch_options]
    return lines


def render_sbatch(plan: SavedPlan, options: LaunchOptions, nodes: int, env: list[EnvVar],
                  sections: list[ArgSection], log_dir: str, prelude: list[str] | None = None) -> str:
    """The sbatch script; `prelude`: shell lines run before the launch (files the model needs, written on the
    batch host, which shares the script's directory with the nodes)."""
    gpus = plan.cluster.gpus_per_node
    head = header(plan, nodes, "SLURM sbatch launch", release=resolve_flag_table(options).label(), cpu=options.cpu)
    lines = [head[0], *sbatch_directives(nodes, gpus, options, log_dir), *head[1:]] + strict_mode()
    lines += env_block(env) + (prelude or [])
    lines += [
        "# ---- rendezvous: the first node of the allocation hosts it; one torchrun per node joins",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT={options.master_port}",
        "export MASTER_ADDR MASTER_PORT",
        "",
    ]
    torchrun = ["--nnodes", '"$SLURM_NNODES"', "--nproc-per-node", str(gpus), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", '"$MASTER_ADDR:$MASTER_PORT"', "--rdzv-id", '"$SLURM_JOB_ID"']
    raw = frozenset({'"$SLURM_NNODES"', '"$MASTER_ADDR:$MASTER_PORT"', '"$SLURM_JOB_ID"'})
    lines += bash_array("TORCHRUN_ARGS", torchrun, raw=raw) + [""]
    lines += megatron_args_array(sections) + [""]
    lines += bash_array("SRUN_ARGS", _srun_args(options)) + [""]
    command = ["srun", '"${SRUN_ARGS[@]}"', q(options.python), "-m", "torch.distributed.run",
               '"${TORCHRUN_ARGS[@]}"', *entrypoint_words(options, plan.model), '"${MEGATRON_ARGS[@]}"']
    lines.append(" ".join(command))
    return "\n".join(lines) + "\n"


def _srun_args(options: LaunchOptions) -> list[str]:
    # One task per node; a failing rank ends the whole step instead of leaving the others hung.
    args = ["--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if options.container_image:
        args.append(f"--container-image={options.container_image}")
        if options.container_mounts:
            args.append("--container-mounts=" + ",".join(options.container_mounts))
    return args
