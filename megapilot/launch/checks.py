"""Checks that run before any script is written; each failure is a MegapilotError naming the fix.

- every path is absolute, and exists when the launch is local (single-node torchrun);
- no placeholder is left (`<changeme>`, `/path/to`, `TODO`, ...);
- every flag is known to the pinned Megatron-LM release, with the right number of values;
- flags that need each other are present together (the rules Megatron's `validate_args` enforces);
- the product of the parallel sizes equals nodes x GPUs per node.
Shell quoting is not a check but a construction rule: scripts quote every value with shlex.quote.
"""

from __future__ import annotations

import re
from pathlib import Path

from megapilot.errors import MegapilotError
from megapilot.launch.megatron_args import MEGATRON_RELEASE, split_args
from megapilot.spec import GPUSpec, ParallelConfig

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


def check_megatron_args(args: list[str], gpu: GPUSpec) -> None:
    """Every flag known to the pinned release, and the combinations Megatron requires."""
    pairs = split_args(args)
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
    for fmt_flag, precision in (("--fp8-format", "fp8"), ("--fp4-format", "nvfp4")):
        if fmt_flag not in values:
            continue
        if values.get("--transformer-impl", ["transformer_engine"])[0] != "transformer_engine":
            raise MegapilotError(f"{fmt_flag} needs Transformer Engine", field="precision",
                                 fix="use --transformer-impl transformer_engine")
        if not gpu.supports(precision):  # type: ignore[arg-type]
            raise MegapilotError(f"{gpu.name} ({gpu.architecture}) has no {precision} tensor cores",
                                 field="precision", fix="use --bf16 on this GPU")
    if "--fp8-format" in values and "--fp4-format" in values:
        raise MegapilotError("--fp8-format and --fp4-format exclude each other", field="precision",
                             fix="choose one")


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
    if {"--recompute-method", "--recompute-num-layers"} & values.keys():
        if values.get("--recompute-granularity", [""])[0] != "full":
            raise MegapilotError("--recompute-method/--recompute-num-layers need --recompute-granularity full",
                                 field="recompute", fix="add --recompute-granularity full")


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


_COMBINATION_RULES = (
    _sequence_parallel_needs_tp, _vpp_needs_pp, _param_gather_needs_distributed_optimizer,
    _low_precision_needs_te_and_hardware, _grouped_gemm_needs_experts, _mla_flags_need_mla, _gqa_needs_groups,
    _recompute_method_needs_full, _data_source_given, _seq_length_within_positions, _min_lr_not_above_lr,
    _mtp_needs_rope, _expert_parallel_needs_experts,
)

__all__ = [
    "MEGATRON_RELEASE", "PLACEHOLDER", "check_absolute_path", "check_megatron_args", "check_no_placeholder",
    "check_world",
]
