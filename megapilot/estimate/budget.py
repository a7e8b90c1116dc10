"""The whole run, not one step: time to train a token budget, GPU-hours, energy and cost, with goodput.

A budget is a token count (or a step count) at the run's sequence length and batch, plus what changes along the
way:
- phases: the last tokens of the budget at another sequence length, batch or layout (a long-context phase,
  `seq_len=131072,tokens=800B,cp=16`). Phase tokens are part of the budget: the main phase trains the rest;
- a batch-size warm-up, Megatron's `--rampup-batch-size START INCREMENT SAMPLES`: the batch grows from START by
  INCREMENT in equal shares of SAMPLES, each step at its batch's estimated time (fewer micro-batches, a larger
  pipeline bubble). Its steps are Megatron's: a step's batch follows from the samples consumed before it, so the
  step that crosses a share's end trains past it and the next batch starts from there (`BatchRampup.levels`).

Each piece trains whole steps, its tokens over its step's rounded up (`steps_to_train`: the budget is the least
to train, and `script --tokens` writes the same count as --train-iters); a warm-up batch trains its steps' samples,
and the main phase the rest of the budget. Each piece's step time is the estimator's
own (`megapilot.estimate.estimate`); failure-free time is the sum of steps x step time. The elapsed time adds what
failures cost (`goodput`). GPU-hours = elapsed x GPUs; energy = GPU-hours x the GPU's TDP (board power only: hosts,
network and cooling - the PUE - are not counted, and a GPU seldom draws its full TDP, so it is an upper bound of the
GPUs' own draw); cost = GPU-hours x the price.

Each figure carries the 80 % interval of the step-time estimate behind it (`TimeBand`), the one the estimate
states for its tokens/s: from the held-out errors of the published runs nearest to it (`coverage.band_for`), or,
calibrated on the cluster's runs, from theirs. Time is tokens over throughput, so a throughput the estimate may
overrate by 24 % is a run that may take 24 % longer. A case no interval speaks for (a CPU) gets UNCALIBRATED_BAND
and says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from megapilot.errors import MegapilotError
from megapilot.estimate.goodput import CheckpointCost, FailureModel, Goodput, daly_interval_s, goodput, interval_steps
from megapilot.estimate.pipeline_balance import balanced_split
from megapilot.estimate.step_time import EstimateOptions, stage_time_weights
from megapilot.spec.hardware import ClusterSpec
from megapilot.spec.model import ModelSpec
from megapilot.spec.parallel import ParallelConfig
from megapilot.spec.training import MAX_TRAIN_ITERS, TrainingSpec

TOKEN_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
# The largest token budget priced: 10^16, 250 times the largest published (Llama 4 Scout's 40T, Qwen3's 36T); 1e40
# printed a run of 10^30 days. A budget past it is a slip of digits or of the suffix, refused by name.
MAX_BUDGET_TOKENS = 1e16
UNCALIBRATED_BAND = 0.30  # no published run checks the estimate: a wide band, stated as such
PHASE_LAYOUT_KEYS = ("tp", "pp", "vpp", "cp", "mbs")
PHASE_KEYS = ("tokens", "seq_len", "gbs", *PHASE_LAYOUT_KEYS)


def parse_tokens(text: str | float | int, field_name: str = "tokens") -> float:
    """`15.6T`, `800B`, `252M`, `4K` or a plain number -> tokens."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGTkmbgt]?)\s*", str(text))
        if match is None:
            raise MegapilotError(f"cannot read {text!r} as a token count", field=field_name,
                                 fix="write a number with an optional K, M, B or T suffix, e.g. 15.6T")
        value = float(match.group(1)) * TOKEN_SUFFIXES.get(match.group(2).upper(), 1.0)
    if not math.isfinite(value):
        raise MegapilotError(f"{text!r} is too large to be a token count", field=field_name,
                             fix="pass a count such as 15.6T")
    if not value > 0:
        raise MegapilotError(f"must be > 0, not {text!r}", field=field_name, fix="pass a positive count, e.g. 15.6T")
    if value > MAX_BUDGET_TOKENS:
        raise MegapilotError(f"{text!r} is {value:.3g} tokens, above {MAX_BUDGET_TOKENS:.0e}, far beyond any published "
                             "run (Llama 4 Scout: 40T)", field=field_name,
                             fix="check the count and its suffix (K, M, B, T), e.g. 15.6T")
    return value


@dataclass(frozen=True)
class Phase:
    """The last `tokens` of the budget trained differently: another sequence length, batch or layout (None: the
    main run's)."""

    tokens: float
    seq_len: int | None = None
    gbs: int | None = None
    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    cp: int | None = None
    mbs: int | None = None

    def label(self) -> str:
        given = [f"{key} {getattr(self, key):,}" for key in PHASE_KEYS[1:] if getattr(self, key) is not None]
        return ", ".join(given) or "as the main run"

    def layout_changes(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in PHASE_LAYOUT_KEYS if getattr(self, key) is not None}


def parse_phase(text: str, field_name: str = "phase") -> Phase:
    """`seq_len=131072,tokens=800B,cp=16` -> Phase (keys: tokens, seq_len, gbs, tp, pp, vpp, cp, mbs)."""
    pairs: dict[str, str] = {}
    for part in (p for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep:
            raise MegapilotError(f"{part.strip()!r} is not KEY=VALUE", field=field_name,
                                 fix="write e.g. --phase seq_len=131072,tokens=800B,cp=16")
        key = key.strip().replace("-", "_")
        if key in pairs:  # which one was meant is not for the tool to guess
            raise MegapilotError(f"{key} is given twice ({pairs[key]} and {value.strip()})", field=field_name,
                                 fix=f"give {key} once per --phase")
        pairs[key] = value.strip()
    return phase_from_mapping(pairs, field_name)


def phase_from_mapping(raw: Mapping[str, object], field_name: str = "phase") -> Phase:
    """A phase from a mapping (a suite config's `budget.phases` item, or parsed `--phase`)."""
    unknown = sorted(set(raw) - set(PHASE_KEYS))
    if unknown:
        raise MegapilotError(f"unknown key {unknown[0]!r}", field=field_name, fix=f"use {', '.join(PHASE_KEYS)}")
    if "tokens" not in raw:
        raise MegapilotError("a phase needs its tokens", field=field_name, fix="add tokens=800B")
    sizes: dict[str, int] = {}
    for key in PHASE_KEYS[1:]:
        if key in raw:
            try:
                sizes[key] = int(str(raw[key]))
            except ValueError:
                raise MegapilotError(f"{key}={raw[key]!r} is not a whole number", field=field_name,
                                     fix=f"write {key}=<integer>") from None
            if sizes[key] <= 0:
                raise MegapilotError(f"{key} must be > 0", field=field_name, fix=f"write {key}=<positive integer>")
    return Phase(parse_tokens(raw["tokens"], field_name), **sizes)  # type: ignore[arg-type]  # keys checked above


@dataclass(frozen=True)
class BatchRampup:
    """Megatron's `--rampup-batch-size START INCREMENT SAMPLES`: the batch starts at START and grows by INCREMENT
    after each of the (GBS - START) / INCREMENT equal shares of SAMPLES."""

    start: int
    increment: int
    samples: int

    def levels(self, final_gbs: int) -> list[tuple[int, int]]:
        """(batch, steps trained at it) for each batch of the warm-up, as Megatron-Core's ramp-up calculator
        runs it: a step's batch is START + INCREMENT x the whole shares of SAMPLES consumed before it (the shares
        a float, SAMPLES / their count, divided as Megatron divides), GBS once past SAMPLES. A batch trains until
        the samples consumed reach another share, so its last step trains past its share's end and the next batch
        starts from there; a batch whose whole share one step crosses trains no step and is left out."""
        if self.start <= 0 or self.increment <= 0 or self.samples <= 0:
            raise MegapilotError("START, INCREMENT and SAMPLES must be > 0", field="rampup_batch_size",
                                 fix="pass e.g. --rampup-batch-size 256 256 1000000")
        if self.samples > MAX_BUDGET_TOKENS:  # each sample holds a token at least: past any budget priced
            raise MegapilotError(f"SAMPLES {self.samples:,} is above {MAX_BUDGET_TOKENS:,.0f}, more sequences than "
                                 "the largest token budget priced has tokens", field="rampup_batch_size",
                                 fix="check SAMPLES for extra digits (published warm-ups: a few million samples)")
        if self.start >= final_gbs or (final_gbs - self.start) % self.increment:
            raise MegapilotError(
                f"GBS {final_gbs} - START {self.start} is not a positive multiple of INCREMENT {self.increment}",
                field="rampup_batch_size", fix="Megatron needs (GBS - START) divisible by INCREMENT, START < GBS")
        count = (final_gbs - self.start) // self.increment
        share = self.samples / count

        def level(consumed: int) -> int:  # the increments the batch has taken after `consumed` samples
            return count if consumed > self.samples else min(count, int(consumed / share))

        found: list[tuple[int, int]] = []
        consumed = 0
        while (current := level(consumed)) < count:
            batch = self.start + current * self.increment
            # the least steps that reach another level: from the share's end, then settled by `level` itself,
            # which is monotone in the samples, so that the float division decides a boundary as Megatron's does
            steps = max(1, -(-(math.ceil((current + 1) * share) - consumed) // batch))
            while steps > 1 and level(consumed + (steps - 1) * batch) != current:
                steps -= 1
            while level(consumed + steps * batch) == current:
                steps += 1
            found.append((batch, steps))
            consumed += steps * batch
        return found


@dataclass(frozen=True)
class Shape:
    """What one piece of the run trains at: sequence length, batch and layout changes."""

    seq_len: int
    gbs: int
    layout: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class ShapeCost:
    """The estimator's answer for one shape."""

    step_time_s: float
    fits: bool
    layout_label: str = ""


StepCost = Callable[[Shape], ShapeCost]


@dataclass(frozen=True)
class Segment:
    """One piece of the run: its tokens, its whole steps (`steps_to_train`) and failure-free time."""

    name: str
    tokens: float
    shape: Shape
    iterations: int
    step_time_s: float
    fits: bool
    layout_label: str = ""

    @property
    def seconds(self) -> float:
        return self.iterations * self.step_time_s

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "tokens": self.tokens, "seq_len": self.shape.seq_len, "gbs": self.shape.gbs,
                "layout": dict(self.shape.layout), "iterations": self.iterations,
                "step_time_s": round(self.step_time_s, 6), "days": round(self.seconds / 86400, 3),
                "fits": self.fits}


@dataclass(frozen=True)
class TimeBand:
    """The factors the run's true time may lie between, against the estimated time, and where they come from."""

    low: float
    high: float
    source: str

    @classmethod
    def symmetric(cls, fraction: float, source: str) -> TimeBand:
        """+/- `fraction` of the time (a measured step's spread, or a stated band no interval backs)."""
        return cls(1 - fraction, 1 + fraction, source)

    @classmethod
    def of_throughput(cls, p10_error: float, p90_error: float, source: str) -> TimeBand:
        """From an 80 % interval of predicted / true throughput - 1: the time is the estimate's x (1 + error)."""
        return cls(1 + p10_error, 1 + p90_error, source)

    @classmethod
    def within_factor(cls, band: float, source: str) -> TimeBand:
        """True throughput within a factor 1 + `band` of the estimate either way (a cluster's calibration)."""
        return cls(1 / (1 + band), 1 + band, source)

    def words(self) -> str:
        """'±2.8 %' where the ends are even, else '-29.2/+24.0 %'."""
        below, above = 100 * (1 - self.low), 100 * (self.high - 1)
        return f"±{above:.1f} %" if abs(below - above) < 0.05 else f"-{below:.1f}/+{above:.1f} %"

    def to_json(self) -> dict[str, object]:
        return {"band_low_pct": round(100 * (self.low - 1), 2), "band_high_pct": round(100 * (self.high - 1), 2),
                "band_source": self.source}


@dataclass(frozen=True)
class Band:
    """A figure with its band: value x the band's low and high factors."""

    value: float
    low: float
    high: float

    @classmethod
    def within(cls, value: float, band: TimeBand) -> Band:
        return cls(value, value * band.low, value * band.high)

    def to_json(self, digits: int = 3) -> dict[str, float]:
        return {"value": _round(self.value, digits), "low": _round(self.low, digits),
                "high": _round(self.high, digits)}


def _round(value: float, digits: int) -> float:
    return float(f"{value:.{digits + 3}g}")


@dataclass(frozen=True)
class BudgetRequest:
    """What the user asked: tokens (or steps), phases, a batch warm-up, a price, and the failure inputs."""

    tokens: float | None = None
    train_iters: int | None = None
    phases: tuple[Phase, ...] = ()
    rampup: BatchRampup | None = None
    cost_per_gpu_hour: float | None = None
    failure: FailureModel = field(default_factory=FailureModel)
    checkpoint_gbps: float | None = None  # None: the stated default
    measured_checkpoint: CheckpointCost | None = None  # the suite's checkpoint stage: replaces the estimate

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.train_iters is None):
            raise MegapilotError("give the budget as tokens or as iterations, one of them", field="tokens",
                                 fix="pass --tokens 15.6T or --train-iters N")
        if self.train_iters is not None and self.train_iters <= 0:
            raise MegapilotError("must be > 0", field="train_iters", fix="pass --train-iters N with N > 0")
        if self.train_iters is not None and self.train_iters > MAX_TRAIN_ITERS:
            raise MegapilotError(f"{self.train_iters:,} is above {MAX_TRAIN_ITERS:,} iterations, far beyond any "
                                 "published run (T5: 1 million steps)", field="train_iters",
                                 fix=f"pass --train-iters N with N <= {MAX_TRAIN_ITERS:,}, or the budget as --tokens")
        if self.train_iters is not None and self.rampup is not None:
            # Megatron asserts "expected no batch-size rampup for iteration-based training": the steps asked would
            # not be the steps trained (the warm-up's smaller batches take more of them for the same tokens)
            raise MegapilotError("Megatron refuses a batch warm-up with iteration-based training (--train-iters)",
                                 field="rampup_batch_size",
                                 fix="give the budget as --tokens (the run trains by samples), or drop "
                                     "--rampup-batch-size")
        if self.cost_per_gpu_hour is not None and not (math.isfinite(self.cost_per_gpu_hour)
                                                       and self.cost_per_gpu_hour >= 0):
            raise MegapilotError(f"must be a finite number >= 0, not {self.cost_per_gpu_hour}",
                                 field="cost_per_gpu_hour", fix="pass the price of one GPU-hour, e.g. 2.5")
        if self.cost_per_gpu_hour is not None and self.cost_per_gpu_hour > MOST_COST_PER_GPU_HOUR:
            raise MegapilotError(f"{self.cost_per_gpu_hour:g} is more than {MOST_COST_PER_GPU_HOUR:g} a GPU-hour, "
                                 "beyond any currency's price of one (and the run's cost would overflow)",
                                 field="cost_per_gpu_hour", fix="pass the price of one GPU-hour, e.g. 2.5")


# The dearest price of a GPU-hour taken: above it no currency prices one, and price x GPU-hours may overflow a float,
# which the JSON output would print as Infinity (not JSON).
MOST_COST_PER_GPU_HOUR = 1e12


@dataclass(frozen=True)
class TimeToTrain:
    """The run's plan: its pieces, failure-free time, goodput, and the headline figures with their bands."""

    tokens: float
    iterations: int
    segments: tuple[Segment, ...]
    gpus: int
    band: TimeBand
    goodput: Goodput
    tdp_w: float | None
    cost_per_gpu_hour: float | None

    @property
    def compute_s(self) -> float:
        return sum(s.seconds for s in self.segments)

    @property
    def main(self) -> Segment | None:
        """The main phase (None where the batch warm-up takes the whole budget)."""
        return next((s for s in self.segments if s.name == "main"), None)

    def main_save_interval(self) -> int | None:
        """Daly's checkpoint interval in the main phase's steps: what a script that trains the main phase alone
        writes as --save-interval (the run's mean step, a warm-up's shorter steps or a long-context phase's longer
        ones, would save too often or too seldom there). None: no main phase, or no failures to checkpoint against."""
        main, g = self.main, self.goodput
        if main is None or g.checkpoint_interval_iters is None:
            return None
        return interval_steps(daly_interval_s(g.checkpoint.save_s, g.mtbf_s), main.step_time_s)

    @property
    def elapsed_s(self) -> float:
        return self.goodput.elapsed_s

    @property
    def days(self) -> Band:
        return Band.within(self.elapsed_s / 86400, self.band)

    @property
    def gpu_hours(self) -> Band:
        return Band.within(self.elapsed_s / 3600 * self.gpus, self.band)

    @property
    def energy_mwh(self) -> Band | None:
        if self.tdp_w is None:
            return None
        return Band.within(self.gpu_hours.value * self.tdp_w / 1e6, self.band)

    @property
    def cost(self) -> Band | None:
        if self.cost_per_gpu_hour is None:
            return None
        return Band.within(self.gpu_hours.value * self.cost_per_gpu_hour, self.band)

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.segments)

    def to_json(self) -> dict[str, object]:
        energy, cost = self.energy_mwh, self.cost
        return {
            "tokens": self.tokens, "iterations": self.iterations,
            "days": self.days.to_json(), "gpu_hours": self.gpu_hours.to_json(),
            "energy_mwh": energy.to_json() if energy else None, "cost": cost.to_json() if cost else None,
            "compute_days": round(self.compute_s / 86400, 3),
            **self.band.to_json(),
            "tdp_w": self.tdp_w, "cost_per_gpu_hour": self.cost_per_gpu_hour,
            "segments": [s.to_json() for s in self.segments],
            **self.goodput.to_json(),
        }

    def summary(self) -> str:
        """One line: `83.2 days (±6.6 %) · 32.7 M GPU-hours · 22.9 GWh ...`."""
        parts = [f"{self.days.value:,.1f} days", f"{self.gpu_hours.value / 1e6:,.3g} M GPU-hours"]
        if self.energy_mwh is not None:
            parts.append(f"{self.energy_mwh.value:,.0f} MWh at TDP")
        if self.cost is not None:
            parts.append(f"${self.cost.value:,.0f}")
        return " · ".join(parts) + f" (each {self.band.words()}, {self.band.source})"


def segments_for(request: BudgetRequest, training: TrainingSpec, cost: StepCost) -> list[Segment]:
    """The run cut in pieces: the batch warm-up, the main phase and each later phase, each costed by `cost`."""
    seq, gbs = training.seq_length, training.global_batch_size
    if request.tokens is not None:
        total = request.tokens
    else:
        assert request.train_iters is not None  # BudgetRequest holds one of the two
        total = request.train_iters * seq * gbs
    _at_least_one_step(total, seq, gbs, "tokens", "the budget")
    for index, phase in enumerate(request.phases, start=1):
        _at_least_one_step(phase.tokens, phase.seq_len or seq, phase.gbs or gbs, "phase", f"phase {index}")
    phase_tokens = sum(p.tokens for p in request.phases)
    if phase_tokens >= total:
        raise MegapilotError(f"the phases' {phase_tokens:.4g} tokens leave none of the {total:.4g} budget",
                             field="phase", fix="phase tokens are part of --tokens: give fewer, or a larger budget")
    segments: list[Segment] = []
    main_tokens = total - phase_tokens
    if request.rampup is not None:
        for level_gbs, steps in request.rampup.levels(gbs):
            if main_tokens <= 0:
                break
            # a batch trains its steps' samples in full; the budget ends inside it when they are more than is left
            tokens = min(float(steps * level_gbs * seq), main_tokens)
            try:
                segments.append(_segment(f"batch warm-up {level_gbs:,}", tokens, Shape(seq, level_gbs), cost))
            except MegapilotError as exc:  # the shape's refusal names the option that asked for this batch
                raise MegapilotError(f"batch warm-up: {exc.problem}", field="rampup_batch_size",
                                     fix=f"{exc.fix} (START and each START + k x INCREMENT)") from None
            main_tokens -= tokens
    if main_tokens > 0:
        segments.append(_segment("main", main_tokens, Shape(seq, gbs), cost))
    for index, phase in enumerate(request.phases, start=1):
        shape = Shape(phase.seq_len or seq, phase.gbs or gbs, tuple(sorted(phase.layout_changes().items())))
        segments.append(_segment(f"phase {index}: {phase.label()}", phase.tokens, shape, cost))
    return segments


def _at_least_one_step(tokens: float, seq_len: int, gbs: int, field_name: str, what: str) -> None:
    """Megatron trains whole steps: a budget (or phase) under one step's tokens is a slip (10 for 10T), not a run."""
    step = seq_len * gbs
    if tokens < step:
        raise MegapilotError(f"{what} of {tokens:,.0f} tokens is less than one step (GBS {gbs:,} x seq {seq_len:,} = "
                             f"{step:,} tokens)", field=field_name,
                             fix=f"give at least {step:,} tokens (K, M, B or T suffix, e.g. 15.6T)")


def steps_to_train(tokens: float, seq_len: int, gbs: int) -> int:
    """The whole steps that train at least `tokens` at this sequence length and batch. Megatron trains whole steps
    and a budget is the least to train, so a part step counts as one: the one step count of a budget, for its time
    to train (`estimate`, `plan`) and for `script --tokens`'s --train-iters alike."""
    return -(-round(tokens) // (seq_len * gbs))  # token counts are whole: integer arithmetic, no float residue


def _segment(name: str, tokens: float, shape: Shape, cost: StepCost) -> Segment:
    answer = cost(shape)
    return Segment(name, tokens, shape, steps_to_train(tokens, shape.seq_len, shape.gbs), answer.step_time_s,
                   answer.fits, answer.layout_label)


@dataclass(frozen=True)
class Fleet:
    """The GPUs the run holds: how many, per node, and each one's TDP (None: unknown, no energy figure)."""

    gpus: int
    gpus_per_node: int
    tdp_w: float | None

    @classmethod
    def of(cls, cluster: ClusterSpec) -> Fleet:
        return cls(cluster.world_size, cluster.gpus_per_node, cluster.gpu.tdp_w)


def time_to_train(request: BudgetRequest, training: TrainingSpec, fleet: Fleet, cost: StepCost, *,
                  checkpoint: CheckpointCost, band: TimeBand) -> TimeToTrain:
    """The plan of the whole run. `cost` answers a step time per shape; `checkpoint` is the one to save (the
    request's measured one wins); `band` is the estimate's interval, as factors on its time.

    Daly's interval is counted in steps of the run as a whole (its failure-free time over its steps), as the run is
    priced: every piece's steps at their own time. Megatron's --save-interval counts every step, warm-up and phases
    alike, so the saves priced (compute / interval) are the saves made (steps / interval), and a warm-up that takes
    the whole budget, with no steady phase, is counted as it is priced."""
    segments = segments_for(request, training, cost)
    compute_s = sum(s.seconds for s in segments)
    iterations = sum(s.iterations for s in segments)
    used = request.measured_checkpoint or checkpoint
    run = goodput(compute_s, fleet.gpus, used, request.failure, gpus_per_node=fleet.gpus_per_node,
                  step_time_s=compute_s / iterations)
    return TimeToTrain(
        tokens=sum(s.tokens for s in segments), iterations=iterations,
        segments=tuple(segments), gpus=fleet.gpus, band=band,
        goodput=run, tdp_w=fleet.tdp_w, cost_per_gpu_hour=request.cost_per_gpu_hour,
    )


# ---- the estimator as a StepCost -------------------------------------------------------------------


def estimate_band(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> TimeBand:
    """The estimate's own 80 % interval (`coverage.band_for`, what its tokens/s line states) as factors on its time,
    or +/- UNCALIBRATED_BAND where no interval speaks for it (a CPU)."""
    from megapilot.estimate.coverage import band_for

    band = band_for(model, cluster.gpu, training.gemm_format)
    if band is None:
        return TimeBand.symmetric(UNCALIBRATED_BAND, "no published run checks this estimate: a stated ±30 %")
    return TimeBand.of_throughput(band.p10_error, band.p90_error, f"the estimate's 80 % interval, {band.basis}")


def layout_step_cost(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, parallel: ParallelConfig,
                     options: object | None = None) -> StepCost:
    """A StepCost from the estimator, for one layout: a shape's layout changes replace the layout's sizes (DP
    follows from the GPUs; a pipeline size change takes the balanced split when the layout had an explicit one,
    else the even one). A shape Megatron would refuse raises MegapilotError naming the phase."""
    from megapilot.estimate import estimate

    run_options = options if isinstance(options, EstimateOptions) else EstimateOptions()
    cache: dict[Shape, ShapeCost] = {}

    def cost(shape: Shape) -> ShapeCost:
        if shape not in cache:
            changed_training = training.model_copy(update={"seq_length": shape.seq_len,
                                                           "global_batch_size": shape.gbs})
            layout = _changed_layout(model, cluster, changed_training, run_options, parallel, dict(shape.layout))
            try:
                result = estimate(model, cluster, changed_training, layout, run_options)
            except MegapilotError as exc:
                raise MegapilotError(f"seq {shape.seq_len}, GBS {shape.gbs}: {exc.problem}", field="phase",
                                     fix=exc.fix) from None
            cache[shape] = ShapeCost(result.step_time_s, result.fits, _label(layout) if shape.layout else "")
        return cache[shape]

    return cost


def _changed_layout(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: EstimateOptions,
                    parallel: ParallelConfig, changes: dict[str, int]) -> ParallelConfig:
    if not changes:
        return parallel
    merged = parallel.model_dump() | changes
    model_parallel = merged["tp"] * merged["pp"] * merged["cp"]
    if cluster.world_size % model_parallel:
        raise MegapilotError(f"TP x PP x CP = {model_parallel} does not divide {cluster.world_size} GPUs",
                             field="phase", fix="pick phase sizes whose product divides the GPU count")
    merged["dp"] = cluster.world_size // model_parallel
    if merged["tp"] == 1:
        merged["sequence_parallel"] = False
    if ("pp" in changes or "vpp" in changes) and (merged["pp"], merged["vpp"]) != (parallel.pp, parallel.vpp):
        had_layout = parallel.pipeline_layout is not None
        merged |= {"first_stage_layers": None, "last_stage_layers": None, "pipeline_layout": None}
        if had_layout and merged["pp"] > 1:
            weights = stage_time_weights(model, cluster, training, _validated(merged), options)
            merged["pipeline_layout"] = balanced_split(model, merged["pp"], merged["vpp"], weights).layout
    return _validated(merged)


def _validated(merged: dict[str, object]) -> ParallelConfig:
    try:
        return ParallelConfig.model_validate(merged)
    except ValueError as exc:
        raise MegapilotError(f"the phase's layout is refused ({exc})".replace("\n", " "), field="phase",
                             fix="change the phase's tp/pp/vpp/cp") from None


def _label(p: ParallelConfig) -> str:
    return f"TP{p.tp} PP{p.pp}" + (f" VPP{p.vpp}" if p.vpp > 1 else "") + (f" CP{p.cp}" if p.cp > 1 else "") \
        + f" DP{p.dp}"
