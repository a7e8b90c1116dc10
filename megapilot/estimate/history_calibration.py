"""Calibration from a cluster's own runs: per-component corrections of the step-time model, fitted on measured runs.

Pure functions over typed run records (no I/O): the store supplies `MeasuredRun`s (each with the uncalibrated
components megapilot predicts for its layout), `calibrate` fits corrections for one case and returns the
calibrated step time with its error band, or says why it kept the uncalibrated one.

The model. The predicted step splits into components (`StepComponents`): compute (GEMMs, attention, glue,
recompute, activation offload) with the pipeline bubble (idle time of the other stages' compute, so it scales
with compute), exposed communication inside the scale-up domain (TP, CP, EP; DP and PP on a single node) and
across it (DP, PP across nodes), and fixed per-step time (optimizer step and what the model does not split).
A calibrated step is

    step = compute_factor x (compute + bubble) + scaleup_factor x scale-up comm
           + scaleout_factor x scale-out comm + fixed + overhead_s + micro-batches x microbatch_overhead_s

The two added overheads are what the model leaves out: per step (data loading, logging, a slow optimizer) and per
micro-batch (the host's work each micro-batch repeats whatever its size: Python, the schedule, op dispatch, the
batch's own loading). Runs at different micro-batch sizes tell them apart from compute: a larger micro-batch
moves the same tokens in fewer micro-batches, so its per-token compute stays and its per-micro-batch time shrinks.
On a GPU the host queues ahead and the per-micro-batch term stays near zero; on a CPU it is a large share of the
step, and a compute factor alone cannot say why MBS 2 runs faster than MBS 1.

Fit: weighted least squares on relative residuals (measured step / calibrated step - 1) with a Gaussian prior
on every correction centred on the uncalibrated model (factors 1, no overhead): with few runs, or runs far from
the case, the prior wins and the calibrated figure stays near the uncalibrated one. The weight of a run is its
nearness to the case: same model, same precision class, same family (dense / MoE / hybrid) and a similar layout
(TP, PP, CP, EP, VPP, micro-batch, GPUs, sequence) weigh most; a run of another GPU does not count. Separate
compute factors per precision class and family come from that weighting: a bf16 run hardly moves an fp8 case.
The prior's widths are those of a model that misses a run by about 30 %; where the uncalibrated model misses the
runs by more (a CPU, known to it by two probed rates), they widen in proportion (`prior_widening`).

Held out: every run used is predicted by the fit on the others (leave-one-out; of more than `MAX_RUNS` others,
on its `MAX_RUNS` nearest, the runs a case's own fit takes, so that the check grows with the runs). The band is the
90th percentile of those |residuals|, never narrower than one measured step's noise (`MIN_BAND`). When the held-out
median or p90 error is worse than the uncalibrated model's on the same runs, or better by less than one run's noise over
the square root of the runs (NOISE / sqrt(n), the noise of their median), the uncalibrated model already predicts
those runs as well as a fit on them could, and the fit would learn their noise (bench/calibration/
from_history.md: a group whose runs the model predicts within 1-5 % was predicted worse after calibrating on 3):
the runs calibrate the case with no correction (the model checked on them, so a suite's predicted gates gate with
it), and its band is the model's own error on them. Only a case with no plausible run of its GPU is uncalibrated.

Set aside: a run whose measured step is not a positive time, or more than `MAX_MISS_RATIO` from its own layout's
prediction (`implausible`: a unit slip, a run that timed one warm-up step, another machine), is fitted on by nothing
(`plausible`). `history import` refuses such a record; suite combos and `megapilot run` record theirs as measured,
so every fit asks it of the runs it reads: the history keeps the run, and the result names it and says why
(`Calibrated.set_aside`, `GroupFit.set_aside`, `runs_set_aside` of an estimate's calibration object).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from megapilot.estimate.coverage import WIDEN_OUTSIDE

# Prior standard deviations of the corrections, against the typical relative error of one measured step
# (NOISE): compute efficiency moves most with a new container or cluster; collectives are less well known but
# a smaller share of the step, so they take a correction only when runs with different layouts disagree; the
# fixed overhead is in units of the runs' own step time.
NOISE = 0.05
# The two overheads share about a tenth of a step (runs at one count of micro-batches cannot tell them apart, and
# then their sum has the prior of one overhead), the larger part per micro-batch: the host's work each micro-batch
# repeats is the larger cost the model leaves out (the optimizer and the step's own fixed work are modelled).
# Chosen on bench/calibration/from_history.py (k = 1, committed parameters): 0.05 / 0.1 gave 2.6 / 7.0 % median /
# p90, an even 0.07 / 0.07 2.7 / 7.1 %.
PRIOR_SD = {"compute": 0.3, "scaleup_comm": 0.5, "scaleout_comm": 0.5, "overhead": 0.05, "microbatch_overhead": 0.1}
FACTOR_BOUNDS = (0.2, 5.0)  # a correction outside is a different machine, not a calibration
# Nearness: a run of another model, precision class or family counts this much as one of the same;
# each factor-of-two difference in a layout dimension divides the weight by e^LAYOUT_SCALE.
OTHER_MODEL_WEIGHT = 0.3
OTHER_PRECISION_WEIGHT = 0.1
OTHER_FAMILY_WEIGHT = 0.3
LAYOUT_SCALE = 0.25
MIN_WEIGHT = 1e-3  # runs below it are not "used"
# A measured step further than this factor from its own uncalibrated prediction is no run the corrections could
# explain (they move compute within FACTOR_BOUNDS): a unit slipped (milliseconds given as seconds: 1000x; a job's
# tokens/s given as one GPU's) or the run is of another machine or layout. Fitted, a step given in milliseconds made
# an estimate's band +/-84,413 %, and one of 1e-300 s every correction NaN.
MAX_MISS_RATIO = 20.0
MAX_RUNS = 40  # the nearest runs of a large history a fit takes: the rest weigh little (and cost the held-out check)
BAND_QUANTILE = 0.9
# The narrowest band a calibration states: the next run's own step falls about this far from any prediction of it
# (one measured step's typical error, NOISE), however closely the runs used agreed with the model. One run predicted
# exactly gave +/-0.0 %, an interval of one point and a token budget's days with no spread at all.
MIN_BAND = NOISE
# A case whose precision class no run used ran: its band doubles, as the published runs' interval does for a format
# or kernel no published run had (coverage.WIDEN_OUTSIDE).
OTHER_PRECISION_BAND_WIDENING = WIDEN_OUTSIDE


@dataclass(frozen=True)
class StepComponents:
    """A step split into what each correction scales, seconds."""

    compute_s: float
    bubble_s: float
    scaleup_comm_s: float
    scaleout_comm_s: float
    fixed_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.bubble_s + self.scaleup_comm_s + self.scaleout_comm_s + self.fixed_s

    @property
    def comm_s(self) -> float:
        return self.scaleup_comm_s + self.scaleout_comm_s

    @classmethod
    def from_breakdown(cls, breakdown_s: Mapping[str, float], step_time_s: float, *, multi_node: bool
                       ) -> StepComponents:
        """The step-time model's breakdown (`StepTime.breakdown_s`) grouped by correction; what the breakdown does
        not name (the step minus its terms) is fixed time, so that the components add up to the step."""
        get = breakdown_s.get
        compute = get("compute", 0.0) + get("recompute", 0.0) + get("cpu_offload", 0.0)
        bubble = get("pp_bubble", 0.0)
        scaleup = get("tp_comm", 0.0) + get("cp_comm", 0.0) + get("ep_comm", 0.0)
        node_crossing = get("dp_comm", 0.0) + get("pp_comm", 0.0)
        scaleout = node_crossing if multi_node else 0.0
        scaleup += 0.0 if multi_node else node_crossing
        fixed = max(0.0, step_time_s - compute - bubble - scaleup - scaleout)
        return cls(compute, bubble, scaleup, scaleout, fixed)


@dataclass(frozen=True)
class RunKey:
    """What makes two runs near: the model, its precision class and family, the GPU and the layout."""

    model: str
    family: str  # dense / moe / hybrid
    precision: str  # bf16 / fp8 / fp4 (coverage.precision_class)
    gpu: str
    gpus: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    mbs: int = 1
    gbs: int = 1
    seq_len: int = 1

    @property
    def microbatches(self) -> float:
        """Micro-batches each rank runs per step: GBS / (MBS x data-parallel ranks); at least one."""
        dp = max(1, self.gpus // max(1, self.tp * self.pp * self.cp))
        return max(1.0, self.gbs / (max(1, self.mbs) * dp))


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run of the history with the uncalibrated prediction of its own layout."""

    run_id: str
    key: RunKey
    predicted: StepComponents
    measured_step_time_s: float


@dataclass(frozen=True)
class Corrections:
    """Multipliers on the components, an added per-step overhead and an added per-micro-batch overhead; `NONE`
    is the uncalibrated model."""

    compute: float = 1.0
    scaleup_comm: float = 1.0
    scaleout_comm: float = 1.0
    overhead_s: float = 0.0
    microbatch_overhead_s: float = 0.0

    def added_s(self, microbatches: float) -> float:
        """The step time the corrections add beyond the modelled terms (both overheads)."""
        return self.overhead_s + microbatches * self.microbatch_overhead_s

    def apply(self, c: StepComponents, microbatches: float) -> float:
        return (self.compute * (c.compute_s + c.bubble_s) + self.scaleup_comm * c.scaleup_comm_s
                + self.scaleout_comm * c.scaleout_comm_s + c.fixed_s + self.added_s(microbatches))

    def scaled(self, c: StepComponents, microbatches: float) -> StepComponents:
        """The components as calibrated (the overheads join the fixed time)."""
        return StepComponents(self.compute * c.compute_s, self.compute * c.bubble_s,
                              self.scaleup_comm * c.scaleup_comm_s, self.scaleout_comm * c.scaleout_comm_s,
                              c.fixed_s + self.added_s(microbatches))


NONE = Corrections()

COMPUTE_TERMS = ("compute", "recompute", "cpu_offload", "pp_bubble")
SCALEUP_TERMS = ("tp_comm", "cp_comm", "ep_comm")
NODE_CROSSING_TERMS = ("dp_comm", "pp_comm")


def scaled_breakdown(breakdown_s: Mapping[str, float], corrections: Corrections, *, multi_node: bool,
                     microbatches: float) -> dict[str, float]:
    """The step-time model's terms as calibrated (`fixed`, when present, takes the added overheads)."""
    scaled = {}
    for term, value in breakdown_s.items():
        if term in COMPUTE_TERMS:
            factor = corrections.compute
        elif term in SCALEUP_TERMS or (term in NODE_CROSSING_TERMS and not multi_node):
            factor = corrections.scaleup_comm
        elif term in NODE_CROSSING_TERMS:
            factor = corrections.scaleout_comm
        else:
            factor = 1.0
        scaled[term] = value * factor
    scaled["fixed"] = scaled.get("fixed", 0.0) + corrections.added_s(microbatches)
    return scaled


@dataclass(frozen=True)
class HeldOut:
    """Leave-one-out over the runs used: |error| of each run predicted without it, calibrated and not."""

    calibrated: tuple[float, ...]
    uncalibrated: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.calibrated) if self.calibrated else math.nan

    @property
    def p90(self) -> float:
        return quantile(self.calibrated, BAND_QUANTILE)

    @property
    def uncalibrated_median(self) -> float:
        return statistics.median(self.uncalibrated) if self.uncalibrated else math.nan

    @property
    def uncalibrated_p90(self) -> float:
        return quantile(self.uncalibrated, BAND_QUANTILE)

    def better_by(self, margin: float) -> bool:
        """The calibration predicts held-out runs better than the uncalibrated model by at least `margin` (relative
        error) on median or p90: by less, the runs' own noise could be all it learned."""
        return self.median <= self.uncalibrated_median - margin or self.p90 <= self.uncalibrated_p90 - margin

    @property
    def worse(self) -> bool:
        """The calibration predicts held-out runs worse than the uncalibrated model, on median or p90."""
        if not self.calibrated:
            return False
        return self.median > self.uncalibrated_median + 1e-9 or self.p90 > self.uncalibrated_p90 + 1e-9


@dataclass(frozen=True)
class SetAside:
    """A run of the history the calibration does not fit on, and why; the history keeps it as it was recorded."""

    run_id: str
    why: str


@dataclass(frozen=True)
class Calibrated:
    """One case's step time, calibrated on the runs named, or the uncalibrated one and why."""

    uncalibrated_step_time_s: float
    step_time_s: float
    applied: bool
    reason: str
    corrections: Corrections
    components: StepComponents  # as calibrated (the uncalibrated ones when not applied)
    runs_used: tuple[str, ...]
    weights: tuple[float, ...]
    held_out: HeldOut
    band: float | None  # relative: the p90 of the held-out |error|; None without runs
    set_aside: tuple[SetAside, ...] = ()  # runs of the case's GPU not fitted on (`plausible`), and why

    @property
    def factor(self) -> float:
        """Calibrated / uncalibrated step time."""
        return self.step_time_s / self.uncalibrated_step_time_s


# ---- nearness ------------------------------------------------------------------------------------------

def nearness(case: RunKey, run: RunKey) -> float:
    """How much a run counts for a case, in [0, 1]: 0 for another GPU."""
    if case.gpu.lower() != run.gpu.lower():
        return 0.0
    weight = 1.0
    weight *= 1.0 if case.model == run.model else OTHER_MODEL_WEIGHT
    weight *= 1.0 if case.precision == run.precision else OTHER_PRECISION_WEIGHT
    weight *= 1.0 if case.family == run.family else OTHER_FAMILY_WEIGHT
    distance = sum(abs(math.log2(max(1, getattr(case, name)) / max(1, getattr(run, name))))
                   for name in ("tp", "pp", "cp", "ep", "vpp", "mbs", "gpus", "seq_len"))
    distance += 0.5 * abs(math.log2(max(1, case.gbs) / max(1, run.gbs)))
    return weight * math.exp(-LAYOUT_SCALE * distance)


# ---- the fit -------------------------------------------------------------------------------------------

_NAMES = ("compute", "scaleup_comm", "scaleout_comm", "overhead", "microbatch_overhead")
_ADDED = (3, 4)  # the overheads: seconds >= 0, prior 0; the rest are factors, prior 1
CORRECTIONS = _NAMES


def fit(runs: Sequence[MeasuredRun], weights: Sequence[float], free: Sequence[str] = CORRECTIONS) -> Corrections:
    """The corrections that best explain the runs (weighted relative residuals), shrunk toward `NONE`.

    Linear in the corrections, so the normal equations are solved directly; a factor the bounds refuse is
    held at its bound and the rest refitted. `free`: the corrections fitted (the others stay uncalibrated)."""
    if not runs or sum(weights) <= 0:
        return NONE
    return _fit_system(_system(runs, weights), free)


@dataclass(frozen=True)
class _System:
    """The normal equations of one fit (runs and weights, the prior added) and the units of its overheads: what
    every choice of free corrections shares, built once for all of them."""

    normal: list[list[float]]
    rhs: list[float]
    scale_s: float
    scale_microbatches: float


def _system(runs: Sequence[MeasuredRun], weights: Sequence[float]) -> _System:
    scale_s = _weighted_median([r.measured_step_time_s for r in runs], weights)
    scale_microbatches = _weighted_median([r.key.microbatches for r in runs], weights)
    widen = prior_widening(runs, weights)
    normal, rhs = _normal_equations(runs, weights, scale_s, scale_microbatches, widen)
    return _System(normal, rhs, scale_s, scale_microbatches)


def _fit_system(system: _System, free: Sequence[str]) -> Corrections:
    held: dict[int, float] = {i: (0.0 if i in _ADDED else 1.0) for i, name in enumerate(_NAMES) if name not in free}
    for _ in range(len(_NAMES)):
        theta = _solve(system.normal, system.rhs, held)
        clipped = False
        for index, value in enumerate(theta):
            low, high = (0.0, math.inf) if index in _ADDED else FACTOR_BOUNDS
            if index not in held and not low <= value <= high:
                held[index] = min(max(value, low), high)
                clipped = True
        if not clipped:
            break
    theta = _solve(system.normal, system.rhs, held)
    scale_s = system.scale_s
    return Corrections(theta[0], theta[1], theta[2], max(0.0, theta[3]) * scale_s,
                       max(0.0, theta[4]) * scale_s / system.scale_microbatches)


def prior_widening(runs: Sequence[MeasuredRun], weights: Sequence[float]) -> float:
    """How much wider than `PRIOR_SD` the prior is for these runs (empirical Bayes): the priors say how far the
    corrections of a model that misses a run by about the compute prior's width may move; where the uncalibrated
    model misses the runs by more (its weighted median `miss`: a CPU, which the model knows
    only by two probed rates, missed by 2x), the corrections are known that much less well, and a prior as narrow
    as a GPU's would hold the calibrated step far from every run."""
    typical = _weighted_median([miss(r.predicted.total_s, r.measured_step_time_s) for r in runs], weights)
    return max(1.0, typical / PRIOR_SD["compute"])


def miss(predicted_s: float, measured_s: float) -> float:
    """How far a predicted step is from the measured one, the same either way: 2x too short and 2x too long both
    miss by 100 %. (|predicted / measured - 1| cannot exceed 100 % for a prediction too short, so a model that
    under-predicts every run by 60 % would look better than a calibration that lands between two runs 2x apart,
    which a busy host gives healthy runs.) Equal to |predicted / measured - 1| to first order for small misses."""
    return max(predicted_s / measured_s, measured_s / predicted_s) - 1


def implausible(predicted_s: float, measured_s: float) -> str | None:
    """Why a measured step cannot calibrate the model (`MAX_MISS_RATIO`), or None when it can."""
    if miss(predicted_s, measured_s) <= MAX_MISS_RATIO - 1:
        return None
    return (f"is {measured_s / predicted_s:.3g} times the {predicted_s:.4g} s predicted for its layout: more than "
            f"{MAX_MISS_RATIO:g}x off is a unit slip or another machine, not a run to calibrate on")


def unusable(run: MeasuredRun) -> str | None:
    """Why a run of the history cannot calibrate the model, or None when it can: no positive measured step, no
    prediction of its layout, or a step `implausible` against that prediction. `history import` refuses such a
    record; suite combos and `megapilot run` record theirs as measured (a run that timed one warm-up step, a step
    of 0 or absurd), so the calibration asks this of every run it reads, wherever it came from."""
    measured, predicted = run.measured_step_time_s, run.predicted.total_s
    if not (math.isfinite(measured) and measured > 0):
        return f"its measured step ({measured:g} s) is not a positive time"
    if not (math.isfinite(predicted) and predicted > 0):
        return "its layout has no prediction to calibrate against"
    problem = implausible(predicted, measured)
    return None if problem is None else f"its measured step of {measured:.4g} s {problem}"


def plausible(runs: Iterable[MeasuredRun]) -> tuple[list[MeasuredRun], list[SetAside]]:
    """The runs the calibration may fit on, and those it sets aside with why (`unusable`), each in the given order."""
    kept: list[MeasuredRun] = []
    aside: list[SetAside] = []
    for run in runs:
        why = unusable(run)
        if why is None:
            kept.append(run)
        else:
            aside.append(SetAside(run.run_id, why))
    return kept, aside


def set_aside_text(aside: Sequence[SetAside]) -> str:
    """What a calibration's reason adds for the runs it set aside ("" for none)."""
    if not aside:
        return ""
    return f"; {len(aside)} run(s) set aside, kept in the history but not fitted: " + "; ".join(
        f"{a.run_id} ({a.why})" for a in aside)


def _normal_equations(runs: Sequence[MeasuredRun], weights: Sequence[float], scale_s: float,
                      scale_microbatches: float, widen: float = 1.0) -> tuple[list[list[float]], list[float]]:
    """The normal equations of argmin sum w (x.theta + fixed - m)^2 / m^2 / NOISE^2 + sum ((theta - prior) / sd)^2.

    The overheads are in units of the runs' typical step (`scale_s`): the per-step one as is, the per-micro-batch
    one at the runs' typical count of micro-batches, so that both priors say "a tenth of a step"."""
    n = len(_NAMES)
    prior = [1.0, 1.0, 1.0, 0.0, 0.0]
    normal = [[0.0] * n for _ in range(n)]
    rhs = [0.0] * n
    for run, weight in zip(runs, weights, strict=True):
        c, m = run.predicted, run.measured_step_time_s
        x = [(c.compute_s + c.bubble_s) / m, c.scaleup_comm_s / m, c.scaleout_comm_s / m, scale_s / m,
             run.key.microbatches / scale_microbatches * scale_s / m]
        y = (m - c.fixed_s) / m
        w = weight / NOISE**2
        for i in range(n):
            rhs[i] += w * x[i] * y
            for j in range(n):
                normal[i][j] += w * x[i] * x[j]
    for i, name in enumerate(_NAMES):
        precision = 1.0 / (widen * PRIOR_SD[name]) ** 2
        normal[i][i] += precision
        rhs[i] += precision * prior[i]
    return normal, rhs


def _solve(normal_in: Sequence[Sequence[float]], rhs_in: Sequence[float], held: Mapping[int, float]) -> list[float]:
    """The normal equations solved with some corrections held (each held row says theta_i = value); the given
    equations are left as they are, for the next choice of held corrections."""
    n = len(rhs_in)
    normal = [list(row) for row in normal_in]
    rhs = list(rhs_in)
    for i, value in held.items():  # a held correction: its row says theta_i = value
        normal[i] = [1.0 if j == i else 0.0 for j in range(n)]
        rhs[i] = value
        for k in range(n):
            if k != i:
                rhs[k] -= normal[k][i] * value
                normal[k][i] = 0.0
    return _gauss(normal, rhs)


def _gauss(a: list[list[float]], b: list[float]) -> list[float]:
    """Solve a x = b (a symmetric positive definite, small) by Gaussian elimination with partial pivoting."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for k in range(col, n + 1):
                m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


# ---- one case -------------------------------------------------------------------------------------------

def calibrate(key: RunKey, predicted: StepComponents, runs: Iterable[MeasuredRun]) -> Calibrated:
    """The case's step time calibrated on the runs (those of its GPU, weighted by nearness); a run of its GPU that
    cannot calibrate (`unusable`) is set aside and named in the result and its reason."""
    runs = list(runs)
    measured, unusable_runs = plausible(runs)
    keys = {run.run_id: run.key for run in runs}
    # named where it would have counted (another GPU's never would)
    aside = [left for left in unusable_runs if nearness(key, keys[left.run_id]) >= MIN_WEIGHT]
    told = set_aside_text(aside)
    used = [(run, nearness(key, run.key)) for run in measured]
    used = sorted([(run, weight) for run, weight in used if weight >= MIN_WEIGHT], key=lambda pair: -pair[1])[:MAX_RUNS]
    uncalibrated = predicted.total_s
    if not used:
        gpus = sorted({run.key.gpu for run in measured})
        held = f" (its runs are on {', '.join(gpus)})" if gpus else ""
        plain = " plausible" if aside else ""
        return Calibrated(uncalibrated, uncalibrated, False,
                          f"no{plain} measured run on {key.gpu} in this cluster's history{held}{told}", NONE,
                          predicted, (), (), HeldOut((), ()), None, tuple(aside))
    runs_used = [run for run, _ in used]
    weights = [weight for _, weight in used]
    corrections = fit(runs_used, weights)
    held_out = leave_one_out(runs_used, weights)
    ids = tuple(run.run_id for run in runs_used)
    rounded = tuple(round(w, 4) for w in weights)
    # The held-out misses are the runs' own: if none of them ran the case's precision class (an NVFP4 case among
    # FP8 runs), what that format's GEMMs and casts cost is checked by none of them, as by no published run.
    other_precision = all(run.key.precision != key.precision for run in runs_used)
    widen = OTHER_PRECISION_BAND_WIDENING if other_precision else 1.0
    told = (f"; none of them ran {key.precision}: band widened x{widen:g}" if other_precision else "") + told
    if held_out.worse:
        # checked on the runs, the model predicts them better than any fit on them: it stands as it is, a calibrated
        # prediction with no correction (gated as one), its band its own error on them
        return Calibrated(uncalibrated, uncalibrated, True,
                          f"calibrated on {len(runs_used)} run(s) with no correction: a fit on them was worse than "
                          f"the uncalibrated model on held-out runs (median {_pct_text(held_out.median)} vs "
                          f"{_pct_text(held_out.uncalibrated_median)}, p90 {_pct_text(held_out.p90)} vs "
                          f"{_pct_text(held_out.uncalibrated_p90)}){told}",
                          NONE, predicted, ids, rounded, held_out, widen * max(MIN_BAND, held_out.uncalibrated_p90),
                          tuple(aside))
    margin = NOISE / math.sqrt(len(runs_used))
    if len(runs_used) > 1 and not held_out.better_by(margin):
        # checked on the runs, the model stands as it is: a calibrated prediction with no correction
        return Calibrated(uncalibrated, uncalibrated, True,
                          f"calibrated on {len(runs_used)} run(s) with no correction: the uncalibrated model already "
                          f"predicts them within their noise ({_pct_text(margin)}; held out: median "
                          f"{_pct_text(held_out.uncalibrated_median)}, a fit {_pct_text(held_out.median)}){told}",
                          NONE, predicted, ids, rounded, held_out, widen * max(MIN_BAND, held_out.uncalibrated_p90),
                          tuple(aside))
    band = widen * max(MIN_BAND, held_out.p90 if len(runs_used) > 1 else held_out.uncalibrated_p90)
    reason = (f"calibrated on {len(runs_used)} run(s)" + (
        f"; held out: median {_pct_text(held_out.median)} (uncalibrated {_pct_text(held_out.uncalibrated_median)})"
        if len(runs_used) > 1 else f"; one run: no held-out check, the band is its uncalibrated error (at least "
                                   f"{_pct_text(MIN_BAND)}, one step's noise)")) + told
    return Calibrated(uncalibrated, corrections.apply(predicted, key.microbatches), True, reason, corrections,
                      corrections.scaled(predicted, key.microbatches), ids, rounded, held_out, band, tuple(aside))


def _pct_text(value: float) -> str:
    """A relative error as a percentage, with the digits that tell two small ones apart (0.0014 %, not 0.0 %)."""
    pct = 100 * value
    return f"{pct:.1f} %" if pct == 0 or abs(pct) >= 0.1 or math.isnan(pct) else f"{pct:.2g} %"


def leave_one_out(runs: Sequence[MeasuredRun], weights: Sequence[float], free: Sequence[str] = CORRECTIONS
                  ) -> HeldOut:
    """Each run predicted by the fit on the others (weighted by their nearness to it), and by the plain model. One
    run alone has no others to fit on: its held-out calibrated error is not known (none is given), where the plain
    model's error on it is. Of more than `MAX_RUNS` others, a run is predicted from its `MAX_RUNS` nearest
    (`held_out_all`)."""
    return held_out_all(runs, (free,))[0]


def held_out_all(runs: Sequence[MeasuredRun], frees: Sequence[Sequence[str]]) -> list[HeldOut]:
    """`leave_one_out` for several choices of free corrections at once: each left-out run's fit is built once (its
    others, their weights and normal equations) and solved for every choice.

    A run with more than `MAX_RUNS` others is predicted from its `MAX_RUNS` nearest, as `calibrate` predicts a
    case (its fit is on the nearest `MAX_RUNS` runs): the held-out error is then the error of the calibration a
    user would get for that run, and the check grows with the runs, not with their square. A fit on every other run
    of a large history was one `calibrate` never makes, and cost 14 s for one group of 400 runs. Up to
    `MAX_RUNS` + 1 runs nothing changes: each is predicted from all the others, in their order."""
    calibrated: list[list[float]] = [[] for _ in frees]
    uncalibrated = []
    nearest = _nearest_others(runs, MAX_RUNS) if len(runs) > MAX_RUNS + 1 else None
    for index, run in enumerate(runs):
        measured = run.measured_step_time_s
        uncalibrated.append(miss(run.predicted.total_s, measured))
        picked = range(len(runs)) if nearest is None else nearest[index]
        others = [runs[i] for i in picked if i != index]
        if not others:
            continue
        weights = [nearness(run.key, r.key) for r in others]
        if sum(weights) <= 0:
            fits = [NONE] * len(frees)
        else:
            system = _system(others, weights)
            fits = [_fit_system(system, free) for free in frees]
        for errors, corrections in zip(calibrated, fits, strict=True):
            errors.append(miss(corrections.apply(run.predicted, run.key.microbatches), measured))
    return [HeldOut(tuple(errors), tuple(uncalibrated)) for errors in calibrated]


def _nearest_others(runs: Sequence[MeasuredRun], count: int) -> list[list[int]]:
    """For each run, the indices of its `count` nearest other runs (by `nearness`, ties to the earlier run), in the
    runs' order. Runs of one key share one ranking, and the ranking is by the logarithm of `nearness` built from
    per-key logarithms (no exponential per pair): the same order, a fraction of the time, over a history of
    hundreds of runs where every pair is compared."""
    dims = ("tp", "pp", "cp", "ep", "vpp", "mbs", "gpus", "seq_len")
    logs = {}
    for run in runs:
        key = run.key
        if key not in logs:
            logs[key] = ([math.log2(max(1, getattr(key, name))) for name in dims], math.log2(max(1, key.gbs)))
    rankings: dict[RunKey, list[int]] = {}
    nearest = []
    for index, run in enumerate(runs):
        case = run.key
        ranking = rankings.get(case)
        if ranking is None:
            case_logs, case_gbs = logs[case]
            scores = []
            for other in runs:
                key = other.key
                if key.gpu.lower() != case.gpu.lower():
                    scores.append(-math.inf)
                    continue
                key_logs, key_gbs = logs[key]
                distance = sum(abs(a - b) for a, b in zip(case_logs, key_logs, strict=True))
                distance += 0.5 * abs(case_gbs - key_gbs)
                score = -LAYOUT_SCALE * distance
                score += 0.0 if case.model == key.model else math.log(OTHER_MODEL_WEIGHT)
                score += 0.0 if case.precision == key.precision else math.log(OTHER_PRECISION_WEIGHT)
                score += 0.0 if case.family == key.family else math.log(OTHER_FAMILY_WEIGHT)
                scores.append(score)
            ranking = sorted(range(len(runs)), key=lambda i: -scores[i])  # stable: ties keep the runs' order
            rankings[case] = ranking
        nearest.append(sorted([i for i in ranking[:count + 1] if i != index][:count]))
    return nearest


@dataclass(frozen=True)
class GroupFit:
    """A cluster's runs of one GPU, precision class and family: the corrections fitted on all of them, and the
    held-out error with every correction, with none, and with each one alone (how much each one improves it)."""

    gpu: str
    precision: str
    family: str
    runs: int
    corrections: Corrections
    held_out: HeldOut
    median_by_correction: dict[str, float]  # held-out median |error| with only that correction fitted
    set_aside: tuple[SetAside, ...] = ()  # the group's runs not fitted on (`plausible`), and why


def cluster_fits(runs: Sequence[MeasuredRun]) -> list[GroupFit]:
    """`history calibration`: one fit per (GPU, precision class, family) of a cluster's runs, each on its runs that
    may calibrate (`plausible`); a group whose runs are all set aside is listed with none, naming them."""
    groups: dict[tuple[str, str, str], list[MeasuredRun]] = {}
    for run in runs:
        groups.setdefault((run.key.gpu, run.key.precision, run.key.family), []).append(run)
    fits = []
    for (gpu, precision, family), group in sorted(groups.items()):
        members, aside = plausible(group)
        weights = [1.0] * len(members)
        # every correction, then each alone: one pass over the left-out runs solves them all
        held_out, *each = held_out_all(members, [CORRECTIONS, *((name,) for name in CORRECTIONS)])
        alone = {name: one.median for name, one in zip(CORRECTIONS, each, strict=True)}
        fits.append(GroupFit(gpu, precision, family, len(members), fit(members, weights), held_out, alone,
                             tuple(aside)))
    return fits


def calibrate_estimate(case: Any, result: Any, runs: Sequence[MeasuredRun], cluster: str
                       ) -> tuple[Any, dict[str, Any]]:
    """An `EstimateResult` of a `Case`, calibrated on a cluster's runs: (the result with calibrated step time,
    tokens/s, TFLOP/s, MFU and breakdown; the `calibration_from_history` object that names the cluster, the
    uncalibrated figures, the corrections, the runs used and the band).

    Applied, the result's `calibration` states the cluster's calibration, the one its figures now use; the
    published runs' statement, which speaks of the uncalibrated figures, moves beside them (`uncalibrated`). A
    reader of either then sees one calibration per set of figures, never two for one."""
    from megapilot.estimate.coverage import family_of, precision_class

    p = case.parallel
    key = RunKey(model=case.model.name, family=family_of(case.model), precision=precision_class(
        case.training.precision), gpu=case.cluster.gpu.name, gpus=case.cluster.world_size, tp=p.tp, pp=p.pp, cp=p.cp,
        ep=p.ep, vpp=p.vpp or 1, mbs=p.mbs, gbs=case.training.global_batch_size, seq_len=case.training.seq_length)
    multi_node = case.cluster.num_nodes > 1
    components = StepComponents.from_breakdown(result.time_breakdown_s, result.step_time_s, multi_node=multi_node)
    calibrated = calibrate(key, components, runs)
    factor = calibrated.factor
    about = {
        "cluster": cluster, "applied": calibrated.applied, "reason": calibrated.reason,
        "uncalibrated": {"step_time_s": result.step_time_s, "tokens_per_s_per_gpu": result.tokens_per_s_per_gpu,
                         "tflops_per_gpu": result.tflops_per_gpu, "mfu": result.mfu,
                         "calibration": result.calibration},
        "corrections": {"compute": calibrated.corrections.compute,
                        "scaleup_comm": calibrated.corrections.scaleup_comm,
                        "scaleout_comm": calibrated.corrections.scaleout_comm,
                        "overhead_s": calibrated.corrections.overhead_s,
                        "microbatch_overhead_s": calibrated.corrections.microbatch_overhead_s},
        "runs_used": [{"id": run_id, "weight": weight} for run_id, weight in
                      zip(calibrated.runs_used, calibrated.weights, strict=True)],
        "runs_set_aside": [{"id": aside.run_id, "why": aside.why} for aside in calibrated.set_aside],
        "band_pct": None if calibrated.band is None else round(100 * calibrated.band, 2),
        "held_out_median_pct": _pct_or_none(calibrated.held_out.median),
        "uncalibrated_held_out_median_pct": _pct_or_none(calibrated.held_out.uncalibrated_median),
    }
    if not calibrated.applied:  # no plausible run of its GPU: the published runs' figures and interval stand
        return result, about
    breakdown = scaled_breakdown(result.time_breakdown_s, calibrated.corrections, multi_node=multi_node,
                                 microbatches=key.microbatches)
    breakdown["overhead"] = breakdown.pop("fixed")  # the per-step time the runs show beyond every modelled term
    tokens = result.tokens_per_s_per_gpu / factor
    low, high = calibrated_interval(tokens, calibrated.band)
    band = "" if calibrated.band is None else f"; band +/-{100 * calibrated.band:.1f} %"
    updated = result.model_copy(update={
        "calibration": f"calibration: figures calibrated on cluster {cluster} "
                       f"({calibrated.reason.removeprefix('calibrated on ')}{band})",
        "step_time_s": calibrated.step_time_s, "tokens_per_s_per_gpu": tokens,
        "tflops_per_gpu": result.tflops_per_gpu / factor, "mfu": result.mfu / factor,
        "tokens_per_s_per_gpu_p10": low, "tokens_per_s_per_gpu_p90": high,
        "interval_basis": None if calibrated.band is None else (
            f"calibrated on cluster {cluster}: {len(calibrated.runs_used)} run(s), band {100 * calibrated.band:.1f} %"),
        # the published runs' caveat speaks of the uncalibrated figures: it moved to `uncalibrated`, not a warning
        "warnings": [warning for warning in result.warnings if warning != result.calibration],
        "time_breakdown_s": {k: round(v, 6) for k, v in breakdown.items()}})
    return updated, about


def calibrated_interval(tokens_per_s: float, band: float | None) -> tuple[float | None, float | None]:
    """The 80 % interval of a calibrated tokens/s: the measured step misses the calibrated one by at most the band
    (the p90 of the held-out `miss`, the same either way) at least 80 % of the time, so tokens/s lies within a
    factor 1 + band of it. The published runs' interval of the uncalibrated estimate says nothing of a figure the
    cluster's runs have moved (it could leave the calibrated point outside its own ends)."""
    if band is None:
        return None, None
    return round(tokens_per_s / (1 + band), 1), round(tokens_per_s * (1 + band), 1)


def _pct_or_none(value: float) -> float | None:
    return None if math.isnan(value) else round(100 * value, 2)


def single_factor(key: RunKey, predicted: StepComponents, runs: Iterable[MeasuredRun]) -> float:
    """The baseline: the step scaled by the median measured / predicted ratio of the runs of the same model, GPU
    and precision (the uncalibrated step when there is none)."""
    ratios = [r.measured_step_time_s / r.predicted.total_s for r in runs
              if r.key.model == key.model and r.key.gpu.lower() == key.gpu.lower() and r.key.precision == key.precision]
    return predicted.total_s * (statistics.median(ratios) if ratios else 1.0)


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (NaN for none)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    pairs = sorted(zip(values, weights, strict=True))
    half = sum(weights) / 2
    running = 0.0
    for value, weight in pairs:
        running += weight
        if running >= half:
            return value
    return pairs[-1][0]


def without(runs: Iterable[MeasuredRun], run_id: str) -> list[MeasuredRun]:
    """The runs, less one (a run is never calibrated on itself)."""
    return [r for r in runs if r.run_id != run_id]


__all__ = [
    "NONE",
    "Calibrated",
    "Corrections",
    "GroupFit",
    "HeldOut",
    "MeasuredRun",
    "RunKey",
    "SetAside",
    "StepComponents",
    "calibrate",
    "calibrate_estimate",
    "calibrated_interval",
    "cluster_fits",
    "fit",
    "held_out_all",
    "implausible",
    "leave_one_out",
    "miss",
    "nearness",
    "plausible",
    "quantile",
    "scaled_breakdown",
    "set_aside_text",
    "single_factor",
    "unusable",
    "without",
]
