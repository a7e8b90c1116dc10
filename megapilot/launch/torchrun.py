"""The torchrun launcher: one script per node; single node, or multi-node with static ranks or c10d."""

from __future__ import annotations

from megapilot.launch.environment import EnvVar
from megapilot.launch.model_flags import training_script
from megapilot.launch.options import LaunchOptions
from megapilot.launch.sections import ArgSection
from megapilot.launch.shell import (
    bash_array,
    env_block,
    header,
    megatron_args_array,
    q,
    strict_mode,
)
from megapilot.launch.versions import resolve_flag_table
from megapilot.spec import ModelSpec, SavedPlan

# The module torchrun starts for the embedded trainer (`--entrypoint megapilot`); a script that runs it is read with
# the trainer's own defaults (its byte tokenizer).
EMBEDDED_TRAINER_MODULE = "megapilot.trainer"


def entrypoint_words(options: LaunchOptions, model: ModelSpec | None = None) -> list[str]:
    """What torchrun starts on every rank: Megatron-LM's pretrain_gpt.py (pretrain_mamba.py for a hybrid
    Mamba model) or the embedded trainer."""
    if options.entrypoint == "megapilot":
        return ["-m", EMBEDDED_TRAINER_MODULE]
    assert options.megatron_path is not None  # checked before rendering
    script = training_script(model) if model is not None else "pretrain_gpt.py"
    return [q(options.megatron_path.rstrip("/") + "/" + script)]


def torchrun_args(nodes: int, gpus_per_node: int, options: LaunchOptions) -> tuple[list[str], frozenset[str]]:
    """torchrun's own arguments; the second item lists words that are shell expansions, not literals."""
    if nodes == 1:
        # --standalone: a private rendezvous on a free local port, so concurrent jobs never collide.
        return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(gpus_per_node)], frozenset()
    common = ["--nnodes", str(nodes), "--nproc-per-node", str(gpus_per_node)]
    if options.rendezvous == "c10d":
        endpoint = f'"$MASTER_ADDR:{options.master_port}"'
        words = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", options.job_name]
        return common + words, frozenset({endpoint})
    words = ["--node-rank", '"$NODE_RANK"', "--master-addr", '"$MASTER_ADDR"',
             "--master-port", str(options.master_port)]
    return common + words, frozenset({'"$NODE_RANK"', '"$MASTER_ADDR"'})


def render_torchrun(plan: SavedPlan, options: LaunchOptions, nodes: int, env: list[EnvVar],
                    sections: list[ArgSection], prelude: list[str] | None = None) -> str:
    """The torchrun script; `prelude`: shell lines run before the launch (files the model needs)."""
    gpus = plan.cluster.gpus_per_node
    release = resolve_flag_table(options).label()
    lines = header(plan, nodes, "torchrun launch", release=release, cpu=options.cpu) + strict_mode() + env_block(env)
    lines += prelude or []
    if nodes > 1:
        lines += _node_wiring(nodes, options)
    launcher_args, raw = torchrun_args(nodes, gpus, options)
    lines += bash_array("TORCHRUN_ARGS", launcher_args, raw=raw) + [""]
    lines += megatron_args_array(sections) + [""]
    command = [q(options.python), "-m", "torch.distributed.run", '"${TORCHRUN_ARGS[@]}"',
               *entrypoint_words(options, plan.model), '"${MEGATRON_ARGS[@]}"']
    lines.append("exec " + " ".join(command))
    return "\n".join(lines) + "\n"


def _node_wiring(nodes: int, options: LaunchOptions) -> list[str]:
    lines = [f"# ---- multi-node ({options.rendezvous} rendezvous): run this script on each of the {nodes} nodes"]
    if options.rendezvous == "static":
        lines.append(f'# with NODE_RANK=0..{nodes - 1} and MASTER_ADDR=<address of node 0>.')
        lines.append(f': "${{NODE_RANK:?set NODE_RANK to the index of this node, 0..{nodes - 1}}}"')
    else:
        lines.append("# with MASTER_ADDR=<address of the rendezvous host>; ranks are assigned on arrival.")
    lines.append(': "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"')
    lines.append("")
    return lines
