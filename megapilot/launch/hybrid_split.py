"""A hybrid (Mamba) model's pipeline split, written as the Megatron-LM release the script is for places it.

pretrain_mamba.py does not place a hybrid's layers the way pretrain_gpt.py places a transformer's: its stack takes
its share of the layer pattern by rules of its own, which changed between releases (NVIDIA/Megatron-LM):
- core_v0.14.0 to core_v0.16.0: `MambaStack._select_layers_for_pipeline_parallel` gives every PP rank
  num_layers // PP layers of the pattern and asserts no virtual pipeline. The parser takes the uneven, account-for
  and layout flags, but the stack never reads them: a script with them would train another split than planned.
- core_v0.16.1: the same stack also places `--decoder-first/last-pipeline-num-layers` (the cherry-picked "Mamba
  Uneven PP fix", #3544 of #3399), mirroring `get_transformer_layer_offset`; still no virtual pipeline.
- core_v0.17.0 on: `|` in `--hybrid-layer-pattern` cuts the pattern into pipeline segments, PP x VPP of them in
  layer-id order: segment i runs on PP rank i % PP, virtual stage i // PP (`select_pipeline_segment`, in
  `megatron/core/ssm/mamba_hybrid_layer_allocation.py`, from core_v0.18.0 `megatron/core/models/hybrid/
  hybrid_layer_allocation.py`), and `arguments.py` derives VPP = segments / PP. Beside the pattern it asserts no
  `--num-layers-per-virtual-pipeline-stage`, `--num-virtual-stages-per-pipeline-rank`,
  `--pipeline-model-parallel-layout` or account-for flag, and no first/last counts beside a `|`; a pattern without
  `|` at PP > 1 still splits evenly, or by first/last counts (deprecated, logged), never interleaved.
  `--hybrid-override-pattern` is the deprecated name, forwarded to `--hybrid-layer-pattern` as it is.

The segments hold decoder layers only: MambaModel builds the embedding on the first stage and the output layer,
the loss and the MTP modules on the last. So a split is written from its resolved stages (`PipelineStages`),
whichever vocabulary the plan used: an even split without interleaving as the plain pattern (as every release
takes it, and as the scripts always wrote it), any other as `|` segments from core_v0.17.0 on, and as first/last
counts on core_v0.16.1 where the counts say it; what the release cannot place is refused, naming the release that
can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise

from megapilot import vocabulary
from megapilot.errors import MegapilotError
from megapilot.launch.megatron_args import Version, parse_version
from megapilot.spec import ModelSpec, ParallelConfig
from megapilot.spec.pipeline import DECODER
from megapilot.spec.validate import hybrid_end_stages_refusal

#: The pattern's flag in every release (deprecated from core_v0.17.0 on, and forwarded as it is).
PATTERN_FLAG = "--hybrid-override-pattern"
#: The flag core_v0.17.0 and later read `|` pipeline segments from (the name their help documents them under).
SEGMENTED_PATTERN_FLAG = "--hybrid-layer-pattern"
PATTERN_FLAGS = (PATTERN_FLAG, SEGMENTED_PATTERN_FLAG)
#: Megatron's pipeline segment separator in a hybrid pattern, and what opens each MTP depth's layers after the
#: decoder's (core_v0.17.0 on: `parse_hybrid_pattern`).
SEGMENT = "|"
MTP_SEPARATOR = "/"
#: The first release whose MambaStack places --decoder-first/last-pipeline-num-layers.
UNEVEN_SINCE: Version = (0, 16, 1)
#: The first release that reads `|` segments (and so any split, interleaved too) from the pattern: the one that
#: brought the flag they are documented under.
SEGMENTS_SINCE: Version = parse_version(vocabulary.term(SEGMENTED_PATTERN_FLAG).since or "")
#: The flags a hybrid's split never takes beside its pattern (arguments.py asserts each from core_v0.17.0 on; the
#: stack ignores them before).
REFUSED_BESIDE_PATTERN = ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                          "--pipeline-model-parallel-layout", "--account-for-embedding-in-pipeline-split",
                          "--account-for-loss-in-pipeline-split")
END_COUNT_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")


@dataclass(frozen=True)
class HybridSplit:
    """How a hybrid's script says its pipeline split: the pattern flag and value, and the split flags beside it."""

    pattern_flag: str
    pattern: str
    split_args: tuple[tuple[str, str], ...] = ()
    note: str | None = None  # how the split was said, for the script's notes

    @property
    def segments(self) -> int:
        """The pattern's pipeline segments (1: the plain pattern)."""
        return pattern_segments(self.pattern)


def hybrid_split(model: ModelSpec, parallel: ParallelConfig, release: Version) -> HybridSplit:
    """The pattern and split flags that make `release`'s pretrain_mamba.py place `model`'s layers on the stages
    `parallel` resolves to; a MegapilotError (field, fix) where that release cannot place them."""
    pattern = model.hybrid_override_pattern
    assert pattern is not None, model.name  # only hybrids come here
    stages = parallel.pipeline_stages(model.num_layers, model.mtp_num_layers)
    if (refusal := hybrid_end_stages_refusal(model, stages, "the split")) is not None:
        raise refusal
    counts = [stage.count(DECODER) for stage in stages.stages]
    if stages.vpp == 1 and len(set(counts)) == 1:
        return HybridSplit(PATTERN_FLAG, pattern)  # even: every release splits the plain pattern so
    if release >= SEGMENTS_SINCE:
        segmented = segmented_pattern(pattern, counts)
        return HybridSplit(SEGMENTED_PATTERN_FLAG, segmented, note=(
            f"{model.name}'s pipeline split ({'/'.join(map(str, counts))} layers over PP={stages.pp} x "
            f"VPP={stages.vpp} stages) is written as the | segments of {SEGMENTED_PATTERN_FLAG}, the one place "
            "Megatron-LM takes a hybrid's uneven or interleaved split from"))
    label = ".".join(map(str, release))
    if stages.vpp > 1:
        raise MegapilotError(
            f"vpp={stages.vpp} on the hybrid {model.name}: Megatron-LM {label}'s MambaStack asserts no virtual "
            "pipeline (a hybrid interleaves only by the | segments of --hybrid-layer-pattern, core_v0.17.0 on)",
            field="vpp", fix="use vpp=1, or write the script for Megatron-LM 0.17 or newer (--megatron-version "
            "0.17.0)")
    # the plan's own first/last counts where it gave them, else the counts' (a layout string, account-for slots)
    given = tuple((flag, value) for flag, value in parallel.pipeline_split.megatron_flags()
                  if flag in END_COUNT_FLAGS and value is not None)
    ends = given or end_counts(counts)
    if ends is None or release < UNEVEN_SINCE:
        since = "0.17.0" if ends is None else "0.16.1"
        why = ("its counts are not one first, one last and equal middle ranks, which is all "
               "--decoder-first/last-pipeline-num-layers say" if ends is None
               else "its MambaStack gives every rank num_layers / PP layers and never reads the uneven flags")
        raise MegapilotError(
            f"the hybrid {model.name}'s pipeline split ({'/'.join(map(str, counts))} layers per rank) cannot be "
            f"written for Megatron-LM {label}: {why}",
            field=_split_field(parallel),
            fix=f"write the script for Megatron-LM {since} or newer (--megatron-version {since}), or use a PP "
                "that divides num_layers with no split")
    return HybridSplit(PATTERN_FLAG, pattern, split_args=ends, note=(
        f"{model.name}'s pipeline split ({'/'.join(map(str, counts))} layers per rank) is written as "
        f"{' and '.join(flag for flag, _ in ends)}, which Megatron-LM's MambaStack places from core_v0.16.1 on "
        "(0.16.0 and older split a hybrid evenly whatever they say): run 0.16.1 or newer"))


def segmented_pattern(pattern: str, counts: Sequence[int]) -> str:
    """`pattern` cut into consecutive segments of `counts` layers, joined by `|` (a segment may be empty)."""
    assert sum(counts) == len(pattern), (counts, len(pattern))
    cuts = list(accumulate(counts, initial=0))
    return SEGMENT.join(pattern[start:end] for start, end in pairwise(cuts))


def end_counts(counts: Sequence[int]) -> tuple[tuple[str, str], ...] | None:
    """--decoder-first/last-pipeline-num-layers for per-rank `counts`: the end ranks that differ from the equal
    middle ranks (both ends at PP 2); None where the middle ranks differ, which those flags cannot say."""
    middle = set(counts[1:-1])
    if len(middle) > 1:
        return None
    given = [(flag, count) for flag, count, differs in
             ((END_COUNT_FLAGS[0], counts[0], counts[0] not in middle),
              (END_COUNT_FLAGS[1], counts[-1], counts[-1] not in middle)) if differs or not middle]
    return tuple((flag, str(count)) for flag, count in given)


def pattern_value(values: Mapping[str, list[str]]) -> str | None:
    """The hybrid pattern a flag list passes (under either name), None without one."""
    for flag in PATTERN_FLAGS:
        if values.get(flag):
            return values[flag][0]
    return None


def pattern_segments(pattern: str) -> int:
    """The pipeline segments of a hybrid pattern's decoder part (1 without a |)."""
    return pattern.split(MTP_SEPARATOR)[0].count(SEGMENT) + 1


def pattern_virtual_stages(pattern: str, pp: int) -> int:
    """The virtual stages per PP rank a hybrid pattern's | segments give (`segments_virtual_stages`)."""
    return segments_virtual_stages(pattern_segments(pattern), pp)


def segments_virtual_stages(segments: int, pp: int) -> int:
    """The virtual stages per PP rank `segments` pipeline segments of a hybrid pattern give (arguments.py: segments /
    PP where more segments than ranks; 1 without segments)."""
    return segments // pp if segments > pp and segments % pp == 0 else 1


def _split_field(parallel: ParallelConfig) -> str:
    if parallel.pipeline_layout is not None:
        return "pipeline_layout"
    if parallel.first_stage_layers is not None:
        return "first_stage_layers"
    if parallel.last_stage_layers is not None:
        return "last_stage_layers"
    return "pp"
