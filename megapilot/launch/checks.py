"""Checks that run before any script is written; each failure is a MegapilotError naming the fix.

- every path is absolute, and exists when the launch is local (single-node torchrun);
- no placeholder is left (`<changeme>`, `/path/to`, `TODO`, ...);
- every flag is known to the pinned Megatron-LM release, with the right number of values;
- flags that need each other are present together (the rules Megatron's `validate_args` and
  `TransformerConfig` enforce, Megatron-FSDP's companions, the overlaps' preconditions);
- CUDA_DEVICE_MAX_CONNECTIONS agrees with what Megatron asserts for the layout;
- the product of the parallel sizes equals nodes x GPUs per node.
Shell quoting is not a check but a construction rule: scripts quote every value with shlex.quote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from megapilot.errors import MegapilotError
from megapilot.launch.hybrid_split import (
    END_COUNT_FLAGS,
    REFUSED_BESIDE_PATTERN,
    SEGMENT,
    SEGMENTS_SINCE,
    UNEVEN_SINCE,
    pattern_segments,
    pattern_value,
    pattern_virtual_stages,
)
from megapilot.launch.megatron_args import MEGATRON_RELEASE, FlagTable, flag_table
from megapilot.spec import GPUSpec, ParallelConfig
from megapilot.spec.validate import (
    DEEPEP_REFUSES_PADDING,
    a2a_heads_split_refusal,
    flex_layout_refusal,
    mamba_heads_split_refusal,
)

PLACEHOLDER = re.compile(
    r"<\s*(change ?me|changeme|fill[ _-]?me|your[^>]*|path[^>]*|todo|fixme|placeholder)\s*>"
    r"|/path/to\b|\bTODO\b|\bFIXME\b|\bCHANGEME\b|\bXXX\b",
    re.IGNORECASE,
)


def check_no_placeholder(field: str, value: str) -> None:
    """Refuse values that were clearly copied from an example and never filled in."""
    match = PLACEHOLDER.search(value)
    if match:
        raise MegapilotError(f"{value!r} still holds the placeholder {match.group(0)!r}", field=field,
                             fix="replace it with the real value")


def check_absolute_path(field: str, value: str, *, must_exist: bool, kind: str = "any") -> None:
    """An absolute path; with must_exist, also present on this machine (kind: file, dir, prefix, parent)."""
    check_no_placeholder(field, value)
    if not value.startswith("/"):
        raise MegapilotError(f"{value!r} is not an absolute path", field=field,
                             fix=f"pass the absolute path, e.g. {Path(value).expanduser().absolute()}")
    if must_exist:
        _check_exists(field, Path(value), kind)


def _check_exists(field: str, path: Path, kind: str) -> None:
    if kind == "prefix":  # a Megatron indexed dataset: PREFIX.bin + PREFIX.idx
        missing = [str(p) for p in (path.with_name(path.name + ".bin"), path.with_name(path.name + ".idx"))
                   if not p.is_file()]
        if missing:
            raise MegapilotError(f"dataset files missing: {', '.join(missing)}", field=field,
                                 fix="pass the prefix of an existing .bin/.idx pair (without the suffix)")
        return
    if kind == "parent":  # created by the run, but its parent must be there and writable
        if not path.parent.is_dir():
            raise MegapilotError(f"{path.parent} does not exist", field=field,
                                 fix=f"create it (mkdir -p {path.parent}) or choose another directory")
        return
    present = path.is_file() if kind == "file" else path.is_dir() if kind == "dir" else path.exists()
    if not present:
        raise MegapilotError(f"{path} does not exist on this machine", field=field,
                             fix="pass an existing path (or generate for a remote cluster)")


def check_world(parallel: ParallelConfig, nodes: int, gpus_per_node: int) -> None:
    """TP x PP x CP x DP must use exactly the GPUs launched."""
    gpus = nodes * gpus_per_node
    if parallel.world_size != gpus:
        p = parallel
        raise MegapilotError(
            f"TP*PP*CP*DP = {p.tp}*{p.pp}*{p.cp}*{p.dp} = {p.world_size} but the launch starts "
            f"{nodes} nodes x {gpus_per_node} GPUs = {gpus}",
            field="nodes", fix=f"launch {p.world_size // gpus_per_node or 1} nodes or re-plan for {gpus} GPUs",
        )


def check_megatron_args(args: list[str], gpu: GPUSpec, table: FlagTable | None = None) -> None:
    """Every flag known to the release the script is for (None = the newest table), and the combinations
    Megatron requires."""
    pairs = (table or flag_table()).split_args(args)
    values = {name: vals for name, vals in pairs}
    duplicates = sorted({name for name, _ in pairs if sum(n == name for n, _ in pairs) > 1})
    if duplicates:
        raise MegapilotError(f"flags given twice: {', '.join(duplicates)}", field="megatron_args",
                             fix="keep one of each")
    for name, vals in pairs:
        for value in vals:
            check_no_placeholder(name, value)
    for rule in _COMBINATION_RULES:
        rule(values, gpu)
    _query_groups_split_over_tensor_parallel(values, (table or flag_table()).version)
    _hybrid_full_recompute(values, (table or flag_table()).version)
    _hybrid_split_flags(values, (table or flag_table()).version)
    if (table or flag_table()).version < SEQUENCE_PARALLEL_WITH_EP_WARNS_SINCE:
        _tp_with_ep_needs_sequence_parallel(values, gpu)


def combination_refusals(values: dict[str, list[str]], gpu: GPUSpec) -> list[MegapilotError]:
    """What each of the combination rules Megatron applies refuses in these flags, every rule asked (not the
    first refusal only): an edit's own refusals are those its flags have and the unedited flags do not."""
    refusals: list[MegapilotError] = []
    for rule in _COMBINATION_RULES:
        try:
            rule(values, gpu)
        except MegapilotError as exc:
            refusals.append(exc)
    return refusals


def _int_value(values: dict[str, list[str]], name: str, default: int = 1) -> int:
    vals = values.get(name)
    return int(vals[0]) if vals else default


def _sequence_parallel_needs_tp(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if "--sequence-parallel" in values and _int_value(values, "--tensor-model-parallel-size") < 2:
        raise MegapilotError("--sequence-parallel needs --tensor-model-parallel-size > 1", field="sequence_parallel",
                             fix="drop --sequence-parallel or raise TP")


def _vpp_needs_pp(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    vpp_flags = {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"}
    if vpp_flags & values.keys() and _int_value(values, "--pipeline-model-parallel-size") < 2:
        raise MegapilotError("virtual pipeline stages need --pipeline-model-parallel-size > 1", field="vpp",
                             fix="drop the virtual-pipeline flag or raise PP")


def _cpu_offloading_alone(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    """Megatron-Core's TransformerConfig refuses activation offloading beside pipelining or recompute."""
    if _int_value(values, "--cpu-offloading-num-layers", 0) < 1:
        return
    if _int_value(values, "--pipeline-model-parallel-size") > 1:
        raise MegapilotError("--cpu-offloading-num-layers does not run with --pipeline-model-parallel-size > 1 "
                             "(Megatron: 'Currently there is no support for Pipeline parallelism with CPU offloading')",
                             field="cpu_offloading_num_layers", fix="drop it, or use PP 1")
    recompute = {"--recompute-activations", "--recompute-granularity"} & values.keys()
    if recompute:
        raise MegapilotError(f"--cpu-offloading-num-layers does not run with {', '.join(sorted(recompute))} (Megatron: "
                             "'CPU offloading does not work when activation recomputation is enabled')",
                             field="cpu_offloading_num_layers", fix="drop the recompute flags, or the offloading")


def _muon_runs_on_plain_ddp(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    """Megatron-LM's arguments.py, for every Muon variant: no distributed optimizer, no FSDP; and plain `muon`
    overlaps neither the gradient reduction nor the parameter gather ("Use dist_muon instead")."""
    optimizer = (values.get("--optimizer") or ["adam"])[0]
    if "muon" not in optimizer:
        return
    for flag in ("--use-distributed-optimizer", "--use-megatron-fsdp", "--use-torch-fsdp2"):
        if flag in values:
            raise MegapilotError(f"--optimizer {optimizer} does not run with {flag} (Megatron asserts it)",
                                 field="optimizer", fix=f"drop {flag}; --optimizer dist_muon shards Muon's state")
    for flag in ("--overlap-grad-reduce", "--overlap-param-gather"):
        if optimizer == "muon" and flag in values:
            raise MegapilotError(f"--optimizer muon does not support {flag} (Megatron asserts it)", field="optimizer",
                                 fix=f"drop {flag}, or use --optimizer dist_muon")


def _a2a_overlap_needs(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    """Megatron-Core's TransformerConfig for --overlap-moe-expert-parallel-comm and --delay-wgrad-compute."""
    field, overlap = "moe_a2a_overlap", "--overlap-moe-expert-parallel-comm"
    if "--delay-wgrad-compute" in values and overlap not in values:
        raise MegapilotError(f"--delay-wgrad-compute needs {overlap}", field=field, fix=f"add {overlap} or drop it")
    if "--delay-wgrad-compute" in values and "--moe-use-legacy-grouped-gemm" in values:
        raise MegapilotError("--delay-wgrad-compute does not run with --moe-use-legacy-grouped-gemm", field=field,
                             fix="drop --moe-use-legacy-grouped-gemm")
    if overlap not in values:
        return
    pp = _int_value(values, "--pipeline-model-parallel-size")
    mtp = _int_value(values, "--mtp-num-layers", 0)
    refusals = [
        (_int_value(values, "--expert-model-parallel-size") < 2, "needs expert parallelism (EP > 1)"),
        ((values.get("--recompute-granularity") or [""])[0] == "full" or "--recompute-method" in values
         or "--recompute-num-layers" in values, "does not run with full recompute"),
        (pp > 1 and not _interleaved(values), "needs virtual pipeline stages when PP > 1"),
        (mtp > 1, f"takes at most one MTP layer, not {mtp}"),
        (mtp == 1 and pp == 1, "with an MTP layer needs PP > 1"),
        ("--moe-shared-expert-overlap" in values, "does not run with --moe-shared-expert-overlap"),
        ((values.get("--moe-token-dispatcher-type") or ["alltoall"])[0] not in ("alltoall", "flex"),
         "needs the alltoall or flex token dispatcher"),
    ]
    for refused, why in refusals:
        if refused:
            raise MegapilotError(f"{overlap} {why} (Megatron asserts it)", field=field,
                                 fix=f"drop {overlap} and --delay-wgrad-compute, or change the layout")


def _param_gather_needs_distributed_optimizer(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if "--overlap-param-gather" not in values:
        return
    if not {"--use-distributed-optimizer", "--use-megatron-fsdp"} & values.keys():
        raise MegapilotError("--overlap-param-gather needs --use-distributed-optimizer (or Megatron-FSDP)",
                             field="overlap_param_gather", fix="add --use-distributed-optimizer or drop it")
    if "--overlap-grad-reduce" not in values:
        raise MegapilotError("--overlap-param-gather needs --overlap-grad-reduce", field="overlap_param_gather",
                             fix="add --overlap-grad-reduce")


def _low_precision_needs_te_and_hardware(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    for fmt_flag in ("--fp8-format", "--fp4-format"):
        if fmt_flag in values and values.get("--transformer-impl", ["transformer_engine"])[0] != "transformer_engine":
            raise MegapilotError(f"{fmt_flag} needs Transformer Engine", field="precision",
                                 fix="use --transformer-impl transformer_engine")
    if "--fp8-format" in values and "--fp4-format" in values:
        raise MegapilotError("--fp8-format and --fp4-format exclude each other", field="precision",
                             fix="choose one")
    if "--fp8-format" in values:
        recipe = values.get("--fp8-recipe", ["delayed"])[0]  # Megatron's default recipe
        if recipe == "mxfp8":
            gpu.check_precision("mxfp8")
        elif recipe != "custom":
            gpu.check_precision("fp8", recipe)  # type: ignore[arg-type]  # a parser choice: delayed/tensorwise/blockwise
    if "--fp4-format" in values and values.get("--fp4-recipe", ["nvfp4"])[0] == "nvfp4":
        gpu.check_precision("nvfp4")


def _grouped_gemm_needs_experts(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if "--moe-grouped-gemm" in values and "--num-experts" not in values:
        raise MegapilotError("--moe-grouped-gemm without --num-experts", field="moe", fix="drop it on dense models")


def _mla_flags_need_mla(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    mla_flags = {"--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"}
    if mla_flags & values.keys() and "--multi-latent-attention" not in values:
        raise MegapilotError("MLA dimensions given without --multi-latent-attention", field="mla",
                             fix="add --multi-latent-attention")


def _gqa_needs_groups(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if "--group-query-attention" in values and "--num-query-groups" not in values:
        raise MegapilotError("--group-query-attention needs --num-query-groups", field="num_query_groups",
                             fix="add --num-query-groups KV_HEADS")


def _recompute_method_needs_full(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if ({"--recompute-method", "--recompute-num-layers"} & values.keys()
            and values.get("--recompute-granularity", [""])[0] != "full"):
        raise MegapilotError("--recompute-method/--recompute-num-layers need --recompute-granularity full",
                             field="recompute", fix="add --recompute-granularity full")


def _recompute_modules_need_their_parts(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    """TransformerConfig raises on MoE activation recompute without the grouped GEMM, and on MLA up-projection
    recompute without MLA."""
    modules = set(values.get("--recompute-modules", []))
    if "moe_act" in modules and "--moe-grouped-gemm" not in values:
        raise MegapilotError("--recompute-modules moe_act needs --moe-grouped-gemm (Megatron raises)",
                             field="recompute_modules", fix="add --moe-grouped-gemm, or drop moe_act")
    if "mla_up_proj" in modules and "--multi-latent-attention" not in values:
        raise MegapilotError("--recompute-modules mla_up_proj needs --multi-latent-attention (Megatron raises)",
                             field="recompute_modules", fix="drop mla_up_proj on a model without MLA")


def _data_source_given(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    has_path, has_mock = "--data-path" in values, "--mock-data" in values
    if has_path == has_mock:
        raise MegapilotError("pass exactly one of --data-path and --mock-data", field="data_path",
                             fix="give a dataset prefix or use mock data")


def _seq_length_within_positions(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if "--seq-length" in values and "--max-position-embeddings" in values:
        seq, positions = _int_value(values, "--seq-length"), _int_value(values, "--max-position-embeddings")
        if positions < seq:
            raise MegapilotError(f"--seq-length {seq} exceeds --max-position-embeddings {positions}",
                                 field="seq_length", fix=f"train with a sequence of at most {positions} tokens")


def _min_lr_not_above_lr(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if "--lr" in values and "--min-lr" in values and float(values["--min-lr"][0]) > float(values["--lr"][0]):
        raise MegapilotError("--min-lr is above --lr", field="min_lr", fix="use a min_lr <= lr")


def _mtp_needs_rope(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if _int_value(values, "--mtp-num-layers", 0) and values.get("--position-embedding-type", ["learned_absolute"])[0] \
            not in ("rope", "none"):
        raise MegapilotError("multi-token prediction needs rope or no position embedding", field="mtp_num_layers",
                             fix="use --position-embedding-type rope, or drop MTP")


def _expert_parallel_needs_experts(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    ep = _int_value(values, "--expert-model-parallel-size")
    experts = _int_value(values, "--num-experts", 0)
    if ep > 1 and (experts == 0 or experts % ep):
        raise MegapilotError(f"--expert-model-parallel-size {ep} needs --num-experts divisible by it", field="ep",
                             fix="use an EP that divides the number of experts")


# ---- Megatron-FSDP and the overlaps (validate_args in megatron/training/arguments.py, core_v0.16.0) ----
def _megatron_fsdp_companions(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    ckpt_format = values.get("--ckpt-format", ["torch_dist"])[0]
    if "--use-megatron-fsdp" not in values:
        if ckpt_format == "fsdp_dtensor":
            raise MegapilotError("--ckpt-format fsdp_dtensor is only for Megatron-FSDP", field="ckpt_format",
                                 fix="use --ckpt-format torch_dist, or add --use-megatron-fsdp")
        return
    if "--use-distributed-optimizer" not in values:
        # Not asserted by Megatron, but without it the FSDP optimizer steps never run (FSDP user guide).
        raise MegapilotError("Megatron-FSDP needs --use-distributed-optimizer", field="fsdp",
                             fix="add --use-distributed-optimizer")
    if ckpt_format != "fsdp_dtensor":
        raise MegapilotError(f"Megatron-FSDP saves only fsdp_dtensor checkpoints, not {ckpt_format}",
                             field="ckpt_format", fix="use --ckpt-format fsdp_dtensor")
    pp = _int_value(values, "--pipeline-model-parallel-size")
    if pp > 1:
        # Megatron-Core asserts nothing against it (core 0.16-0.19); the script keeps to what Megatron-FSDP's guide
        # pairs it with (TP, CP, EP) and no published recipe pipelines it.
        raise MegapilotError(f"the script writes Megatron-FSDP at PP 1 only, not PP={pp} (its guide pairs FSDP "
                             "with TP, CP and EP)", field="pp",
                             fix="use PP=1 with Megatron-FSDP, or drop FSDP and keep the distributed optimizer")
    if "--use-torch-fsdp2" in values:
        raise MegapilotError("--use-megatron-fsdp and --use-torch-fsdp2 exclude each other", field="fsdp",
                             fix="keep one FSDP implementation")


def _optimizer_step_overlap_needs(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if "--overlap-param-gather-with-optimizer-step" not in values:
        return
    flag = "--overlap-param-gather-with-optimizer-step"
    if "--use-distributed-optimizer" not in values or "--use-megatron-fsdp" in values:
        raise MegapilotError(f"{flag} needs the distributed optimizer without FSDP", field="overlap_param_gather",
                             fix=f"add --use-distributed-optimizer or drop {flag}")
    if "--overlap-param-gather" not in values:
        raise MegapilotError(f"{flag} needs --overlap-param-gather", field="overlap_param_gather",
                             fix="add --overlap-param-gather")
    if not _interleaved(values):
        raise MegapilotError(f"{flag} needs interleaved pipeline parallelism (VPP > 1)", field="vpp",
                             fix=f"use a layout with VPP > 1 or drop {flag}")
    if values.get("--ckpt-format", ["torch_dist"])[0] != "torch":
        raise MegapilotError(f"{flag} does not work with distributed checkpoints", field="ckpt_format",
                             fix=f"drop {flag}, or use --ckpt-format torch")


def _tp_comm_overlap_needs_sp_and_te(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if "--tp-comm-overlap" not in values:
        return
    if "--sequence-parallel" not in values:  # and SP itself needs TP > 1
        raise MegapilotError("--tp-comm-overlap needs --sequence-parallel", field="tp_comm_overlap",
                             fix="add --sequence-parallel (TP > 1) or drop --tp-comm-overlap")
    if gpu.vendor != "NVIDIA":
        raise MegapilotError(f"--tp-comm-overlap uses CUDA userbuffers, not available on {gpu.name}",
                             field="tp_comm_overlap", fix="drop --tp-comm-overlap")


def _fused_kernels_need_te(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if values.get("--transformer-impl", ["transformer_engine"])[0] == "transformer_engine":
        return
    te_only = ["--tp-comm-overlap", "--moe-permute-fusion", "--fp8-param-gather"]
    if values.get("--cross-entropy-fusion-impl", ["native"])[0] == "te":
        te_only.append("--cross-entropy-fusion-impl")
    used = [name for name in te_only if name in values]
    if used:
        raise MegapilotError(f"{', '.join(used)} need Transformer Engine", field="transformer_impl",
                             fix="use --transformer-impl transformer_engine or drop them")


def _fp8_param_gather_needs_sharded_weights(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    if "--fp8-param-gather" in values and not {"--use-distributed-optimizer", "--use-megatron-fsdp"} & values.keys():
        raise MegapilotError("--fp8-param-gather needs the distributed optimizer or Megatron-FSDP",
                             field="fp8_param_gather", fix="add --use-distributed-optimizer or drop it")
    if "--fp8-param-gather" in values and "--fp8-format" not in values:
        raise MegapilotError("--fp8-param-gather without FP8 training", field="fp8_param_gather",
                             fix="drop it, or train in fp8")
    if "--reuse-grad-buf-for-mxfp8-param-ag" in values and "--fp8-param-gather" not in values:
        raise MegapilotError("--reuse-grad-buf-for-mxfp8-param-ag needs --fp8-param-gather", field="fp8_param_gather",
                             fix="add --fp8-param-gather")
    recipe = values.get("--fp8-recipe", ["delayed"])[0]
    if "--reuse-grad-buf-for-mxfp8-param-ag" in values and recipe != "mxfp8":
        # The shared param/grad buffer holds MXFP8 weights only; other recipes gather their own FP8 copies.
        raise MegapilotError(f"--reuse-grad-buf-for-mxfp8-param-ag is for --fp8-recipe mxfp8, not {recipe}",
                             field="fp8_param_gather", fix="drop --reuse-grad-buf-for-mxfp8-param-ag")


def _fp8_recipe_limits(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    """What Megatron refuses per FP8 recipe (arguments.py and TransformerConfig, core_v0.16.0)."""
    if "--fp4-param-gather" in values and "--fp4-format" not in values:
        raise MegapilotError("--fp4-param-gather without FP4 training", field="fp8_param_gather",
                             fix="add --fp4-format e2m1 --fp4-recipe nvfp4, or drop it")
    if "--fp8-format" not in values:
        return
    recipe = values.get("--fp8-recipe", ["delayed"])[0]
    if "--optimizer-cpu-offload" in values and "--fp8-param-gather" in values and recipe != "delayed":
        raise MegapilotError(f"--fp8-param-gather with --optimizer-cpu-offload needs --fp8-recipe delayed, not "
                             f"{recipe}", field="fp8_recipe", fix="drop --fp8-param-gather, or use the delayed recipe")
    if recipe != "delayed":
        return
    if "--first-last-layers-bf16" in values:
        raise MegapilotError("delayed scaling does not keep the first and last layers in bf16", field="fp8_recipe",
                             fix="use --fp8-recipe tensorwise, or drop --first-last-layers-bf16")
    recomputed = {"moe_act", "layernorm"} & set(values.get("--recompute-modules", []))
    if recomputed:
        raise MegapilotError(f"delayed scaling does not recompute {', '.join(sorted(recomputed))} in fp8",
                             field="fp8_recipe", fix="use --fp8-recipe tensorwise, or recompute other modules")


# ModelParallelConfig raised on TP > 1 with EP > 1 and no sequence parallelism up to core_v0.14; from core_v0.15 on
# it only warns ("sequence parallelism must be used").
SEQUENCE_PARALLEL_WITH_EP_WARNS_SINCE = (0, 15, 0)


def _tp_with_ep_needs_sequence_parallel(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    tp, ep = _int_value(values, "--tensor-model-parallel-size"), _int_value(values, "--expert-model-parallel-size")
    if tp > 1 and ep > 1 and "--sequence-parallel" not in values:
        raise MegapilotError(f"expert parallelism (EP={ep}) with tensor parallelism (TP={tp}) needs sequence "
                             "parallelism before Megatron-LM core_v0.15 (Megatron-Core: 'sequence parallelism must "
                             "be used')",
                             field="sequence_parallel", fix="add --sequence-parallel")


def _flex_dispatcher_fits(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    dispatcher = values.get("--moe-token-dispatcher-type", ["allgather"])[0]
    if "--moe-flex-dispatcher-backend" in values and dispatcher != "flex":
        raise MegapilotError(f"--moe-flex-dispatcher-backend has no effect with the {dispatcher} dispatcher",
                             field="moe_flex_dispatcher", fix="add --moe-token-dispatcher-type flex or drop it")
    if dispatcher != "flex":
        return
    tp, ep = _int_value(values, "--tensor-model-parallel-size"), _int_value(values, "--expert-model-parallel-size")
    if (refusal := flex_layout_refusal(tp, ep)) is not None:
        raise MegapilotError(refusal, field="moe_flex_dispatcher",
                             fix="use --moe-token-dispatcher-type alltoall with TP = EP = 1")
    if gpu.vendor != "NVIDIA":
        raise MegapilotError(f"the flex dispatcher's backends (DeepEP, HybridEP) are CUDA libraries, not for "
                             f"{gpu.name}", field="moe_flex_dispatcher",
                             fix="use --moe-token-dispatcher-type alltoall")
    backend = values.get("--moe-flex-dispatcher-backend", ["deepep"])[0]
    if backend == "deepep" and "--moe-pad-expert-input-to-capacity" in values:
        raise MegapilotError(DEEPEP_REFUSES_PADDING, field="moe_flex_dispatcher",
                             fix="use --moe-flex-dispatcher hybridep, or drop the padding")


def _attention_sinks_have_a_backend(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    """Transformer Engine 2.8-2.11's get_attention_backend: a sink (--softmax-type learnable or off-by-one) runs
    only in FusedAttention (and, without CP, UnfusedDotProductAttention), under context parallelism only with
    cp_comm_type a2a; Megatron's --cp-comm-type defaults to p2p. (TE has no sink backend in FP8 attention either,
    but Megatron-LM's arguments.py has no flag for TransformerConfig.fp8_dot_product_attention.)"""
    if values.get("--softmax-type", ["vanilla"])[0] == "vanilla":
        return
    cp = _int_value(values, "--context-parallel-size")
    comm = values.get("--cp-comm-type", ["p2p"])
    if cp > 1 and any(kind != "a2a" for kind in comm):
        raise MegapilotError(f"attention sinks (--softmax-type) under context parallelism (CP={cp}) run in "
                             f"Transformer Engine only with --cp-comm-type a2a, not {' '.join(comm)}", field="cp",
                             fix="use --context-parallel-size 1, or --cp-comm-type a2a")


def _sliding_window_leaves_the_p2p_ring(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    """Transformer Engine 2.8-2.11's attn_forward_func_with_cp: a sliding window (--window-size other than the causal
    -1,0) runs under context parallelism only with cp_comm_type a2a or all_gather
    (`spec.validate.window_context_parallel_refusal`); Megatron's --cp-comm-type defaults to p2p."""
    window = values.get("--window-size", ["-1,0"])[0].replace(" ", "")
    cp = _int_value(values, "--context-parallel-size")
    comm = values.get("--cp-comm-type", ["p2p"])
    if window not in ("-1,0", "-1,-1") and cp > 1 and any(kind not in ("a2a", "all_gather") for kind in comm):
        raise MegapilotError(f"a sliding window (--window-size {window}) under context parallelism (CP={cp}) runs in "
                             f"Transformer Engine only with --cp-comm-type a2a or all_gather, not {' '.join(comm)}",
                             field="cp", fix="use --context-parallel-size 1, or --cp-comm-type a2a")


def _a2a_context_parallel_splits_heads(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    """--cp-comm-type a2a over CP > 1: Transformer Engine's whole heads per CP rank, and no MLA
    (`spec.validate.a2a_context_parallel_refusal`), from the flags (KV heads: --num-query-groups with
    --group-query-attention, else one per head)."""
    cp = _int_value(values, "--context-parallel-size")
    if cp == 1 or "a2a" not in values.get("--cp-comm-type", ["p2p"]):
        return
    if "--multi-latent-attention" in values:
        raise MegapilotError("--cp-comm-type a2a beside --multi-latent-attention: Transformer Engine runs MLA under "
                             "context parallelism only with p2p or a2a+p2p", field="cp_comm_type",
                             fix="use --cp-comm-type p2p")
    heads = _int_value(values, "--num-attention-heads", 0)
    groups = _int_value(values, "--num-query-groups", heads) if "--group-query-attention" in values else heads
    sinks = values.get("--softmax-type", ["vanilla"])[0] != "vanilla"
    refusal = a2a_heads_split_refusal(heads, (groups,), _int_value(values, "--tensor-model-parallel-size"), cp,
                                      sinks=sinks) if heads and groups else None
    if refusal is not None:
        raise refusal


def _attention_backend_fits(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    backend = values.get("--attention-backend", ["auto"])[0]
    if backend == "local" and "--spec" not in values:
        raise MegapilotError("--attention-backend local runs only with --spec local", field="attention_backend",
                             fix="use --attention-backend auto (or flash/fused)")
    cp = _int_value(values, "--context-parallel-size")
    if cp > 1 and backend in ("local", "unfused"):
        raise MegapilotError(f"context parallelism (CP={cp}) runs only in TE's flash or fused attention, "
                             f"not the {backend} backend", field="attention_backend",
                             fix="use --attention-backend auto, flash or fused")


# ---- how the model splits over the parallel sizes (validate_args, TransformerConfig) ------------
def _layers_split_over_pipeline(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    pp = _int_value(values, "--pipeline-model-parallel-size")
    uneven = {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
              "--pipeline-model-parallel-layout"} & values.keys()
    if pp == 1 or uneven or "--num-layers" not in values or SEGMENT in (pattern_value(values) or ""):
        return  # (a hybrid pattern's | segments are its split)
    layers = _int_value(values, "--num-layers") + sum(
        flag in values for flag in ("--account-for-embedding-in-pipeline-split",
                                    "--account-for-loss-in-pipeline-split"))
    if layers % pp:
        raise MegapilotError(f"{layers} layers do not split evenly over PP={pp}", field="pp",
                             fix="use a PP that divides the layers, or an uneven split")
    per_chunk = _int_value(values, "--num-layers-per-virtual-pipeline-stage", 0)
    if per_chunk and (layers // pp) % per_chunk:
        raise MegapilotError(f"{layers // pp} layers per pipeline rank do not split into chunks of {per_chunk}",
                             field="vpp", fix="use a VPP that divides the layers of each pipeline rank")


def _heads_split_over_tensor_parallel(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    tp = _int_value(values, "--tensor-model-parallel-size")
    heads = _int_value(values, "--num-attention-heads", 0)
    if heads and heads % tp:
        raise MegapilotError(f"{heads} attention heads do not split over TP={tp}", field="tp",
                             fix="use a TP that divides the number of attention heads")


# Megatron-Core 0.16's TransformerConfig takes num_query_groups a multiple or a divisor of TP ("Support TP greater
# than num_kv_heads", #2565); before, TP had to divide them.
QUERY_GROUPS_BELOW_TP_SINCE = (0, 16, 0)


def _query_groups_split_over_tensor_parallel(values: dict[str, list[str]], version: tuple[int, ...]) -> None:
    tp, groups = _int_value(values, "--tensor-model-parallel-size"), _int_value(values, "--num-query-groups", 0)
    if "--group-query-attention" not in values or not groups or groups % tp == 0:
        return
    if version < QUERY_GROUPS_BELOW_TP_SINCE:
        raise MegapilotError(f"{groups} query groups do not split over TP={tp}", field="tp",
                             fix="use a TP that divides the number of KV heads")
    if tp % groups:
        raise MegapilotError(f"{groups} query groups are neither a multiple nor a divisor of TP={tp}", field="tp",
                             fix="use a TP that divides the KV heads or is a multiple of them")


# Megatron-Core's hybrid stack recomputes whole layers from core 0.18 on ("Support recomputing in HybridModel",
# #4496: HybridStack.forward calls checkpointed_forward under --recompute-granularity full); 0.16 and 0.17's
# MambaStack.forward runs its layers without looking at the flag, so the run would hold every activation the
# estimate took as recomputed.
HYBRID_FULL_RECOMPUTE_SINCE = (0, 18, 0)


def _hybrid_full_recompute(values: dict[str, list[str]], version: tuple[int, ...]) -> None:
    if pattern_value(values) is None or values.get("--recompute-granularity") != ["full"]:
        return
    if version < HYBRID_FULL_RECOMPUTE_SINCE:
        raise MegapilotError(
            f"--recompute-granularity full on a hybrid (Mamba) model: Megatron-Core {'.'.join(map(str, version))}'s "
            "MambaStack ignores it (whole hybrid layers are recomputed from core 0.18 on)", field="recompute",
            fix="use selective recompute, or write the script for Megatron-LM 0.18 or later (--megatron-version)")


def _mamba_heads_split_over_tp_and_cp(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    """A hybrid's Mamba-2 heads and groups over TP and CP (`spec.validate.mamba_heads_split_refusal`), from the
    flags and TransformerConfig's defaults: head dim 64, 8 groups, heads = hidden x 2 (the mixer's expand) / head
    dim unless --mamba-num-heads."""
    if "M" not in (pattern_value(values) or ""):
        return
    head_dim = _int_value(values, "--mamba-head-dim", 64)
    heads = _int_value(values, "--mamba-num-heads", 0) or _int_value(values, "--hidden-size", 0) * 2 // head_dim
    refusal = mamba_heads_split_refusal(heads, _int_value(values, "--mamba-num-groups", 8),
                                        _int_value(values, "--tensor-model-parallel-size"),
                                        _int_value(values, "--context-parallel-size"))
    if heads and refusal is not None:
        raise refusal


def _hybrid_split_flags(values: dict[str, list[str]], version: tuple[int, ...]) -> None:
    """A hybrid's pipeline split beside its pattern, as pretrain_mamba.py places it (`hybrid_split`): by the | segments
    of the pattern from core 0.17 on (arguments.py derives VPP from them and asserts the virtual-pipeline, layout and
    account-for flags off beside the pattern, and first/last counts off beside a |), by first/last counts from
    0.16.1 (a 0.16 table stands for its patch releases too), evenly before; the stack ignores what it does not
    place."""
    pattern = pattern_value(values)
    if pattern is None:
        return
    label = ".".join(map(str, version))
    refused = [flag for flag in REFUSED_BESIDE_PATTERN if flag in values]
    if refused:
        raise MegapilotError(f"{', '.join(refused)} beside a hybrid's layer pattern: Megatron places a hybrid's "
                             "layers only by the pattern's | segments (core 0.17 on) or first/last counts",
                             field="vpp" if _VPP_FLAGS & set(refused) else "pp",
                             fix="write the split as | segments of --hybrid-layer-pattern (Megatron-LM 0.17 on)")
    ends = [flag for flag in END_COUNT_FLAGS if flag in values]
    if SEGMENT in pattern:
        segments = pattern_segments(pattern)
        pp = _int_value(values, "--pipeline-model-parallel-size")
        if version < SEGMENTS_SINCE:
            raise MegapilotError(f"the hybrid pattern has | segments, which Megatron-LM {label} reads as an invalid "
                                 "layer symbol", field="megatron_version",
                                 fix="run Megatron-LM 0.17 or newer, or drop the | segments (an even split)")
        if ends:
            raise MegapilotError(f"{', '.join(ends)} beside | segments of the hybrid pattern (Megatron asserts "
                                 "them off: the segments are the split)", field="pp", fix=f"drop {', '.join(ends)}")
        if segments % pp:
            raise MegapilotError(f"the hybrid pattern's {segments} | segments do not divide over PP={pp}",
                                 field="pp", fix="write PP x VPP segments")
    elif ends and version[:2] < UNEVEN_SINCE[:2]:
        raise MegapilotError(f"{', '.join(ends)} beside a hybrid's layer pattern: Megatron-LM {label}'s MambaStack "
                             "splits a hybrid evenly whatever they say", field="pp",
                             fix="run Megatron-LM 0.16.1 or newer, or use a PP that divides num_layers")


def _sequence_split_over_context_parallel(values: dict[str, list[str]], gpu: GPUSpec) -> None:
    cp, seq = _int_value(values, "--context-parallel-size"), _int_value(values, "--seq-length", 0)
    if cp > 1 and seq % (2 * cp):
        raise MegapilotError(f"--seq-length {seq} is not a multiple of 2 x CP = {2 * cp}", field="seq_length",
                             fix="use a sequence length divisible by 2 x CP, or another CP")


def _interleaved(values: dict[str, list[str]]) -> bool:
    """Virtual pipeline stages asked for: by a flag, or by more | segments of a hybrid pattern than PP ranks."""
    pp = _int_value(values, "--pipeline-model-parallel-size")
    return bool(_VPP_FLAGS & values.keys()) or pattern_virtual_stages(pattern_value(values) or "", pp) > 1


_VPP_FLAGS = frozenset({"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                        "--pipeline-model-parallel-layout"})

_COMBINATION_RULES = (
    _attention_sinks_have_a_backend, _sliding_window_leaves_the_p2p_ring, _a2a_context_parallel_splits_heads,
    _mamba_heads_split_over_tp_and_cp,
    _sequence_parallel_needs_tp, _vpp_needs_pp, _cpu_offloading_alone, _muon_runs_on_plain_ddp, _a2a_overlap_needs,
    _param_gather_needs_distributed_optimizer,
    _low_precision_needs_te_and_hardware, _grouped_gemm_needs_experts, _mla_flags_need_mla, _gqa_needs_groups,
    _recompute_method_needs_full, _recompute_modules_need_their_parts,
    _data_source_given, _seq_length_within_positions, _min_lr_not_above_lr,
    _mtp_needs_rope, _expert_parallel_needs_experts, _megatron_fsdp_companions, _optimizer_step_overlap_needs,
    _tp_comm_overlap_needs_sp_and_te, _fused_kernels_need_te, _fp8_param_gather_needs_sharded_weights,
    _fp8_recipe_limits,
    _flex_dispatcher_fits, _attention_backend_fits, _layers_split_over_pipeline,
    _heads_split_over_tensor_parallel, _sequence_split_over_context_parallel,
)


def check_environment(args: list[str], env: Mapping[str, str | None], gpu: GPUSpec, *, cpu: bool = False,
                      table: FlagTable | None = None) -> None:
    """CUDA_DEVICE_MAX_CONNECTIONS as Megatron asserts it (`env` maps a name to None when it is unset).

    Megatron-FSDP refuses 1 on every GPU. Otherwise TP > 1 or CP > 1 on GPUs before Blackwell needs
    exactly 1, so the TP/CP communication kernels are issued in order (arch < 10; AMD Instinct reports 9).
    """
    if cpu:
        return
    values = {name: vals for name, vals in (table or flag_table()).split_args(args)}
    connections = env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if "--use-megatron-fsdp" in values:
        if connections == "1":
            raise MegapilotError("Megatron-FSDP refuses CUDA_DEVICE_MAX_CONNECTIONS=1", field="env",
                                 fix="unset CUDA_DEVICE_MAX_CONNECTIONS (or set it above 1)")
        return
    tp, cp = _int_value(values, "--tensor-model-parallel-size"), _int_value(values, "--context-parallel-size")
    before_blackwell = gpu.architecture not in ("blackwell",)
    if (tp > 1 or cp > 1) and before_blackwell and connections != "1":
        raise MegapilotError(f"TP={tp}/CP={cp} on {gpu.name} needs CUDA_DEVICE_MAX_CONNECTIONS=1 "
                             f"(got {connections or 'unset'})", field="env",
                             fix="export CUDA_DEVICE_MAX_CONNECTIONS=1")

__all__ = [
    "MEGATRON_RELEASE", "PLACEHOLDER", "check_absolute_path", "check_environment", "check_megatron_args",
    "check_no_placeholder", "check_world",
]
