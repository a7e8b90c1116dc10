"""Pipeline split: where Megatron places the embedding, decoder layers, MTP modules and loss.

Megatron-LM core 0.16 has four ways to say it, and they are one concept here:

- an even split (`--num-layers` / (PP x VPP) per model chunk);
- an uneven one (`--decoder-first-pipeline-num-layers`, `--decoder-last-pipeline-num-layers`);
- the embedding and/or loss counted as one layer slot each (`--account-for-embedding-in-pipeline-split`,
  `--account-for-loss-in-pipeline-split`), which is how 126-layer Llama 3.1 405B runs on PP 8 x VPP 8;
- an explicit layout string (`--pipeline-model-parallel-layout "Et*3|(tt|)*29,m|L"`).

`PipelineSplit` holds the user's choice (what the flags say); `PipelineSplit.resolve` turns any of them
into `PipelineStages`: PP x VPP virtual stages in layer-id order, each a string over Megatron's layout
alphabet (`E` embedding, `t` decoder layer, `m` MTP module, `L` loss and output layer). Parameters,
memory and step time read only the resolved stages, so every spelling costs the same way, and the
checks mirror Megatron's own (`transformer_config.py`, `transformer_block.py`,
`pipeline_parallel_layer_layout.py`), with the messages naming the field and a legal alternative.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import accumulate, pairwise

from pydantic import BaseModel, ConfigDict, Field, model_validator

from megapilot.errors import MegapilotError

EMBEDDING, DECODER, MTP, LOSS = "E", "t", "m", "L"
LAYOUT_ALPHABET = (EMBEDDING, DECODER, MTP, LOSS)
BALANCED = "balanced"

# Megatron's two expansion passes (pipeline_parallel_layer_layout.parse_str_to_list): a parenthesised
# group times n (no nesting: the group is `[^)]+`), then a single character times n.
# An expanded layout holds each layer and stage once: far beyond any model's count, a repeat is a typo.
MAX_LAYOUT_SYMBOLS = 1 << 16
_GROUP_REPEAT = re.compile(r"\(([^)]+)\)\*(\d+)")
_CHAR_REPEAT = re.compile(r"(.)\*(\d+)")


class PipelineSplit(BaseModel):
    """How the layers are split over pipeline ranks, in the flags Megatron takes.

    All fields unset is the even split. `layout` is a Megatron layout string, or `"balanced"` to let
    megapilot compute the most balanced layout Megatron can express (see `balanced_stages`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    first_stage_layers: int | None = Field(
        default=None, ge=1, description="--decoder-first-pipeline-num-layers: decoder layers on PP rank 0.",
    )
    last_stage_layers: int | None = Field(
        default=None, ge=1, description="--decoder-last-pipeline-num-layers: decoder layers on the last PP rank.",
    )
    account_for_embedding: bool = Field(
        default=False, description="--account-for-embedding-in-pipeline-split: the embedding takes a layer slot.",
    )
    account_for_loss: bool = Field(
        default=False, description="--account-for-loss-in-pipeline-split: the loss takes a layer slot.",
    )
    layout: str | None = Field(
        default=None, description="--pipeline-model-parallel-layout string, or 'balanced' to compute one.",
    )

    def __hash__(self) -> int:
        """Its five fields as a plain tuple: the estimator's caches are keyed by the split on every layout the planner
        costs, and pydantic's hash walks the model each time."""
        return hash((self.first_stage_layers, self.last_stage_layers, self.account_for_embedding,
                     self.account_for_loss, self.layout))

    @model_validator(mode="after")
    def _one_vocabulary(self) -> PipelineSplit:
        uneven = self.first_stage_layers is not None or self.last_stage_layers is not None
        accounted = self.account_for_embedding or self.account_for_loss
        if self.layout is not None and (uneven or accounted):
            raise ValueError(
                "pipeline_layout cannot be set with first/last stage layers or the account-for flags "
                "(Megatron: 'pipeline_model_parallel_layout cannot be set with other pipeline layout "
                "arguments'); keep only the layout"
            )
        if uneven and accounted:
            raise ValueError(
                "first/last stage layers cannot be combined with the account-for-embedding/loss flags "
                "(Megatron refuses the pair); use one or the other"
            )
        return self

    @property
    def is_even(self) -> bool:
        return self == EVEN_SPLIT

    @property
    def is_balanced_request(self) -> bool:
        return self.layout == BALANCED

    def label(self) -> str:
        """Short human form for tables: `even`, `first 7/last 7`, `+E+L`, or the layout string."""
        if self.layout is not None:
            return self.layout
        if self.first_stage_layers is not None or self.last_stage_layers is not None:
            ends = [f"first {self.first_stage_layers}" if self.first_stage_layers is not None else "",
                    f"last {self.last_stage_layers}" if self.last_stage_layers is not None else ""]
            return "/".join(e for e in ends if e)
        accounted = ("+E" if self.account_for_embedding else "") + ("+L" if self.account_for_loss else "")
        return accounted or "even"

    def megatron_flags(self) -> list[tuple[str, str | None]]:
        """(flag, value) pairs for a Megatron-LM command line; a None value is a store_true switch."""
        flags: list[tuple[str, str | None]] = []
        if self.first_stage_layers is not None:
            flags.append(("--decoder-first-pipeline-num-layers", str(self.first_stage_layers)))
        if self.last_stage_layers is not None:
            flags.append(("--decoder-last-pipeline-num-layers", str(self.last_stage_layers)))
        if self.account_for_embedding:
            flags.append(("--account-for-embedding-in-pipeline-split", None))
        if self.account_for_loss:
            flags.append(("--account-for-loss-in-pipeline-split", None))
        if self.layout is not None and not self.is_balanced_request:
            flags.append(("--pipeline-model-parallel-layout", self.layout))
        return flags

    def resolve(self, num_layers: int, mtp_num_layers: int, pp: int, vpp: int = 1) -> PipelineStages:
        """The virtual stages this split gives, or a MegapilotError naming the rule Megatron would enforce."""
        return resolve_split(self, num_layers, mtp_num_layers, pp, vpp)


EVEN_SPLIT = PipelineSplit()


@dataclass(frozen=True)
class PipelineStages:
    """PP x VPP virtual stages in layer-id order (VPP-major: stage i is PP rank i % PP, virtual rank i // PP).

    Each stage is a string over `E t m L`; decoder layers are numbered in the order the stages list them.
    """

    pp: int
    vpp: int
    stages: tuple[str, ...]

    def chunk(self, pp_rank: int, vpp_rank: int) -> str:
        return self.stages[vpp_rank * self.pp + pp_rank]

    def rank_items(self, pp_rank: int) -> str:
        """Everything PP rank `pp_rank` holds, its virtual stages in order."""
        return "".join(self.chunk(pp_rank, v) for v in range(self.vpp))

    def decoder_layers(self, pp_rank: int) -> tuple[int, ...]:
        """0-based decoder layers of PP rank `pp_rank`, as Megatron numbers them (get_layer_offset)."""
        return _decoder_layers(self, pp_rank)

    def rank_layer_counts(self) -> tuple[int, ...]:
        return tuple(self.rank_items(r).count(DECODER) for r in range(self.pp))

    def count(self, pp_rank: int, item: str) -> int:
        return self.rank_items(pp_rank).count(item)

    def rank_of(self, item: str) -> int:
        """The PP rank that holds `item` (E or L, or the MTP modules); -1 when absent."""
        return self._item_ranks.get(item, -1)

    @cached_property
    def _item_ranks(self) -> dict[str, int]:
        """Where E, m and L sit, found once (the estimator asks for every layout it costs)."""
        ranks: dict[str, int] = {}
        for index, stage in enumerate(self.stages):
            for item in (EMBEDDING, MTP, LOSS):
                if item in stage and item not in ranks:
                    ranks[item] = index % self.pp
        return ranks

    @property
    def mtp_standalone(self) -> bool:
        """MTP on a PP rank other than the last (Megatron sets mtp_standalone=True then)."""
        rank = self.rank_of(MTP)
        return rank not in (-1, self.pp - 1)

    def layout_string(self) -> str:
        """The stages in Megatron's layout grammar, runs and repeated stages compressed."""
        return compress_layout(self.stages)

    def pretty(self) -> str:
        """One line per PP rank (ranks with the same content merged), as Megatron logs a parsed layout."""
        rows: list[tuple[int, int, str]] = []
        for rank in range(self.pp):
            text = "   ".join(_run_length(self.chunk(rank, v)) or "(empty)" for v in range(self.vpp))
            if rows and rows[-1][2] == text:
                rows[-1] = (rows[-1][0], rank, text)
            else:
                rows.append((rank, rank, text))
        return "\n".join(
            f"PP rank {a}{'' if a == b else f'-{b}'}: {text}" for a, b, text in rows
        )


@lru_cache(maxsize=8192)
def _decoder_layers(stages: PipelineStages, pp_rank: int) -> tuple[int, ...]:
    held: list[int] = []
    next_layer = 0
    for index, stage in enumerate(stages.stages):
        count = stage.count(DECODER)
        if index % stages.pp == pp_rank:
            held.extend(range(next_layer, next_layer + count))
        next_layer += count
    return tuple(held)


# ---- parsing and printing Megatron's grammar ----------------------------------------------------


def parse_layout(layout: str) -> tuple[str, ...]:
    """Megatron's `parse_str_to_list`: commas dropped, `(…)*n` then `x*n` expanded, split on `|`.

    Any character outside `E t m L | ( ) * , digits` (a space too) is refused, as Megatron refuses it.
    """
    def repeated(match: re.Match[str]) -> str:
        block, times = match.group(1), int(match.group(2))
        if len(block) * times > MAX_LAYOUT_SYMBOLS:  # refused before it is built: a typo must not exhaust memory
            raise MegapilotError(f"{match.group(0)!r} in {layout!r} repeats to {len(block) * times:,} symbols; no "
                                 f"model has that many layers or stages", field="pipeline_layout",
                                 fix="count the repeats again: the layout holds each layer once")
        return block * times

    text = _CHAR_REPEAT.sub(repeated, _GROUP_REPEAT.sub(repeated, layout.replace(",", "")))
    if len(text) > MAX_LAYOUT_SYMBOLS:
        raise MegapilotError(f"{layout!r} expands to {len(text):,} symbols; no model has that many layers or stages",
                             field="pipeline_layout", fix="count the repeats again: the layout holds each layer once")
    stages = tuple(text.split("|"))
    for stage in stages:
        for char in stage:
            if char not in LAYOUT_ALPHABET:
                raise MegapilotError(
                    f"invalid layer character {char!r} in {layout!r} (Megatron's layout alphabet is E, t, m, L; "
                    "'|' separates stages, '(…)*n' and 'x*n' repeat, commas are cosmetic, no spaces)",
                    field="pipeline_layout",
                    fix="write the layout like 'Et*3|(tt|)*29,m|L'",
                )
    return stages


def compress_layout(stages: Sequence[str]) -> str:
    """Write stages back in Megatron's grammar: `tttt` -> `t*4`; a block of one to four stages repeated n times
    in a row -> `(s|)*n` / `(s|u|)*n` (the longest stretch wins), so `t*3|t*2|t*3|t*2` reads `(t*3|t*2|)*2`."""
    tokens = [_run_length(stage, sep="") for stage in stages]
    parts: list[str] = []
    i = 0
    while i < len(tokens):
        period, repeats = _longest_repeat(tokens, i)
        block = "|".join(tokens[i:i + period])
        end = i + period * repeats
        last_run = end == len(tokens)
        if repeats == 1:
            parts.append(block + ("" if last_run else "|"))
        elif last_run:  # the string must not end in '|' (that would add an empty stage)
            parts.append(f"({block}|)*{repeats - 1}{block}" if repeats > 2 else f"{block}|{block}")
        else:
            parts.append(f"({block}|)*{repeats}")
        i = end
    return "".join(parts)


def _longest_repeat(tokens: Sequence[str], start: int, max_period: int = 4) -> tuple[int, int]:
    """(period, repeats) of the block starting at `start` that repeats over the most stages (period 1 on ties)."""
    best = (1, 1)
    for period in range(1, max_period + 1):
        block = tokens[start:start + period]
        if len(block) < period:
            break
        repeats = 1
        while tokens[start + repeats * period:start + (repeats + 1) * period] == block:
            repeats += 1
        if repeats > 1 and period * repeats > best[0] * best[1]:
            best = (period, repeats)
    return best


def _run_length(stage: str, sep: str = ",") -> str:
    """`Ettt` -> `E,t*3` (pretty) or `Et*3` (grammar)."""
    runs = [(match.group(0)[0], len(match.group(0))) for match in re.finditer(r"(.)\1*", stage)]
    return sep.join(char if count == 1 else f"{char}*{count}" for char, count in runs)


# ---- resolving a split into stages ---------------------------------------------------------------


@lru_cache(maxsize=4096)
def resolve_split(split: PipelineSplit, num_layers: int, mtp_num_layers: int, pp: int, vpp: int = 1) -> PipelineStages:
    """Turn any split into its virtual stages, refusing what Megatron-Core 0.16 refuses."""
    if pp < 1 or vpp < 1:
        raise MegapilotError(f"pp={pp}, vpp={vpp} must be >= 1", field="pp", fix="use positive pipeline sizes")
    if split.is_balanced_request:
        return balanced_stages(num_layers, mtp_num_layers, pp, vpp)
    if split.layout is not None:
        return _from_layout(split.layout, num_layers, mtp_num_layers, pp, vpp)
    if split.first_stage_layers is not None or split.last_stage_layers is not None:
        return _from_uneven(split, num_layers, mtp_num_layers, pp, vpp)
    return _from_slots(split, num_layers, mtp_num_layers, pp, vpp)


def _place_ends(chunks: list[list[str]], mtp_num_layers: int) -> tuple[str, ...]:
    """Prefix E to the first virtual stage, append the MTP modules and L to the last (no-layout placement)."""
    stages = ["".join(chunk) for chunk in chunks]
    stages[0] = EMBEDDING + stages[0]
    stages[-1] = stages[-1] + MTP * mtp_num_layers + LOSS
    return tuple(stages)


def _stages_from_rank_chunks(per_rank_chunk: Sequence[int], vpp: int) -> list[list[str]]:
    """Decoder layers per virtual stage, VPP-major, from each rank's per-chunk count."""
    return [[DECODER] * per_rank_chunk[rank] for _ in range(vpp) for rank in range(len(per_rank_chunk))]


def _from_slots(split: PipelineSplit, num_layers: int, mtp: int, pp: int, vpp: int) -> PipelineStages:
    """Even split, with the embedding and/or loss optionally taking one layer slot each."""
    accounted = int(split.account_for_embedding) + int(split.account_for_loss)
    slots = num_layers + accounted
    if slots % (pp * vpp):
        raise NoPipelineSplit(
            uneven_split_message(num_layers, pp, vpp, split),
            field="pp" if vpp == 1 else "vpp",
            fix=legal_split_fix(num_layers, mtp, pp, vpp),
        )
    per_chunk = slots // (pp * vpp)
    chunks = _stages_from_rank_chunks([per_chunk] * pp, vpp)
    if split.account_for_embedding:
        chunks[0] = chunks[0][1:]
    if split.account_for_loss:
        chunks[-1] = chunks[-1][1:]
    if per_chunk == 0 or (accounted == 2 and pp * vpp == 1 and per_chunk < 2):
        raise MegapilotError(
            "the account-for flags leave no decoder layer slot in the first/last virtual stage "
            "(Megatron: 'Not enough layers in the first/last virtual pipeline stage')",
            field="pp", fix="use fewer pipeline stages",
        )
    return PipelineStages(pp, vpp, _place_ends(chunks, mtp))


def _from_uneven(split: PipelineSplit, num_layers: int, mtp: int, pp: int, vpp: int) -> PipelineStages:
    check_uneven_split(num_layers, pp, vpp, split.first_stage_layers, split.last_stage_layers)
    counts = uneven_rank_layer_counts(num_layers, pp, split.first_stage_layers, split.last_stage_layers)
    chunks = _stages_from_rank_chunks([count // vpp for count in counts], vpp)
    return PipelineStages(pp, vpp, _place_ends(chunks, mtp))


def uneven_rank_layer_counts(
    num_layers: int, pp: int, first_stage_layers: int | None, last_stage_layers: int | None
) -> tuple[int, ...]:
    """Layers per pipeline rank: the given first/last counts, the rest split equally over the middle ranks."""
    if pp == 1:
        return (num_layers,)
    fixed = [c for c in (first_stage_layers, last_stage_layers) if c is not None]
    middle_ranks = pp - len(fixed)
    per_middle = (num_layers - sum(fixed)) // middle_ranks if middle_ranks else 0
    counts = [per_middle] * pp
    if first_stage_layers is not None:
        counts[0] = first_stage_layers
    if last_stage_layers is not None:
        counts[-1] = last_stage_layers
    return tuple(counts)


def check_uneven_split(
    num_layers: int, pp: int, vpp: int, first_stage_layers: int | None, last_stage_layers: int | None
) -> None:
    """Megatron-Core's uneven-split rules (TransformerConfig.__post_init__): the end counts are >= 1,
    divide by VPP and fit; the rest divides over the middle ranks (x VPP), which exist exactly when
    there are middle layers."""
    if pp == 1:
        raise MegapilotError("an uneven pipeline split needs pp > 1", field="first_stage_layers",
                             fix="drop first_stage_layers/last_stage_layers or raise pp")
    given = {name: count for name, count in
             (("first_stage_layers", first_stage_layers), ("last_stage_layers", last_stage_layers))
             if count is not None}
    for name, count in given.items():
        if count < 1:
            raise MegapilotError(f"{name}={count} must be >= 1", field=name, fix="give that rank at least 1 layer")
        if count % vpp:
            raise MegapilotError(
                f"{name}={count} is not divisible by vpp={vpp}; each of the rank's {vpp} model chunks needs "
                "the same number of layers",
                field=name, fix=f"use a multiple of {vpp}",
            )
    middle_layers = num_layers - sum(given.values())
    middle_ranks = pp - len(given)
    field = next(iter(given))
    described = " and ".join(f"{name}={count}" for name, count in given.items())
    if middle_layers < 0 or bool(middle_layers) != bool(middle_ranks):
        raise MegapilotError(
            f"{described} leave {middle_layers} of num_layers={num_layers} for {middle_ranks} middle "
            f"pipeline ranks; Megatron needs middle layers exactly when there are middle ranks",
            field=field, fix="choose first/last counts that leave at least one layer per middle rank",
        )
    if middle_ranks and middle_layers % (middle_ranks * vpp):
        unit = middle_ranks * vpp
        raise MegapilotError(
            f"{described} leave {middle_layers} layers, not divisible by the {middle_ranks} middle "
            f"pipeline ranks" + (f" x vpp={vpp}" if vpp > 1 else ""),
            field=field, fix=f"choose first/last counts so that num_layers minus them is a multiple of {unit}",
        )


def _from_layout(layout: str, num_layers: int, mtp: int, pp: int, vpp: int) -> PipelineStages:
    """An explicit layout string, checked as `PipelineParallelLayerLayout.validate_layer_layout` does."""
    stages = parse_layout(layout)
    if len(stages) % pp:
        raise MegapilotError(
            f"the layout has {len(stages)} stages, not divisible by pp={pp} (Megatron: 'The length of "
            "pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size')",
            field="pipeline_layout", fix=f"write pp x vpp stages, e.g. {pp} or {2 * pp}",
        )
    implied_vpp = len(stages) // pp
    if vpp not in (1, implied_vpp):
        raise MegapilotError(
            f"vpp={vpp} conflicts with the layout's {len(stages)} stages / pp={pp} = {implied_vpp} virtual stages",
            field="vpp", fix=f"drop vpp (the layout implies {implied_vpp}) or write {pp * vpp} stages",
        )
    resolved = PipelineStages(pp, implied_vpp, stages)
    _check_layout_items(resolved, num_layers, mtp)
    return resolved


def _check_layout_items(resolved: PipelineStages, num_layers: int, mtp: int) -> None:
    flat = "".join(resolved.stages)

    def refuse(problem: str, fix: str) -> MegapilotError:
        return MegapilotError(problem, field="pipeline_layout", fix=fix)

    if not flat.startswith(EMBEDDING) or flat.count(EMBEDDING) != 1:
        raise refuse("the layout must start with the embedding 'E' and name it exactly once",
                     "begin the first stage with E")
    if not flat.endswith(LOSS) or flat.count(LOSS) != 1:
        raise refuse("the layout must end with the loss 'L' and name it exactly once", "end the last stage with L")
    if flat.count(DECODER) != num_layers:
        raise refuse(f"the layout has {flat.count(DECODER)} decoder layers 't' but the model has {num_layers}",
                     f"write exactly {num_layers} t")
    if flat.count(MTP) != mtp:
        raise refuse(f"the layout has {flat.count(MTP)} MTP layers 'm' but the model has mtp_num_layers={mtp}",
                     f"write exactly {mtp} m")
    if MTP in flat and DECODER in flat[flat.index(MTP):]:
        raise refuse("decoder layers must be placed before MTP layers", "move every m after the last t")
    holders = [i for i, stage in enumerate(resolved.stages) if MTP in stage]
    if len(holders) > 1:
        raise refuse("all MTP layers must be in the same virtual stage", "put every m in one stage")
    if holders and holders[0] // resolved.pp != resolved.vpp - 1:
        raise refuse("MTP must sit in the last virtual stage of its PP rank", "move m into a last-round stage")
    if holders and resolved.vpp > 1 and holders[0] % resolved.pp == 0:
        raise refuse("MTP must not be on the first PP rank", "move m to a later rank")


# ---- the most balanced layout ------------------------------------------------------------------


@dataclass(frozen=True)
class StageWeights:
    """Relative cost of each layout item, in units of one decoder layer's step time.

    `decoder` may vary per layer (dense-first layers of an MoE model are lighter); the embedding is a
    lookup, the loss is the logits GEMM plus cross-entropy, an MTP module is a layer plus its own logits.
    """

    decoder: tuple[float, ...]
    embedding: float = 0.0
    loss: float = 0.0
    mtp: float = 0.0


def uniform_weights(num_layers: int, mtp_num_layers: int) -> StageWeights:
    """Every decoder layer costs 1; the loss and an MTP module cost about one layer each (the logits GEMM
    of a large vocabulary is the cost of a layer within a factor of two for 4k–16k-wide models)."""
    return StageWeights(decoder=(1.0,) * num_layers, embedding=0.0, loss=1.0, mtp=2.0 if mtp_num_layers else 0.0)


def balanced_stages(
    num_layers: int, mtp_num_layers: int, pp: int, vpp: int = 1, weights: StageWeights | None = None
) -> PipelineStages:
    """The layout Megatron can express whose heaviest virtual stage is lightest.

    The items E, t…t, m…m, L are cut into PP x VPP contiguous stages (Megatron's layout keeps layer-id
    order) minimising the largest stage cost (a linear partition, solved by bisection on the bound
    with a greedy fill); the MTP modules travel as one block into the last stage, so the result always
    passes Megatron's MTP rules. Of the cuts under that bound, one whose largest stage holds the fewest decoder
    layers (`_fewest_layers_per_stage`): a stage's activations go with its layers, not its time.
    """
    w = weights or uniform_weights(num_layers, mtp_num_layers)
    items = [EMBEDDING] + [DECODER] * num_layers + [MTP * mtp_num_layers + LOSS]
    costs = [w.embedding] + list(w.decoder) + [w.loss + w.mtp * mtp_num_layers]
    count = pp * vpp
    cuts = list(_fewest_layers_per_stage(tuple(costs), count))
    stages = tuple("".join(items[a:b]) for a, b in pairwise(cuts))
    return PipelineStages(pp, vpp, stages)


@lru_cache(maxsize=4096)
def _fewest_layers_per_stage(costs: tuple[float, ...], parts: int) -> tuple[int, ...]:
    """`_linear_partition`'s cuts, recut under the same bound so that no stage holds more decoder layers than some
    stage must (the items between the embedding and the loss are the layers). A time-balanced cut packs cheap
    layers together: DeepSeek-V3 on PP 8 x VPP 4 put its three dense-first layers beside the embedding, Et*3|...,
    and 94.7 GiB on an 80 GiB H100's first rank, where two to a stage (Et*2|..., as the recipe's Et|(tt|)*30mL)
    keep it under 80."""
    cuts = _linear_partition(costs, parts)
    limit = max(sum(costs[a:b]) for a, b in pairwise(cuts)) * (1 + 1e-12)
    counts = [0] + [1] * (len(costs) - 2) + [0]
    most = max(sum(counts[a:b]) for a, b in pairwise(cuts))
    for cap in range(math.ceil(sum(counts) / parts), most):
        capped = (_cut(costs, parts, limit, even=True, counts=counts, cap=cap)
                  or _cut(costs, parts, limit, counts=counts, cap=cap))
        if capped is not None and all(a < b for a, b in pairwise(capped)):
            return tuple(capped)
    return tuple(cuts)


def _linear_partition(costs: Sequence[float], parts: int) -> list[int]:
    """Boundaries [0, …, n] of `parts` contiguous groups minimising the largest group's sum.

    Bisection finds the smallest feasible bound (the greedy fill is feasible iff any partition is);
    the groups are then filled towards the mean of what is left, never above the bound, so the slack
    spreads over every stage instead of piling onto the last one. The planner cuts the same weights
    for many layouts, so the cuts are kept per (costs, parts).
    """
    return list(_cached_partition(tuple(costs), parts))


@lru_cache(maxsize=4096)
def _cached_partition(costs: tuple[float, ...], parts: int) -> tuple[int, ...]:
    if all(0.0 <= cost < math.inf for cost in costs):
        high = _replayed_bound(costs, parts)
    else:  # the replay leans on non-negative sums growing along a group; anything else walks the bisection
        high = _bisected_bound(costs, parts)
    return tuple(_fill(costs, parts, high, even=True) or _fill(costs, parts, high) or [0] * parts + [len(costs)])


def _bisected_bound(costs: Sequence[float], parts: int) -> float:
    """The bound 60 halvings of [max, sum] settle on: the smallest one `_fill` accepts, to float precision."""
    low, high = max(costs), sum(costs)
    for _ in range(60):
        mid = (low + high) / 2
        if _fill(costs, parts, mid) is None:
            low = mid
        else:
            high = mid
    return high


def _replayed_bound(costs: Sequence[float], parts: int) -> float:
    """`_bisected_bound`, bit for bit, from about ten fills instead of sixty.

    `_fill` sees its limit only through `load + cost > limit` and `load > limit`, where `load + cost` is the
    float sum of the costs from the group's first item, added in order. So whether a limit fits changes only at
    one of those sums, and for non-negative costs it is monotone (a group that starts later or may hold more
    ends no earlier): a limit fits iff it is at least the least fitting sum `least`. That sum is found by
    halving the sorted sums (nearly all of them ruled out first by the mean-and-largest-cost bracket), and the
    bisection is then replayed with `limit >= least` standing for a fill, so its bound is the same float.
    """
    least = _least_fitting_limit(costs, parts)
    low, high = max(costs), sum(costs)
    for _ in range(60):
        mid = (low + high) / 2
        if mid * (1 + 1e-12) < least:
            low = mid
        else:
            high = mid
    return high


def _least_fitting_limit(costs: Sequence[float], parts: int) -> float:
    """The least group sum at which `_cut` fits all items into `parts` groups (costs non-negative and finite)."""
    largest = max(costs)
    guess = max(largest, sum(costs) / parts)
    below, above = guess * (1 - 1e-9), guess + largest  # checked, not assumed: widened where they do not hold
    if _cut(costs, parts, below) is not None:
        below = -math.inf
    if _cut(costs, parts, above) is None:
        above = math.inf
    rows = [list(accumulate(costs[start:])) for start in range(len(costs))]  # group sums, summed as `_cut` does
    sums = sorted({total for row in rows for total in row[bisect_right(row, below):bisect_right(row, above)]})
    lo, hi = 0, len(sums) - 1  # the least fitting sum is in the bracket, so its largest sum fits
    while lo < hi:
        mid = (lo + hi) // 2
        if _cut(costs, parts, sums[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    return sums[lo]


def _fill(costs: Sequence[float], parts: int, bound: float, *, even: bool = False) -> list[int] | None:
    """Cut under `bound`; `even` also closes a group once it reached the mean of what is left."""
    return _cut(costs, parts, bound * (1 + 1e-12), even=even)


def _cut(costs: Sequence[float], parts: int, limit: float, *, even: bool = False,
         counts: Sequence[int] = (), cap: int = 0) -> list[int] | None:
    """`_fill` with the bound's float tolerance already applied: no group sums to more than `limit` (nor, given
    `counts`, counts more than `cap` of them)."""
    cuts, load, n, held = [0], 0.0, len(costs), 0
    remaining = sum(costs)
    for i, cost in enumerate(costs):
        groups_left = parts - len(cuts) + 1  # including the open one
        target = remaining / groups_left
        full = (load + cost > limit or (even and load > 0 and load + cost / 2 > target)
                or (bool(counts) and held + counts[i] > cap))
        if i > cuts[-1] and (full or n - i <= groups_left - 1):
            cuts.append(i)
            remaining -= load
            load, held = 0.0, 0
            if len(cuts) > parts:
                return None
        load += cost
        held += counts[i] if counts else 0
    if load > limit or (counts and held > cap):
        return None
    while len(cuts) < parts:  # fewer items than stages: the rest are empty stages at the end
        cuts.append(n)
    cuts.append(n)
    return cuts


class NoPipelineSplit(MegapilotError):
    """The layers do not divide over PP x VPP and no split was given: the one refusal a balanced split answers
    (`estimate` prices that split where a published layout leaves its split out)."""


# ---- messages ----------------------------------------------------------------------------------


def uneven_split_message(num_layers: int, pp: int, vpp: int, split: PipelineSplit) -> str:
    accounted = int(split.account_for_embedding) + int(split.account_for_loss)
    slots = f"num_layers={num_layers}" + (f" + {accounted} accounted slot(s) = {num_layers + accounted}"
                                          if accounted else "")
    return f"{slots} is not divisible by pp*vpp={pp}*{vpp}={pp * vpp} and no pipeline split is given"


def legal_split_fix(num_layers: int, mtp_num_layers: int, pp: int, vpp: int) -> str:
    """The options that would make this PP x VPP legal, each with a concrete value that works."""
    options: list[str] = []
    stages = pp * vpp
    for embedding, loss in ((True, True), (True, False), (False, True)):
        if (num_layers + embedding + loss) % stages == 0:
            named = [name for name, on in (("account_for_embedding", embedding), ("account_for_loss", loss)) if on]
            flags = [f"--account-for-{name.removeprefix('account_for_')}-in-pipeline-split" for name in named]
            options.append(f"{' and '.join(named)} ({' '.join(flags)})")
    example = _uneven_example(num_layers, pp, vpp)
    if example is not None:
        options.append(f"first_stage_layers={example[0]} and last_stage_layers={example[1]} "
                       f"(--decoder-first-pipeline-num-layers {example[0]} "
                       f"--decoder-last-pipeline-num-layers {example[1]})")
    layout = balanced_stages(num_layers, mtp_num_layers, pp, vpp).layout_string()
    options.append(f"pipeline_layout \"{layout}\" (--pipeline-model-parallel-layout; or --pp-layout balanced)")
    divisors = [d for d in range(1, num_layers + 1) if num_layers % d == 0]
    options.append(f"pp*vpp from {', '.join(map(str, divisors))}")
    return "; or ".join(options)


def _uneven_example(num_layers: int, pp: int, vpp: int) -> tuple[int, int] | None:
    """First/last counts (equal where possible, lighter ends) that Megatron accepts, or None."""
    if pp < 3:
        return None
    middle = pp - 2
    for per_middle in range(-(-num_layers // pp), 0, -1):
        rest = num_layers - per_middle * middle
        if per_middle % vpp or rest < 2:
            continue
        first = (rest // 2) // vpp * vpp
        last = rest - first
        if first >= vpp and last >= vpp and first % vpp == 0 and last % vpp == 0:
            return first, last
    return None
