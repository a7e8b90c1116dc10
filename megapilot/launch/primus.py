"""The AMD Primus launcher: a Primus experiment YAML plus the `primus-cli` command that runs it.

Primus (AMD-AGI/Primus) wraps Megatron-LM: an experiment file names a module (`pre_trainer`,
framework megatron), a base model config and `overrides` keyed by Megatron's argument names. The
overrides carry the same values as the Megatron flags megapilot renders, so `megatron_args` of a
Primus launch is the equivalent pretrain_gpt.py argument list. CVS starts it as
`primus-cli direct -- train pretrain --config FILE` from the Primus checkout, with NNODES,
NODE_RANK and MASTER_ADDR in the environment.
"""

from __future__ import annotations

import yaml

from megapilot.launch.environment import EnvVar
from megapilot.launch.megatron_args import FlagTable, flag_table, split_args
from megapilot.launch.options import LaunchOptions
from megapilot.launch.shell import env_block, header, q, strict_mode, write_file
from megapilot.launch.versions import resolve_flag_table
from megapilot.spec import SavedPlan

HEREDOC_END = "PRIMUS_EXPERIMENT_YAML"
# Primus merges its base experiment (AMD-AGI/Primus v26.5.1 configs/modules/megatron/trainer_base.yaml and
# pre_trainer.yaml, configs/models/megatron/language_model.yaml) under the overrides and hands every key Megatron
# knows to Megatron as is. Where that base departs from Megatron's defaults in a way that changes training, the
# experiment states Megatron's value, so it trains as the same pretrain_gpt.py arguments would.
_EXPLICIT_SWITCHES = (
    "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
    "--swiglu", "--group-query-attention", "--qk-layernorm", "--add-qkv-bias", "--disable-bias-linear",
    "--untie-embeddings-and-output-weights", "--multi-latent-attention", "--mock-data", "--moe-grouped-gemm",
    "--bf16", "--fp16",  # the base turns bf16 on
    "--no-position-embedding",  # the base turns it off, which Megatron refuses for learned absolute positions
    "--override-opt-param-scheduler",  # the base turns it on: a resumed run would drop the checkpoint's schedule
    "--no-manual-gc-eval",  # the base skips the collection after each evaluation
)
# Valued arguments the base sets away from Megatron's default (core_v0.16 arguments.py), and Megatron's value.
_MEGATRON_DEFAULT_VALUES: tuple[tuple[str, object], ...] = (
    ("--eval-iters", 100),  # the base: 0, no validation at all
    ("--dataloader-type", "single"),  # the base: cyclic; Megatron resolves its None to single
)
# Muon's momentum (the base: 0.95), written only where the run uses a Muon optimizer.
_MUON_MOMENTUM = ("--muon-momentum", 0.9)
# The base model config every experiment extends; all model dimensions are overridden.
PRIMUS_BASE_MODEL = "language_model.yaml"


def primus_overrides(megatron_args: list[str], table: FlagTable | None = None) -> dict[str, object]:
    """Megatron arguments -> Primus `overrides`, typed as argparse would type them, keyed by Megatron's own
    destinations in the release the image runs (`table`; None = the newest): Primus passes on only the keys
    Megatron's parser defines, and passes them without parsing."""
    flags = dict((table or flag_table()).flags)
    overrides: dict[str, object] = {}
    given = split_args(megatron_args, table)
    for name, values in given:
        spec = flags[name]
        if spec.action == "store_true":
            overrides[spec.dest] = True
        elif spec.action == "store_false":
            overrides[spec.dest] = False
        elif spec.takes_many:
            overrides[spec.dest] = [_scalar(v) for v in values]  # argparse's list, even for one value
        else:
            overrides[spec.dest] = _scalar(values[0])
    present = {name for name, _ in given}
    for name in (n for n in _EXPLICIT_SWITCHES if n in flags and n not in present):
        overrides[flags[name].dest] = flags[name].action == "store_false"
    muon = any(name == "--optimizer" and "muon" in values[0] for name, values in given)
    for name, value in _MEGATRON_DEFAULT_VALUES + ((_MUON_MOMENTUM,) if muon else ()):
        if name in flags and name not in present:
            overrides[flags[name].dest] = value
    if "--load" in present:
        # Megatron starts from scratch when --load holds no checkpoint yet; Primus defaults to exiting.
        overrides["exit_on_missing_checkpoint"] = False
    return overrides


def primus_defaults(plan: SavedPlan) -> dict[str, object]:
    """Primus-only keys: pretraining semantics and the Primus Turbo kernels AMD's own configs switch on.

    `finetune: false`: a requeued pretraining job resumes its iteration count and optimizer from --load
    instead of starting again at iteration 0. `model_type: mamba` for a hybrid (Primus
    `megatron_pretrain_trainer.py`, as its Mamba model configs set it). Turbo (AMD-AGI/Primus
    `primus_turbo.yaml`, off by default): the model YAMLs enable it, with Turbo attention on MI300X-class GPUs
    (off on MI355X in those YAMLs) and the Turbo grouped GEMM for expert layers.
    """
    defaults: dict[str, object] = {"finetune": False}
    if plan.model.is_hybrid:
        # Primus builds a GPT model unless told otherwise; `mamba` takes pretrain_mamba.py's provider and steps.
        defaults["model_type"] = "mamba"
    if plan.cluster.gpu.vendor != "AMD":
        return defaults
    defaults["enable_primus_turbo"] = True
    defaults["use_turbo_attention"] = plan.cluster.gpu.architecture == "cdna3"
    if plan.model.moe is not None:
        defaults["use_turbo_grouped_gemm"] = True
    return defaults | primus_precision_keys(plan)


def primus_precision_keys(plan: SavedPlan) -> dict[str, object]:
    """The Primus keys a low-precision flavour needs beyond Megatron's (AMD Instinct only).

    MXFP4 has no Megatron flag: Primus reads `fp4: e2m1` with `fp4_recipe: mxfp4` and runs ROCm Transformer
    Engine's MXFP4 linears (AMD's MI355X llama3.1_8B-MXFP4 config, `use_turbo_gemm: false`). Blockwise FP8 and
    MXFP8 run in Primus-Turbo's GEMM (`use_turbo_gemm`, which takes tensorwise, blockwise and mxfp8 recipes and
    refuses delayed: Primus `rocm_arg_validation.py`; AMD's MXFP8 config switches it on).
    """
    flavour = plan.training.quant_flavour
    if flavour == "mxfp4":
        return {"fp4": "e2m1", "fp4_recipe": "mxfp4", "use_turbo_gemm": False}
    if flavour in ("fp8-blockwise", "mxfp8"):
        return {"use_turbo_gemm": True}
    return {}


def _scalar(text: str) -> object:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def primus_experiment(plan: SavedPlan, megatron_args: list[str], options: LaunchOptions) -> str:
    """The experiment YAML text."""
    experiment = {
        "work_group": "megapilot",
        "user_name": "megapilot",
        "exp_name": options.job_name,
        "workspace": (options.log_dir or "./output"),
        "modules": {
            "pre_trainer": {
                "framework": "megatron",
                "config": "pre_trainer.yaml",
                "model": PRIMUS_BASE_MODEL,
                "overrides": primus_overrides(megatron_args, resolve_flag_table(options)) | primus_defaults(plan),
            },
        },
    }
    comment = f"# Primus experiment for {plan.model.name}, drafted by megapilot (overrides = Megatron args)\n"
    text: str = yaml.safe_dump(experiment, sort_keys=False, default_flow_style=False)  # no stream: the YAML text
    return comment + text


def render_primus(plan: SavedPlan, options: LaunchOptions, nodes: int, env: list[EnvVar],
                  experiment_yaml: str, config_path: str, prelude: list[str] | None = None) -> str:
    """The Primus launch; `prelude`: shell lines run before it (files the model needs)."""
    release = resolve_flag_table(options).label()
    lines = header(plan, nodes, "AMD Primus launch", release=release) + strict_mode() + env_block(env)
    lines += prelude or []
    lines += [
        "# ---- node wiring: primus-cli reads these; run this script on every node",
        f"export NNODES={nodes}",
        f"export GPUS_PER_NODE={plan.cluster.gpus_per_node}",
    ]
    if nodes > 1:
        lines += [
            f': "${{NODE_RANK:?set NODE_RANK to the index of this node, 0..{nodes - 1}}}"',
            ': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"',
            "export NODE_RANK MASTER_ADDR",
        ]
    else:
        lines += ["export NODE_RANK=0", "export MASTER_ADDR=localhost"]
    lines += [
        f"export MASTER_PORT={options.master_port}",
        "",
        "# ---- the experiment file (a quoted heredoc: nothing in it is expanded by the shell)",
        f"CONFIG={q(config_path)}",
        *write_file('"$CONFIG"', experiment_yaml, HEREDOC_END),
        "",
        f"cd {q(options.primus_path)}",
        'exec bash runner/primus-cli direct -- train pretrain --config "$CONFIG"',
    ]
    return "\n".join(lines) + "\n"
