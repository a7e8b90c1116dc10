"""The launch script of the collective-bandwidth probe: nccl-tests / rccl-tests binaries, or megapilot's
torch.distributed probe (`-m megapilot.trainer.collectives`), started the way a training job of the same suite is
(torchrun per node, or an sbatch script with one srun torchrun per node), with no training flags.

Each nccl-tests binary is preceded by a `#  collective <name>[@scope]  ranks N  nodes M` line, the probe's own
section header, so that one reader (megapilot.logs.collectives) knows which collective and scope every table is.
"""

from __future__ import annotations

from dataclasses import dataclass

from megapilot.launch.options import LaunchOptions
from megapilot.launch.shell import bash_array, q, strict_mode
from megapilot.launch.slurm import sbatch_directives
from megapilot.launch.torchrun import torchrun_args

PROBE_MODULE = "megapilot.trainer.collectives"
# nccl-tests' binary of each collective (rccl-tests uses the same names).
NCCL_TESTS_BINARIES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
                       "reduce_scatter": "reduce_scatter_perf", "alltoall": "alltoall_perf",
                       "sendrecv": "sendrecv_perf"}


@dataclass(frozen=True)
class ProbeSweep:
    """What to measure: the collectives, the message sizes (doubling from min to max) and the timed calls."""

    ops: tuple[str, ...]
    min_bytes: int
    max_bytes: int
    iters: int
    warmup: int = 5


def probe_argv(sweep: ProbeSweep) -> list[str]:
    """megapilot's torch.distributed probe's arguments (`-m megapilot.trainer.collectives ...`)."""
    return ["-m", PROBE_MODULE, "--collectives", ",".join(sweep.ops), "-b", str(sweep.min_bytes),
            "-e", str(sweep.max_bytes), "-f", "2", "-n", str(sweep.iters), "-w", str(sweep.warmup)]


def render_probe_script(options: LaunchOptions, nodes: int, ranks_per_node: int, sweep: ProbeSweep, *,
                        nccl_tests: bool) -> str:
    """The whole script: torchrun (or nccl-tests' binaries) on every node, under sbatch when the launcher is SLURM.
    nccl-tests without SLURM runs on one node only (across nodes it needs MPI's launcher; the caller uses the torch
    probe there)."""
    slurm = options.launcher == "slurm"
    what = "nccl-tests / rccl-tests" if nccl_tests else "megapilot's torch.distributed probe"
    lines = ["#!/usr/bin/env bash"]
    if slurm:
        lines += sbatch_directives(nodes, ranks_per_node, options, options.log_dir or ".")
    lines += [f"# Collective bus bandwidth with {what}: {nodes} node(s) x {ranks_per_node} rank(s).",
              "# Drafted by megapilot's collectives stage."] + strict_mode()
    if nccl_tests:
        lines += _nccl_tests_slurm(nodes, ranks_per_node, sweep) if slurm else \
            _nccl_tests_one_node(ranks_per_node, sweep)
        return "\n".join(lines) + "\n"
    python = [q(options.python), "-m", "torch.distributed.run", '"${TORCHRUN_ARGS[@]}"',
              *(q(word) for word in probe_argv(sweep))]
    if slurm:
        lines += ['MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                  f"MASTER_PORT={options.master_port}", "export MASTER_ADDR MASTER_PORT", ""]
        torchrun = ["--nnodes", '"$SLURM_NNODES"', "--nproc-per-node", str(ranks_per_node), "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", '"$MASTER_ADDR:$MASTER_PORT"', "--rdzv-id", '"$SLURM_JOB_ID"']
        raw = frozenset({'"$SLURM_NNODES"', '"$MASTER_ADDR:$MASTER_PORT"', '"$SLURM_JOB_ID"'})
        lines += bash_array("TORCHRUN_ARGS", torchrun, raw=raw) + [""]
        srun = ["--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        if options.container_image:
            srun.append(f"--container-image={options.container_image}")
        lines.append("srun " + " ".join(q(word) for word in srun) + " " + " ".join(python))
        return "\n".join(lines) + "\n"
    if nodes > 1:
        lines += [': "${NODE_RANK:?set NODE_RANK to the index of this node}"',
                  ': "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"', ""]
    words, raw = torchrun_args(nodes, ranks_per_node, options)
    lines += bash_array("TORCHRUN_ARGS", words, raw=raw) + [""]
    lines.append("exec " + " ".join(python))
    return "\n".join(lines) + "\n"


def _perf(binary: str, sweep: ProbeSweep, gpus_per_process: int) -> str:
    """One nccl-tests binary over the sweep, sizes doubling (`-f 2`), as nccl-tests' README runs them."""
    return (f"{binary} -b {sweep.min_bytes} -e {sweep.max_bytes} -f 2 -g {gpus_per_process} -n {sweep.iters} "
            f"-w {sweep.warmup}")


def _nccl_tests_one_node(gpus: int, sweep: ProbeSweep) -> list[str]:
    """One process driving every GPU of the node (`-g`): nccl-tests needs no MPI for that."""
    lines = []
    for op in sweep.ops:
        header = f"#  collective {op}  ranks {gpus}  nodes 1"
        lines += [f"echo {q(header)}", _perf(NCCL_TESTS_BINARIES[op], sweep, gpus)]
    return lines


def _nccl_tests_slurm(nodes: int, gpus: int, sweep: ProbeSweep) -> list[str]:
    """One task per GPU under srun (nccl-tests built with MPI): every collective over the whole allocation, then
    all-reduce on each node's own GPUs and send/recv between every pair of nodes, for the bisection."""
    largest = ProbeSweep(("all_reduce",), sweep.max_bytes, sweep.max_bytes, sweep.iters, sweep.warmup)
    lines = ['HOSTS=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))', ""]
    for op in sweep.ops:
        lines += [f"echo {q(f'#  collective {op}  ranks {nodes * gpus}  nodes {nodes}')}",
                  f"srun --nodes={nodes} --ntasks-per-node={gpus} {_perf(NCCL_TESTS_BINARIES[op], sweep, 1)}"]
    if nodes > 1:
        node_run = _perf("all_reduce_perf", largest, 1)
        pair_run = _perf("sendrecv_perf", largest, 1)
        lines += [
            "",
            "# ---- bisection: each node's own GPUs, then the first GPU of every pair of nodes",
            'for k in "${!HOSTS[@]}"; do',
            f'  echo "#  collective all_reduce@node$k  ranks {gpus}  nodes 1"',
            f'  srun --nodes=1 --ntasks-per-node={gpus} --nodelist="${{HOSTS[$k]}}" {node_run}',
            "done",
            'for i in "${!HOSTS[@]}"; do',
            '  for ((j = i + 1; j < ${#HOSTS[@]}; j++)); do',
            '    echo "#  collective sendrecv@node$i-node$j  ranks 2  nodes 2"',
            f'    srun --nodes=2 --ntasks-per-node=1 --nodelist="${{HOSTS[$i]}},${{HOSTS[$j]}}" {pair_run}',
            "  done",
            "done",
        ]
    return lines


__all__ = ["NCCL_TESTS_BINARIES", "PROBE_MODULE", "ProbeSweep", "probe_argv", "render_probe_script"]
