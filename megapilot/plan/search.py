"""Search over parallel layouts: enumerate the legal ones, prune by memory, rank by throughput.

How the space is walked (each step cuts what the next would otherwise have to cost; every cut is
counted in `rejected` under its reason):

1. **Rules.** TP, PP, CP, DP, EP, ETP and VPP values come from divisor enumeration (`space.py`); a
   value that breaks a Megatron rule is never costed. A PP that does not divide the layers is not
   dropped: `space.pipeline_splits` gives it one or two uneven splits (lighter first/last ranks,
   sized by what the embedding and the output layer weigh in layers), each walked as its own shape.
2. **Two-stage costing.** The estimator's memory stage runs first; the full estimate (step time)
   only for layouts that fit (`cost.CostModel`).
3. **Memory floor.** Each shape (TP, PP, CP, EP, ETP, FSDP) is checked once at its smallest
   footprint (MBS 1, full recompute of every layer). If that does not fit, nothing in the shape
   can. Expert weights per GPU only grow as EP shrinks, so EP is walked from the largest value down
   and stops at the first EP whose floor does not fit.
4. **Recompute ladder.** Recompute options run from cheapest in time to smallest in memory (none,
   selective, full on part of the layers, full on all); memory falls monotonically along it, so the
   first rung that fits is found by bisection and kept: more recompute only adds time. At PP 1, where
   the host link has room (`offload_has_room`), the other way to fit without recomputing is costed
   beside it: activation offload of the fewest layers that fit (`--cpu-offloading-num-layers`, again by
   bisection), and the faster of the two wins the shape.
5. **MBS walk.** Memory grows with MBS, so the first fitting rung can only move up (each MBS starts
   where the previous stopped) and once nothing fits the larger MBS are skipped. Throughput is
   unimodal in MBS (GEMM efficiency saturates while the pipeline gets fewer micro-batches): the
   walk stops once it falls. VPP likewise (the bubble shrinks as 1/VPP while send/recv and in-flight
   activations grow), and it also stops once the bubble is inside the tie band. PPs that need an
   uneven split are skipped once throughput fell from a smaller PP whose best layout ran without
   memory relief (no recompute, Megatron-FSDP or activation offload: memory no longer binds, so more
   stages only add bubble and send/recv), or where even removing all that a deeper pipeline can remove
   would not bring them within the error band of the fastest. PPs with an even split are all walked,
   so nothing an even-only search finds is lost.
6. **Dominated options.** CP beyond what memory needs is walked only while it pays: at a fixed global
   batch it takes ranks from DP, so each replica runs more micro-batches and the bubble shrinks, but it
   also adds ring traffic; the walk stops at the first such CP that is no faster than the one below
   (none at PP 1, or once the bubble is inside the tie band), and a larger CP that ends no faster than
   the same layout at a smaller CP is dropped. FSDP where memory does not bind (more all-gathers than
   the distributed optimizer, nothing gained) is skipped. Sequence parallelism is on whenever TP > 1
   and the distributed optimizer always on: both cut memory and move the same bytes as the all-reduce
   they replace.

Ranking: predicted tokens/s/GPU (within 0.2 % counts as a tie), then lower memory, then the
simpler layout. `tests/plan/test_search.py` checks the pruned search against brute force. The planner
then re-orders the best layout of each shape that lies within the estimator's own error of the fastest
by the recipes' preferences (`preferences.py`).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from megapilot.estimate import LOW_HEADROOM_FRACTION
from megapilot.plan import space
from megapilot.plan.cost import CostModel, LayoutEstimator, MemoryCheck
from megapilot.plan.preferences import variant_penalty
from megapilot.plan.reasons import bubble_share, component_share, layout_label
from megapilot.plan.space import Pins, Rejection, RejectReason
from megapilot.spec import (
    ClusterSpec,
    EstimateResult,
    ModelSpec,
    ParallelConfig,
    SavedPlan,
    TrainingSpec,
)
from megapilot.spec.parallel import CpCommType, Recompute, RecomputeMethod
from megapilot.spec.training import QuantFlavour
from megapilot.spec.validate import cp_comm_type_for, light_recompute_modules, most_offloaded_layers

TIE_BAND = 1.002  # throughputs within 0.2 % rank as equal; memory and simplicity break the tie
KEEP_PER_SEARCH = 64  # best layouts kept for the ranking and the runner-up comparisons
# Shapes kept, each faster than a shape's bound, before that shape is left unwalked: a plan shows up to this many
# (planner.DEFAULT_TOP), and a shape outside the error band still fills a place when fewer lie inside it.
SHAPES_BEFORE_PRUNING = 5
# The step-time components a deeper pipeline can shrink (the breakdown keys of `megapilot.estimate`).
PIPELINE_REMOVABLE = ("pp_bubble", "pp_comm", "dp_comm", "recompute", "cpu_offload")
# Activation offload is walked where the host link carries at least this multiple of the NIC's bandwidth: the
# copies at the NIC's rate and the NIC's own traffic where they share the link (`offload_has_room`).
OFFLOAD_HOST_LINK_OVER_NIC = 2.0


class RecomputeRung(NamedTuple):
    """One step of the recompute ladder: the ParallelConfig recompute fields it sets."""

    recompute: Recompute
    method: RecomputeMethod = "uniform"
    num_layers: int | None = None
    modules: tuple[str, ...] | None = None  # selective: --recompute-modules (None: Megatron's core_attn)
    offload_layers: int = 0  # --cpu-offloading-num-layers: activations of that many layers kept in host memory


# The smallest footprint any layout can have: every layer's forward recomputed.
FULL_RECOMPUTE = RecomputeRung("full", "uniform", 1)
NO_RECOMPUTE = RecomputeRung("none")


@dataclass(frozen=True)
class Shape:
    """A layout before its MBS and recompute are chosen: what the memory floor is checked for.

    Sequence parallelism is on whenever TP > 1 and the distributed optimizer always on (see the
    module doc); `etp` is None when expert TP equals TP, as ParallelConfig writes it.
    """

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    etp: int | None
    fsdp: bool
    split: space.PipelineSplit
    vpp: int = 1
    distributed_optimizer: bool = True  # off with Muon, which Megatron refuses beside it
    cp_comm_type: CpCommType = "p2p"  # a2a on attention-sink models (`space.cp_comm_type_for`)

    def with_vpp(self, vpp: int, split: space.PipelineSplit) -> Shape:
        """The shape at `vpp`, running `split` (a layout string cut for that VPP)."""
        return Shape(self.tp, self.cp, self.pp, self.dp, self.ep, self.etp, self.fsdp, split, vpp,
                     self.distributed_optimizer, self.cp_comm_type)

    def layout(self, mbs: int, rung: RecomputeRung) -> ParallelConfig:
        return ParallelConfig(
            tp=self.tp, cp=self.cp, cp_comm_type=self.cp_comm_type, pp=self.pp, dp=self.dp, ep=self.ep, etp=self.etp,
            vpp=self.vpp,
            sequence_parallel=self.tp > 1, distributed_optimizer=self.distributed_optimizer, fsdp=self.fsdp,
            first_stage_layers=self.split.first_stage_layers, last_stage_layers=self.split.last_stage_layers,
            account_for_embedding=self.split.account_for_embedding, account_for_loss=self.split.account_for_loss,
            pipeline_layout=self.split.layout, mbs=mbs,
            recompute=rung.recompute, recompute_method=rung.method, recompute_num_layers=rung.num_layers,
            recompute_modules=rung.modules,  # type: ignore[arg-type]  # names from light_recompute_modules
            cpu_offloading_num_layers=rung.offload_layers,
        )


class Fit(NamedTuple):
    """A layout that fits and the estimator's numbers for it."""

    parallel: ParallelConfig
    estimate: EstimateResult


class MemoryBinding(NamedTuple):
    """Whether memory forced recompute (or a skip) on any MBS of a shape, and on its smallest MBS."""

    bound_any: bool
    bound_smallest: bool


class MicrobatchWalk(NamedTuple):
    """What walking the MBS values of one shape found: its best estimate, and how memory bound it."""

    best: EstimateResult | None
    binding: MemoryBinding


class Climb(NamedTuple):
    """The least recompute that fits at one MBS (None when no rung fits) and its rung index."""

    estimate: EstimateResult | None
    rung: int


class Candidate(BaseModel):
    """One ranked layout: the layout, the estimator's numbers for it, and why it looks as it does."""

    model_config = ConfigDict(extra="forbid")

    parallel: ParallelConfig
    estimate: EstimateResult
    reasons: list[str] = Field(default_factory=list)
    # The flex dispatcher backend the layout was costed with (its expert group leaves the NVLink domain); None:
    # alltoall. The plan file carries it, and the launch script writes it.
    moe_flex_dispatcher: str | None = None


class PlanResult(BaseModel):
    """Ranked candidates plus what was cut and why; `to_saved_plan` feeds the launch-script command."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    candidates: list[Candidate]
    rejected: dict[str, int]
    # why the runners-up lost, and which are one layout with and without FSDP; the ties are not stored (`ties`)
    summary: list[str] = Field(default_factory=list)
    layouts_costed: int = 0
    memory_checks: int = 0
    layouts_fitting: int = 0

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def why_the_others(self) -> list[str]:
        """The summary, then the ties of the candidates as they stand."""
        return [*self.summary, *self.ties()]

    def ties(self) -> list[str]:
        """The runners-up whose prediction lies inside the top pick's 80 % interval: the model cannot tell them apart
        from it, so what else separates them (memory left free) is said, and the one with the most headroom named.
        Drawn from the candidates as they stand, never stored: once their estimates are calibrated on a cluster's
        runs (`plan --cluster`), the ties are judged by the calibrated interval the plan shows for #1."""
        best = self.best.estimate
        low, high = best.tokens_per_s_per_gpu_p10, best.tokens_per_s_per_gpu_p90
        if low is None or high is None:
            return []
        tied = [(rank, c) for rank, c in enumerate(self.candidates[1:], start=2)
                if low <= c.estimate.tokens_per_s_per_gpu <= high]
        if not tied:
            return []

        def free_gib(est: EstimateResult) -> float:
            return est.memory_gib.capacity - est.memory_gib.total

        lines = [f"inside #1's 80 % interval ({low:,.0f}-{high:,.0f} tokens/s/GPU), a tie by the model's error: "
                 + ", ".join(f"#{rank} ({free_gib(c.estimate):.1f} GiB free)" for rank, c in tied)
                 + f"; #1 leaves {free_gib(best):.1f} GiB free"]
        roomiest_rank, roomiest = max(tied, key=lambda rc: free_gib(rc[1].estimate))
        if free_gib(roomiest.estimate) > free_gib(best) + 1.0:
            lines.append(f"among the ties, #{roomiest_rank} {layout_label(roomiest.parallel)} leaves the most memory "
                         "free: prefer it if #1 runs out of memory or the run needs room (longer sequences, larger "
                         "micro-batches)")
        return lines

    def shell(self) -> str:
        block = self.best.parallel.shell_block(self.training.global_batch_size)
        # the dispatcher the estimate was priced with: `estimate` reproduces it only when told
        backend = self.best.moe_flex_dispatcher
        return block + (f" MOE_DISPATCHER=flex MOE_FLEX_BACKEND={backend}" if backend else "")

    def product_check(self) -> str:
        """The world-size product written out, e.g. `4×4×2×2 = 64 GPUs` (TP×PP×CP×DP)."""
        p = self.best.parallel
        text = f"TP×PP×CP×DP = {p.tp}×{p.pp}×{p.cp}×{p.dp} = {p.world_size} GPUs"
        if self.model.moe is not None:  # Megatron carves the expert groups out of each stage's TP×CP×DP ranks
            text += (f"; experts: ETP×EP×expert-DP = {p.expert_tp}×{p.ep}×{p.expert_dp} = "
                     f"{p.expert_tp * p.ep * p.expert_dp} = TP×CP×DP")
        return text

    def to_saved_plan(self, index: int = 0) -> SavedPlan:
        chosen = self.candidates[index]
        return SavedPlan(model=self.model, cluster=self.cluster, training=self.training,
                         parallel=chosen.parallel, estimate=chosen.estimate,
                         reasons=chosen.reasons + self.why_the_others(),
                         moe_flex_dispatcher=chosen.moe_flex_dispatcher)  # type: ignore[arg-type]  # a backend name

    def to_json(self) -> dict[str, object]:
        """The stable `megapilot plan --json` document."""
        return {
            "candidates": [c.model_dump(mode="json") for c in self.candidates],
            "rejected": dict(self.rejected),
            "summary": self.why_the_others(),
            "shell": self.shell(),
            "product_check": self.product_check(),
            "layouts_costed": self.layouts_costed,
            "memory_checks": self.memory_checks,
            "layouts_fitting": self.layouts_fitting,
        }


@dataclass
class SearchOutcome:
    """The raw result of one search: ranked fits, rejection counts and the tightest miss."""

    ranked: list[Fit]
    rejected: Counter[RejectReason]
    layouts_costed: int
    layouts_fitting: int
    smallest_floor: tuple[ParallelConfig, MemoryCheck] | None = None
    cost: CostModel | None = field(default=None, repr=False)
    # The best fitting layout for each value of each dimension, e.g. ("tp", 4): what the reasons
    # compare the winner with ("the best layout with TP=4 is 8 % slower").
    best_by: dict[tuple[str, object], Fit] = field(default_factory=dict)
    # The best fitting layout of every parallel shape (`shape_key`): what the recipe tie-break orders, so a
    # shape inside the error band is never lost behind more than KEEP_PER_SEARCH faster variants of others. Inside
    # the band it is the variant the rules prefer (`_Search._representatives`); `fastest_by_shape` keeps the fastest.
    best_by_shape: dict[ShapeKey, Fit] = field(default_factory=dict)
    fastest_by_shape: dict[ShapeKey, Fit] = field(default_factory=dict)


# ---- ranking ----------------------------------------------------------------------------------

def simplicity(p: ParallelConfig) -> tuple[int, int, int]:
    """Fewer parallel dimensions in use, then smaller model-parallel groups, then less recompute."""
    dims_in_use = sum(x > 1 for x in (p.tp, p.pp, p.vpp, p.cp, p.ep)) + p.fsdp
    recompute_rank = {"none": 0, "selective": 1, "full": 2}[p.recompute]
    return dims_in_use, p.tp * p.pp * p.vpp * p.cp * p.ep, recompute_rank


RankKey = tuple[int, float, tuple[int, int, int]]
ShapeKey = tuple[int, int, int, int, bool]


def shape_key(p: ParallelConfig) -> ShapeKey:
    """The parallel shape (TP, PP, CP, EP, FSDP or not): VPP, MBS, recompute and the experts' TP are tuning of one
    shape; two candidates that differ only there are one alternative shown twice."""
    return p.tp, p.pp, p.cp, p.ep, p.fsdp


def rank_key(p: ParallelConfig, est: EstimateResult) -> RankKey:
    """Sort key: throughput band (higher first), then memory, then simplicity."""
    band = math.floor(math.log(max(est.tokens_per_s_per_gpu, 1e-9)) / math.log(TIE_BAND))
    return (-band, est.memory_gib.total, simplicity(p))


def dimension_values(p: ParallelConfig) -> tuple[tuple[str, object], ...]:
    """The (dimension, value) pairs a layout stands for in `SearchOutcome.best_by`."""
    return (("tp", p.tp), ("pp", p.pp), ("vpp", p.vpp), ("cp", p.cp), ("ep", p.ep), ("etp", p.expert_tp),
            ("mbs", p.mbs), ("fsdp", p.fsdp), ("recompute", p.recompute))


# ---- the search -------------------------------------------------------------------------------

def recompute_ladder(
    model: ModelSpec, pp: int, vpp: int, split: space.PipelineSplit = space.EVEN_SPLIT,
    flavour: QuantFlavour | None = None,
) -> list[RecomputeRung]:
    """Recompute settings from the cheapest in time to the smallest in memory.

    After the attention core (selective), the light modules the MoE and MLA recipes recompute
    (`light_recompute_modules`); then block recompute, which counts layers per model chunk: with an uneven
    split the largest chunk (a middle rank's) sets the choices, and the lighter end ranks recompute all of
    theirs when asked for more.
    """
    stages = split.resolve(model.num_layers, model.mtp_num_layers, pp, vpp)
    layers_per_chunk = max(stage.count("t") for stage in stages.stages)
    ladder = [RecomputeRung("none"), RecomputeRung("selective")]
    if light := light_recompute_modules(model, flavour):
        ladder.append(RecomputeRung("selective", modules=light))
    partial = sorted({max(1, layers_per_chunk * q // 4) for q in (1, 2, 3)} - {layers_per_chunk})
    ladder += [RecomputeRung("full", "block", k) for k in partial]
    ladder.append(FULL_RECOMPUTE)
    return ladder


class _Search:
    def __init__(self, cost: CostModel, pins: Pins, reach: float | None = None):
        self.cost = cost
        self.model, self.cluster, self.training = cost.model, cost.cluster, cost.training
        self.pins = pins
        self.reach = reach
        self.rejected: Counter[RejectReason] = Counter()
        self.heap: list[tuple[_Inverted, int, ParallelConfig, EstimateResult]] = []  # the best so far, worst on top
        self.fitting = 0
        self.counter = 0
        self.smallest_floor: tuple[ParallelConfig, MemoryCheck] | None = None
        self.best_by: dict[tuple[str, object], Fit] = {}
        self._best_by_key: dict[tuple[str, object], RankKey] = {}
        self.best_by_shape: dict[ShapeKey, Fit] = {}
        self._best_by_shape_key: dict[ShapeKey, RankKey] = {}
        # each shape's best variant per recipe penalty (`variant_penalty`), from which `_representatives` shows it
        self._shape_variants: dict[ShapeKey, dict[tuple[int, int], Fit]] = {}
        self._best_at: dict[tuple[int, int], Fit] = {}  # (tp, pp) -> its fastest layout so far

    # -- bookkeeping
    def _reject(self, rejection: Rejection | None, count: int = 1) -> bool:
        if rejection is None:
            return False
        self.rejected[rejection.category] += count
        return True

    def _keep(self, parallel: ParallelConfig, est: EstimateResult) -> None:
        shape = (parallel.tp, parallel.pp)
        held = self._best_at.get(shape)
        if held is None or est.tokens_per_s_per_gpu > held.estimate.tokens_per_s_per_gpu:
            self._best_at[shape] = Fit(parallel, est)
        self.fitting += 1
        self.counter += 1
        key = rank_key(parallel, est)
        for dim_value in dimension_values(parallel):
            held_key = self._best_by_key.get(dim_value)
            if held_key is None or key < held_key:
                self._best_by_key[dim_value] = key
                self.best_by[dim_value] = Fit(parallel, est)
        parallel_shape = shape_key(parallel)
        held_shape_key = self._best_by_shape_key.get(parallel_shape)
        if held_shape_key is None or key < held_shape_key:
            self._best_by_shape_key[parallel_shape] = key
            self.best_by_shape[parallel_shape] = Fit(parallel, est)
        variants = self._shape_variants.setdefault(parallel_shape, {})
        penalty = variant_penalty(parallel, est)
        held_variant = variants.get(penalty)
        if held_variant is None or key < rank_key(*held_variant):
            variants[penalty] = Fit(parallel, est)
        entry = (_Inverted(key), self.counter, parallel, est)
        if len(self.heap) < KEEP_PER_SEARCH:
            heapq.heappush(self.heap, entry)
        elif key < self.heap[0][0].key:
            heapq.heapreplace(self.heap, entry)

    def _note_floor(self, parallel: ParallelConfig, memory: MemoryCheck) -> None:
        if self.smallest_floor is None or memory.total_gib < self.smallest_floor[1].total_gib:
            self.smallest_floor = (parallel, memory)

    # -- the walk
    def run(self) -> SearchOutcome:
        world = self.cluster.world_size
        for tp in space.tp_values(world, self.pins):
            if self._reject(space.tp_rule(self.model, self.cluster, tp)):
                continue
            self._walk_pipeline(tp)
        dominated = self._cp_without_gain()
        fastest_by_shape = dict(self.best_by_shape)
        self.best_by_shape = self._representatives()
        ranked = [Fit(p, est) for _, _, p, est in sorted(self.heap, key=lambda e: e[0].key)
                  if shape_key(p) not in dominated]
        # `+` drops the reasons counted zero times (a climb whose first rung fits adds 0): none is a cut
        return SearchOutcome(ranked=ranked, rejected=+self.rejected, layouts_costed=self.cost.calls,
                             layouts_fitting=self.fitting, smallest_floor=self.smallest_floor, cost=self.cost,
                             best_by=self.best_by, best_by_shape=self.best_by_shape,
                             fastest_by_shape=fastest_by_shape)

    def _representatives(self) -> dict[ShapeKey, Fit]:
        """The variant each shape is shown by: among its variants (VPP, MBS, recompute, offload) whose throughput is
        within `reach` (the model's error band) of the shape's fastest, the one the recipe preferences hold least
        against (no exotic flag, memory headroom), then the fastest. The rules order shapes by their shown variant:
        a shape whose fastest variant needs activation offload, or fills HBM to its last GiB, while another variant
        inside the band needs neither, is such a layout as far as the prediction can tell."""
        shown: dict[ShapeKey, Fit] = {}
        for shape, fastest in self.best_by_shape.items():
            floor = fastest.estimate.tokens_per_s_per_gpu / (1 + (self.reach or 0.0))
            near = [fit for fit in self._shape_variants[shape].values() if fit.estimate.tokens_per_s_per_gpu >= floor]
            shown[shape] = min(near, key=lambda fit: (variant_penalty(*fit), rank_key(*fit)), default=fastest)
        return shown

    def _cp_without_gain(self) -> set[ShapeKey]:
        """The shapes whose CP the walk tried beyond what memory needs and that came out no faster (within the tie
        band) than the same TP, PP, EP and FSDP at a smaller CP: dropped (counted as dominated CP), since trading
        data-parallel ranks and micro-batch size for ring traffic bought nothing; shown, they would only repeat
        the smaller-CP layout."""
        dominated: set[ShapeKey] = set()
        for key, fit in self.best_by_shape.items():
            tp, pp, cp, ep, fsdp = key
            speed = fit.estimate.tokens_per_s_per_gpu
            if any((tp, pp, smaller, ep, fsdp) in self.best_by_shape and
                   self.best_by_shape[(tp, pp, smaller, ep, fsdp)].estimate.tokens_per_s_per_gpu * TIE_BAND >= speed
                   for smaller in space.divisors(cp)[:-1]):
                dominated.add(key)
        for key in dominated:
            del self.best_by_shape[key]
        self.rejected[RejectReason.DOMINATED_CP] += len(dominated)
        return dominated

    def _walk_pipeline(self, tp: int) -> None:
        """PP upwards, each with its layer splits (the even one, or a few uneven ones).

        Every PP with an even split is walked. PPs that need an uneven split are skipped once a PP
        came out slower than the best smaller PP while that best ran without memory relief (recompute,
        Megatron-FSDP, activation offload): memory no longer bound it, so more stages only add bubble and
        send/recv (and uneven splits rarely allow the interleaving that would hide it). A best that needed
        FSDP is still memory-bound: deeper stages hold fewer weights (an MoE model's experts above all) and
        may run without it. Such a deeper PP is still skipped where it cannot reach the error band
        (`_deeper_pipeline_cannot_reach`).
        """
        pps = space.pp_values(self.cluster.world_size // tp, self.model, self.pins)
        best_so_far: Fit | None = None  # the fastest layout at a smaller PP
        fell = False
        deepest: int | None = None  # the deepest PP walked so far that fit
        for pp in pps:
            splits = space.pipeline_splits(self.model, pp)
            if not splits:
                self._reject(space.pp_rule(self.model, pp))
                continue
            uneven = splits[0] != space.EVEN_SPLIT
            if uneven and (fell or (deepest is not None and self._deeper_pipeline_cannot_reach(tp, deepest))):
                self.rejected[RejectReason.DOMINATED_PP] += len(splits)
                continue
            for split in splits:
                if self._interleaving_cannot_reach(tp, pp, split):
                    self.rejected[RejectReason.DOMINATED_VPP] += 1
                    continue
                self._walk_context_parallel(tp, pp, split)
            here = self._best_at.get((tp, pp))
            if here is None:
                continue
            deepest = pp
            speed = here.estimate.tokens_per_s_per_gpu
            if best_so_far is not None and speed < best_so_far.estimate.tokens_per_s_per_gpu and \
                    not needs_memory_relief(best_so_far.parallel):
                fell = True
            if best_so_far is None or speed > best_so_far.estimate.tokens_per_s_per_gpu:
                best_so_far = here

    def _deeper_pipeline_cannot_reach(self, tp: int, pp: int) -> bool:
        """Whether a PP deeper than `pp` cannot come within `reach` of the fastest layout so far: at best it removes
        all of the best `pp` layout's bubble, pipeline send/recv, exposed data-parallel traffic (each stage holds
        fewer weights) and memory relief (recompute, offload), and its GEMMs run the same work per GPU at most at
        the largest micro-batch the batch allows (the memory a deeper stage frees may buy it): so the bound is the
        best `pp` layout costed at that micro-batch, memory aside, with all of those shares gone."""
        if self.reach is None:
            return False
        return self._out_of_reach(max(_without_removable(est) for est in self._best_and_largest_microbatch(tp, pp)))

    def _out_of_reach(self, bound: float) -> bool:
        """Whether a layout that runs at most `bound` tokens/s/GPU falls short, beyond the tie band, of the model's
        error band (`reach`) below the fastest layout kept so far: the test of every bound the walk prunes by."""
        assert self.reach is not None
        fastest = max(fit.estimate.tokens_per_s_per_gpu for fit in self._best_at.values())
        return bound * TIE_BAND < fastest / (1 + self.reach)

    def _best_and_largest_microbatch(self, tp: int, pp: int) -> list[EstimateResult]:
        """The best `pp` layout's estimate, and the same layout at the largest micro-batch without recompute. Both
        are bounded: the largest micro-batch may be slower as it stands (fewer micro-batches, a larger bubble) and
        still the faster once the bubble is removed."""
        parallel, best = self._best_at[(tp, pp)]
        largest = max(space.mbs_values(self.training, parallel.dp, self.pins), default=parallel.mbs)
        if largest <= parallel.mbs:
            return [best]
        return [best, self.cost(parallel.model_copy(update={
            "mbs": largest, "recompute": "none", "recompute_method": "uniform", "recompute_num_layers": None,
            "recompute_modules": None, "cpu_offloading_num_layers": 0}))]

    def _interleaving_cannot_reach(self, tp: int, pp: int, split: space.PipelineSplit) -> bool:
        """Beside a first/last split the balanced layout string is walked for its interleaving only (VPP > 1),
        which removes at most the bubble: skip it where the best layout at this TP and PP, its whole bubble
        gone, would still be slower than the fastest layout so far by more than `reach`."""
        if self.reach is None or not space.is_balanced_layout(self.model, pp, split):
            return False
        if space.vpp_values(self.model, pp, self.pins, split)[0] == 1:  # the only split here, or a pinned VPP 1
            return False
        here = self._best_at.get((tp, pp))
        if here is None:
            return False
        return self._out_of_reach(here.estimate.tokens_per_s_per_gpu / (1 - min(bubble_share(here.estimate), 0.99)))

    def _walk_context_parallel(self, tp: int, pp: int, split: space.PipelineSplit) -> None:
        """CP upwards; each (EP, ETP, FSDP) choice stops growing CP once memory no longer binds it and
        throughput fell from the CP below.

        Beyond what memory needs, a larger CP does the same work per GPU in smaller GEMMs plus the
        ring-attention traffic; but at a fixed global batch it also takes ranks from DP, so each replica
        runs more micro-batches and the pipeline bubble shrinks (what the recipes use CP for on large
        models with small batches). Throughput is unimodal in CP along that trade, so the walk stops at
        the first CP that memory does not need and that is no faster (beyond the tie band) than the one below.
        """
        world = self.cluster.world_size
        settled: set[tuple[int, int, bool]] = set()  # (ep, etp, fsdp) that need no larger CP
        speed_at_smaller_cp: dict[tuple[int, int, bool], float] = {}  # its best tokens/s/GPU at the CP below
        for cp in space.cp_values(world // (tp * pp), self.pins):
            if self._reject(space.cp_rule(self.model, self.training, tp, cp, self._cp_comm_type(cp))):
                continue
            dp = world // (tp * cp * pp)
            if self._reject(space.batch_rule(self.training, dp)):
                continue
            self._walk_experts(tp, cp, pp, dp, settled, split, speed_at_smaller_cp)

    def _cp_comm_type(self, cp: int) -> CpCommType:
        return cp_comm_type_for(self.model, cp, self.pins.cp_comm_type)

    def _walk_experts(
        self, tp: int, cp: int, pp: int, dp: int, settled: set[tuple[int, int, bool]], split: space.PipelineSplit,
        speed_at_smaller_cp: dict[tuple[int, int, bool], float],
    ) -> None:
        """Walk EP (largest first), ETP and FSDP for one (TP, CP, PP)."""
        floor_failed_for: dict[tuple[int, bool], RejectReason] = {}  # (etp, fsdp) whose floor failed at a larger EP
        for ep, etp in space.expert_values(self.model, tp, self.pins):
            if self._reject(space.expert_rule(self.model, tp, cp, dp, ep, etp)):
                continue
            memory_bound = True
            for fsdp in self._fsdp_options(dp, pp):
                if (ep, etp, fsdp) in settled:
                    self.rejected[RejectReason.DOMINATED_CP] += 1
                    continue
                if fsdp and not memory_bound:
                    # FSDP only buys memory (at the price of more all-gathers than the distributed
                    # optimizer): a shape that already runs its largest MBS without recompute cannot
                    # gain — nor can it at a larger CP, where memory binds even less.
                    self.rejected[RejectReason.DOMINATED_FSDP] += 1
                    settled.add((ep, etp, fsdp))
                    continue
                if (etp, fsdp) in floor_failed_for:  # a larger EP already failed: expert weights only grow
                    self.rejected[floor_failed_for[(etp, fsdp)]] += 1
                    continue
                shape = Shape(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=None if etp == tp else etp, fsdp=fsdp,
                              split=split, distributed_optimizer=not self.training.uses_muon,
                              cp_comm_type=self._cp_comm_type(cp))
                floor = self._floor(shape)
                if not floor.fits:
                    if floor.static_gib > floor.capacity_gib:  # weights alone overflow: CP cannot help
                        settled.add((ep, etp, fsdp))
                    if self.model.moe is not None and self.pins.ep is None:
                        floor_failed_for[(etp, fsdp)] = _floor_category(floor)
                    continue
                if self._shape_cannot_reach(shape):
                    self.rejected[RejectReason.DOMINATED_SHAPE] += 1
                    continue
                binding, best = self._walk_vpp(shape)
                memory_bound = binding.bound_any
                if not binding.bound_smallest and self._cp_cannot_gain(best, speed_at_smaller_cp.get((ep, etp, fsdp))):
                    settled.add((ep, etp, fsdp))
                if best is not None:
                    speed_at_smaller_cp[(ep, etp, fsdp)] = best.tokens_per_s_per_gpu

    def _shape_cannot_reach(self, shape: Shape) -> bool:
        """Whether no variant of `shape` can come within `reach` of the fastest layout so far, once its TP and PP
        already hold a walked layout and enough shapes faster than it are kept to fill a plan without it. Its
        bound is the shape at its largest micro-batch without recompute, memory aside, with its bubble, pipeline
        send/recv, exposed DP traffic and memory relief gone: what VPP, MBS and the recompute ladder could win at
        most (the bound `_deeper_pipeline_cannot_reach` takes for a deeper PP). A layout string is left to its walk:
        a larger VPP re-cuts it and may balance its stages beyond what removing the bubble shows."""
        if self.reach is None or shape.split.layout is not None or (shape.tp, shape.pp) not in self._best_at:
            return False
        largest = max(space.mbs_values(self.training, shape.dp, self.pins), default=1)
        bound = _without_removable(self.cost(shape.layout(largest, NO_RECOMPUTE)))
        if not self._out_of_reach(bound):
            return False
        faster = sum(fit.estimate.tokens_per_s_per_gpu > bound * TIE_BAND for fit in self.best_by_shape.values())
        return faster >= SHAPES_BEFORE_PRUNING

    @staticmethod
    def _cp_cannot_gain(best: EstimateResult | None, below: float | None) -> bool:
        """Whether a larger CP, which memory does not need, has nothing to win: no bubble to shrink (PP 1, or one
        already inside the tie band), or throughput no better than at the CP below."""
        if best is None or bubble_share(best) < TIE_BAND - 1:
            return True
        return below is not None and best.tokens_per_s_per_gpu < below * TIE_BAND

    def _fsdp_options(self, dp: int, pp: int) -> tuple[bool, ...]:
        """Megatron-FSDP only with DP to shard over and without pipelining, which it does not support, and not
        with Muon (Megatron refuses it)."""
        if self.training.uses_muon:
            return (False,)
        if self.pins.fsdp is not None:
            return () if self.pins.fsdp and pp > 1 else (self.pins.fsdp,)
        return (False, True) if dp > 1 and pp == 1 else (False,)

    def _floor(self, shape: Shape) -> MemoryCheck:
        """The shape's smallest footprint: MBS 1 (or the pinned one), full recompute of every layer."""
        mbs = self.pins.mbs or 1
        floor = shape.layout(mbs, FULL_RECOMPUTE)
        memory = self.cost.memory(floor)
        if not memory.fits:
            self.rejected[_floor_category(memory)] += 1
            if space.batch_rule(self.training, shape.dp, mbs) is None:  # a floor to name must be a layout that runs
                self._note_floor(floor, memory)
        return memory

    def _walk_vpp(self, shape: Shape) -> tuple[MemoryBinding, EstimateResult | None]:
        """Walk VPP upwards; whether memory bound anything, and whether it bound even the smallest MBS, and the
        fastest estimate found (None when nothing fits)."""
        bound_any = bound_smallest = False
        best_so_far: float | None = None
        fastest: EstimateResult | None = None
        vpps = space.vpp_values(self.model, shape.pp, self.pins, shape.split)
        # A layout string is cut two ways at each VPP: by FLOPs, and by each item's time on this shape. The time cut
        # balances the step; the FLOP cut may hold less on the first rank, whose in-flight micro-batches fill its
        # memory first (an MoE model's light dense-first layers draw the time cut's extra layers there). The
        # estimate decides. A string's balance changes with the stage count (61 layers cut 4 to a stage at VPP 4
        # leave one heavy stage at VPP 3), so its VPPs are all walked.
        string = space.is_balanced_layout(self.model, shape.pp, shape.split)
        weights = self.cost.stage_weights(shape.layout(1, NO_RECOMPUTE)) if string else None
        for index, vpp in enumerate(vpps):
            best: EstimateResult | None = None
            for split in dict.fromkeys(space.split_at_vpp(self.model, shape.pp, shape.split, vpp, cut)
                                       for cut in (None, weights)):
                if self._reject(space.pp_rule(self.model, shape.pp, vpp, split)):
                    continue
                found, binding = self._walk_microbatches(shape.with_vpp(vpp, split))
                bound_any |= binding.bound_any
                bound_smallest |= binding.bound_smallest
                if found is not None and (best is None or found.tokens_per_s_per_gpu > best.tokens_per_s_per_gpu):
                    best = found
            if best is not None and (fastest is None or best.tokens_per_s_per_gpu > fastest.tokens_per_s_per_gpu):
                fastest = best
            if best is None or index + 1 == len(vpps):
                continue
            # More interleaving shrinks the bubble as 1/VPP but adds send/recv and in-flight
            # activations, so throughput is unimodal in VPP: stop once it falls, or once the bubble
            # is already inside the tie band (nothing left to win).
            fell = best_so_far is not None and best.tokens_per_s_per_gpu < best_so_far and not string
            if fell or bubble_share(best) < TIE_BAND - 1:
                self.rejected[RejectReason.DOMINATED_VPP] += len(vpps) - index - 1
                break
            best_so_far = best.tokens_per_s_per_gpu
        return MemoryBinding(bound_any, bound_smallest), fastest

    def _walk_microbatches(self, shape: Shape) -> MicrobatchWalk:
        """Every useful MBS at its least recompute.

        Returns the best estimate and whether memory bound any MBS and the smallest MBS. Memory grows
        with MBS and falls along the recompute ladder, so the first rung that fits can only move up
        as MBS grows: each MBS starts climbing where the previous one stopped. Throughput is
        unimodal in MBS (GEMM efficiency saturates while the pipeline gets fewer micro-batches), so
        the walk stops once it falls.
        """
        ladder = self._ladder(shape.pp, shape.vpp, shape.split)
        dp = shape.dp
        mbs_values = space.mbs_values(self.training, dp, self.pins)
        best: EstimateResult | None = None
        bound_any = False
        bound_smallest: bool | None = None
        rung = 0
        for index, mbs in enumerate(mbs_values):
            if self._reject(space.batch_rule(self.training, dp, mbs)):
                continue
            if self._reject(space.interleave_rule(self.training, shape.pp, shape.vpp, dp, mbs)):
                continue
            est, rung = self._climb_ladder(shape, mbs, ladder, rung)
            bound_any |= rung > 0 or est is None
            if bound_smallest is None:
                bound_smallest = rung > 0 or est is None
            if est is None:
                self.rejected[RejectReason.MEMORY_MBS_SKIPPED] += len(mbs_values) - index - 1
                break
            if best is not None and est.tokens_per_s_per_gpu < best.tokens_per_s_per_gpu:
                self.rejected[RejectReason.DOMINATED_MBS] += len(mbs_values) - index - 1
                break
            best = est
        return MicrobatchWalk(best, MemoryBinding(bound_any, bool(bound_smallest)))

    def _ladder(self, pp: int, vpp: int, split: space.PipelineSplit) -> list[RecomputeRung]:
        ladder = recompute_ladder(self.model, pp, vpp, split, self.training.quant_flavour)
        graphs = self.cost.options.cuda_graphs if self.cost.options is not None else None
        if graphs is not None and graphs.scope != ("full_iteration",):  # Megatron: full recompute only under one
            ladder = [rung for rung in ladder if rung.recompute != "full"]
        if self.pins.recompute_modules:
            return [RecomputeRung("selective", modules=self.pins.recompute_modules)]
        if self.pins.recompute:
            ladder = [rung for rung in ladder if rung.recompute == self.pins.recompute]
        return ladder

    def _climb_ladder(self, shape: Shape, mbs: int, ladder: list[RecomputeRung], start: int) -> Climb:
        """The least recompute that fits at this MBS, from rung `start` up.

        Memory falls monotonically along the ladder, so the first rung that fits the memory stage is
        found by bisection; the full estimate then confirms it (or the climb goes on above it).
        """
        built: dict[int, ParallelConfig] = {}

        def layout(index: int) -> ParallelConfig:  # built on demand: most climbs touch one or two rungs
            if index not in built:
                built[index] = shape.layout(mbs, ladder[index])
            return built[index]

        low = first_passing(start, len(ladder), lambda index: self.cost.memory(layout(index)).fits)
        self.rejected[RejectReason.MEMORY_ACTIVATIONS] += low
        offloaded = self._offload(shape, mbs) if low > 0 and ladder[0].recompute == "none" else None
        for step_index in range(low, len(ladder)):
            est = self.cost(layout(step_index))
            if self.cost.fits(est):
                self._keep(layout(step_index), est)
                self.rejected[RejectReason.DOMINATED_RECOMPUTE] += len(ladder) - step_index - 1
                if offloaded is not None and offloaded.tokens_per_s_per_gpu > est.tokens_per_s_per_gpu:
                    return Climb(offloaded, step_index)
                return Climb(est, step_index)
            self.rejected[RejectReason.MEMORY_ACTIVATIONS] += 1
        return Climb(offloaded, len(ladder))

    def _offload(self, shape: Shape, mbs: int) -> EstimateResult | None:
        """The other way to fit activations without recomputing them: Megatron's activation offload
        (`--cpu-offloading-num-layers`, PP 1 and no recompute only) moves the first N layers' activations to host
        memory while later layers compute, and costs only the copy the host link cannot hide. Memory falls with N
        and copy time grows with it, so the fewest layers that fit are found by bisection; kept beside the
        recompute rung that fits, the faster of the two wins its shape.

        Walked only where the host link has room for the copies beside the NIC's traffic
        (`offload_has_room`): on a PCIe host the GPU's one x16 uplink also carries its NIC (GPUDirect RDMA), and
        the estimate prices the copies as if the link were theirs alone."""
        most = most_offloaded_layers(self.model.num_layers, shape.pp, "none")
        graphed = self.cost.options is not None and self.cost.options.cuda_graphs is not None  # Megatron: no offload
        if shape.pp > 1 or most < 1 or self.pins.recompute not in (None, "none") or self.pins.recompute_modules \
                or not offload_has_room(self.cluster) or graphed:
            return None

        def layout(layers: int) -> ParallelConfig:
            return shape.layout(mbs, RecomputeRung("none", offload_layers=layers))

        def fewest(fits: Callable[[MemoryCheck], bool]) -> int | None:
            layers = first_passing(1, most + 1, lambda n: fits(self.cost.memory(layout(n))))
            return layers if layers <= most else None

        fitting = fewest(lambda memory: memory.fits)
        if fitting is None:
            return None
        est = self.cost(layout(fitting))
        if not self.cost.fits(est):
            return None
        # Where the host link hides the copies, more layers cost nothing and buy headroom: the fewest that leave the
        # memory estimate's own margin free, when that is as fast.
        roomy = fewest(lambda memory: memory.total_gib <= memory.capacity_gib * (1 - LOW_HEADROOM_FRACTION))
        if roomy is not None and roomy != fitting:
            roomy_est = self.cost(layout(roomy))
            if self.cost.fits(roomy_est) and roomy_est.tokens_per_s_per_gpu * TIE_BAND >= est.tokens_per_s_per_gpu:
                fitting, est = roomy, roomy_est
        self._keep(layout(fitting), est)
        return est


def first_passing(low: int, high: int, passes: Callable[[int], bool]) -> int:
    """The smallest index in [low, high) at which `passes` holds, by bisection, for a test that once true stays true
    (memory falls along the recompute ladder, and with more layers offloaded); `high` when none passes. `low` is
    tried first: most walks fit at once."""
    if low < high and passes(low):
        return low
    while low < high:  # invariant: indices < low fail, indices >= high are unknown or pass
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _without_removable(est: EstimateResult) -> float:
    """Tokens/s/GPU with the shares a deeper pipeline may remove (`PIPELINE_REMOVABLE`) gone."""
    removable = sum(component_share(est, part) for part in PIPELINE_REMOVABLE)
    return est.tokens_per_s_per_gpu / max(1 - removable, 0.01)


def needs_memory_relief(p: ParallelConfig) -> bool:
    """Whether a layout buys memory with time: recompute, Megatron-FSDP's per-layer gathers, activation offload."""
    return p.recompute != "none" or p.fsdp or p.cpu_offloading_num_layers > 0


def offload_has_room(cluster: ClusterSpec) -> bool:
    """Whether the GPU's link to host memory can carry activation copies at the NIC's full rate while the NIC runs
    at its own (at least twice the scale-out bandwidth): true of a Grace superchip's NVLink-C2C (225 GB/s per GPU
    per direction against a 50 GB/s NIC), not of a PCIe Gen4/Gen5 x16 uplink (32/64 GB/s) that the NIC shares."""
    return cluster.gpu.host_link_gbps >= OFFLOAD_HOST_LINK_OVER_NIC * cluster.gpu.scaleout_bw_gbps


def _floor_category(memory: MemoryCheck) -> RejectReason:
    """Why a shape's smallest footprint does not fit: the weights themselves, or the activations."""
    if memory.static_gib > memory.capacity_gib:
        return RejectReason.MEMORY_FLOOR
    return RejectReason.MEMORY_FLOOR_ACTIVATIONS


class _Inverted:
    """Wraps a sort key so that heapq's min-heap keeps the worst entry on top."""

    __slots__ = ("key",)

    def __init__(self, key: RankKey):
        self.key = key

    def __lt__(self, other: _Inverted) -> bool:
        return other.key < self.key


def search_layouts(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    *,
    pins: Pins | None = None,
    estimator: LayoutEstimator | None = None,
    cost: CostModel | None = None,
    reach: float | None = None,
) -> SearchOutcome:
    """Every legal layout that fits, best first (at most KEEP_PER_SEARCH kept), plus the rejections. `reach`:
    how much slower than the fastest a layout may be and still matter (the planner's error band); None = any."""
    pins = pins or Pins()
    space.check_pins(model, cluster, training, pins)
    cost = cost or CostModel(model, cluster, training, estimator)
    return _Search(cost, pins, reach).run()
