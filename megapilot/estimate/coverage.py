"""Calibration coverage: which published runs stand behind an estimate, and how far off they were.

`data/calibration_coverage.json` (written by `bench/calibration/release_holdout.py`) lists every calibrated
cell - model family (dense / MoE / hybrid), GPU and precision - with its published runs (the old file and NeMo
25.02/25.04 in the fit, NeMo 25.07 and Megatron-Bridge 25.09 held out by release), the model's median |error|
there and its median signed error: which way the estimates leaned, stated where the lean is a pattern (MoE on
Blackwell ran high). An estimate is placed in its cell, or the nearest one (the same family on the same vendor's
GPUs: its own architecture's before the next generation's, then its precision's, then this GPU's own, then the one
with more runs; `nearest_coverage` says why); a case outside every calibrated family and vendor (AMD GPUs, hybrid
Mamba models today), or whose model runs a mechanism no published run had (`mechanisms`: attention sinks, a
sliding window, Gated DeltaNet, NVFP4 GEMMs, ...), gets a caveat saying that no published run checks it, and a
wider interval.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from megapilot.estimate.attention_bounds import waits_on_exponentials
from megapilot.estimate.efficiency import NVFP4_OVER_FP8_RATE
from megapilot.spec.hardware import GPUSpec
from megapilot.spec.model import ModelSpec
from megapilot.spec.training import QUANTIZED_PRECISIONS


@dataclass(frozen=True)
class CoverageCell:
    """One calibrated (family, GPU, precision) and how the model did on its published runs."""

    family: str
    gpu: str
    precision: str
    runs: int
    median_abs_error: float
    median_signed_error: float  # of predicted / published tokens/s - 1: > 0 the estimates ran fast
    # The same error on this cell's runs when the fit never saw their model family, then their GPU
    # (bench/calibration/run.py's leave-one-family-out and leave-one-GPU-out): what the next model or machine gets.
    heldout_errors: tuple[float, ...] = ()

    def lean(self) -> str:
        """Which way the estimates leaned in this cell, when the lean is a pattern rather than noise (the median
        signed error at least half the median |error| and at least LEAN_FLOOR; a median, so that one outlier
        does not set the direction): ', throughput predicted high: median +18.1 %' or ''."""
        lean = self.median_signed_error
        if abs(lean) < max(LEAN_FLOOR, self.median_abs_error / 2):
            return ""
        return f", throughput predicted {'high' if lean > 0 else 'low'}: median {100 * lean:+.1f} %"


LEAN_FLOOR = 0.03  # a median signed error below 3 % is within the spread of any cell: not stated


@dataclass(frozen=True)
class CalibrationCoverage:
    """Where an estimate stands against the published runs: its own cell, the nearest one, or none."""

    family: str
    gpu: str
    precision: str
    nearest: CoverageCell | None
    exact: bool
    # The model's priced code paths no published run has (`mechanisms`): its cell's errors never saw them.
    unchecked_mechanisms: tuple[str, ...] = ()
    # The families whose held-out errors the interval borrows when this family has too few (`related_families`).
    related: tuple[str, ...] = ()
    # A device whose host dispatches every op in line with its work (this machine's CPU): no published run is of one,
    # and what paces it most is what the device rates leave out.
    host_paced: bool = False
    gemm_format: str = ""  # the estimate's GEMM precision (nvfp4, mxfp4, ...), where its class says too little

    @property
    def outside(self) -> bool:
        """No published run of this family on this vendor's GPUs was ever used to check the model."""
        return self.nearest is None

    @property
    def needs_caveat(self) -> bool:
        return self.outside or bool(self.unchecked_mechanisms) or self.host_paced

    def statement(self) -> str:
        # FP16's GEMMs run at BF16's tensor-core rate and are priced so, in BF16's class; the line names what the
        # case ran, not only its class, so an FP16 estimate is not read as a BF16 one
        shown = (f"fp16 (priced as {self.precision}, one tensor-core rate; no published run is fp16)"
                 if self.gemm_format == "fp16" else self.precision)
        case = f"{self.family} on {self.gpu} {shown}"
        if self.host_paced:
            return (f"calibration: no published run is of a CPU ({case}); the model prices its measured matmul, "
                    "memory and per-op rates with the trainer's op counts, not what else a CPU core computes slowly "
                    "(the GELU's erf) nor what the same work loses on two ranks against one (first predictions "
                    f"within {CPU_FIRST_PREDICTION_ERROR_PCT[0]}-{CPU_FIRST_PREDICTION_ERROR_PCT[1]} % of the "
                    "measured steps on a 2-core machine, bench/trainer_cpu/first_prediction.md); "
                    "no interval is stated: one run of it (`suite run`, `run --plan`) calibrates the next estimate "
                    "(`--cluster`)")
        # A 4-bit GEMM rate no training run measured: its estimate says what the rate rests on, outside every cell
        # (MXFP4 runs only on MI355X, where no cell is) as beside its nearest one.
        four_bit = self.gemm_format in FOUR_BIT_PRECISIONS and FORMAT_MECHANISMS[self.gemm_format] not in (
            checked_mechanisms())
        rate = f"; {_fp4_rate_basis(self.gemm_format)}" if four_bit else ""
        if self.nearest is None:
            return (f"calibration: no published run of a {self.family} model on this GPU vendor checks this "
                    f"estimate ({case}); treat it as physics without a measured error{rate}")
        cell = self.nearest
        if self.unchecked_mechanisms:
            return (f"calibration: no published run has {', '.join(self.unchecked_mechanisms)} ({case}); the "
                    f"nearest runs ({cell.family} on {cell.gpu} {cell.precision}, {cell.runs} published, median "
                    f"|error| {100 * cell.median_abs_error:.1f} %) never ran those kernels: treat their pricing as "
                    f"physics without a measured error{rate}")
        where = "calibrated" if self.exact else (
            f"not calibrated; nearest: {cell.family} on {cell.gpu} {cell.precision}")
        return (f"calibration: {case} {where} ({cell.runs} published runs, median |error| "
                f"{100 * cell.median_abs_error:.1f} %{cell.lean()})")


# The smallest and largest |error| of a CPU's first predictions against their measured steps, in whole percent
# (bench/trainer_cpu/first_prediction.json, 2 cores): what a CPU estimate says of itself before a run calibrates it.
CPU_FIRST_PREDICTION_ERROR_PCT = (1, 16)


def family_of(model: ModelSpec) -> str:
    if model.is_hybrid:
        return "hybrid"
    return "moe" if model.moe is not None else "dense"


def related_families(model: ModelSpec) -> tuple[str, ...]:
    """The calibrated families nearest to a model whose own family has no run: a hybrid with routed experts runs
    the MoE layers' dispatch, grouped GEMMs and all-to-alls beside its Mamba mixers, so the MoE family's errors are
    its neighbours' (the later releases' Nemotron 3 hybrids ran 18-35 % below their estimate, as MoE runs did), not
    the dense-heavy spread of every cell. A dense hybrid has no nearer family than every cell."""
    return ("moe",) if model.is_hybrid and model.moe is not None else ()


FOUR_BIT_PRECISIONS = ("nvfp4", "mxfp4")


def _fp4_rate_basis(gemm_format: str) -> str:
    """What a 4-bit estimate's GEMM rate rests on, when no training run checks it."""
    if gemm_format == "nvfp4":
        return (f"its NVFP4 GEMMs run {NVFP4_OVER_FP8_RATE:.2f}x FP8's rate, what Transformer Engine's GEMM "
                "profiling guide measures for one layer's GEMMs with their quantisation on B300, not the datasheet's "
                "2-3x")
    return (f"its {FORMAT_MECHANISMS.get(gemm_format, 'FP4 GEMMs')} are priced at the datasheet's 4-bit peak times "
            "the fitted 8-bit efficiency, a rate no measurement checks")


def precision_class(precision: str) -> str:
    """bf16 (and fp16), fp8 (every 8-bit recipe, MXFP8 included) or fp4 (NVFP4, MXFP4) of a precision or a GEMM
    format (`TrainingSpec.gemm_format`): the fit saw the first two."""
    if precision in FOUR_BIT_PRECISIONS:
        return "fp4"
    return "fp8" if precision in QUANTIZED_PRECISIONS or precision.startswith("fp8-") else "bf16"


# The GEMM formats whose kernels are priced apart from per-tensor scaled FP8 (delayed or current scaling: one
# scale per tensor, the same GEMM): their scales ride beside the operands (efficiency.BLOCK_SCALED_GEMM_RATE,
# NVFP4_OVER_FP8_RATE) and their casts are their own (quantization.py). A format no published run used is a
# mechanism no run checks, like a model's (`mechanisms`), and its estimate gets the caveat and the outside band.
FORMAT_MECHANISMS = {"fp8-blockwise": "blockwise-scaled FP8 GEMMs", "mxfp8": "MXFP8 GEMMs", "nvfp4": "NVFP4 GEMMs",
                     "mxfp4": "MXFP4 GEMMs"}


@lru_cache(maxsize=1)
def calibrated_cells() -> tuple[CoverageCell, ...]:
    return tuple(CoverageCell(**(cell | {"heldout_errors": tuple(cell.get("heldout_errors", ()))}))
                 for cell in _coverage_document()["cells"])


@lru_cache(maxsize=1)
def _coverage_document() -> dict[str, Any]:
    text = resources.files("megapilot.estimate").joinpath("data").joinpath("calibration_coverage.json").read_text()
    return dict(json.loads(text))


def coverage_for(model: ModelSpec, gpu: GPUSpec, gemm_format: str) -> CalibrationCoverage:
    """The cell of this estimate, or the nearest calibrated one (None when outside every calibrated one), with the
    mechanisms of the model and its GEMM format (`TrainingSpec.gemm_format`; a bare precision is its default
    recipe) no published run has."""
    coverage = _coverage(family_of(model), gpu.name, gpu.vendor, gpu.architecture, precision_class(gemm_format))
    return with_mechanisms(coverage, model, gpu, gemm_format, _unchecked_mechanisms(model, gemm_format))


def with_mechanisms(coverage: CalibrationCoverage, model: ModelSpec, gpu: GPUSpec, gemm_format: str,
                    unchecked: tuple[str, ...]) -> CalibrationCoverage:
    """A placed estimate with what its model and GPU add to its cell: the related families its interval may
    borrow, a host-paced device, and the mechanisms (`unchecked`, of those some published run had) no run checks."""
    coverage = replace(coverage, related=related_families(model), host_paced=gpu.vendor == "CPU",
                       gemm_format=gemm_format)
    if waits_on_exponentials(model, gpu):  # a GPU's and a head dimension's: no calibration run's core waited so
        unchecked = (*unchecked, EXPONENTIAL_BOUND)
    return replace(coverage, unchecked_mechanisms=unchecked) if unchecked and coverage.nearest else coverage


# The step time's one mechanism that is a GPU's as much as a model's (`attention_bounds.softmax_exponential_bound`).
EXPONENTIAL_BOUND = "attention bound by the softmax's exponentials"


@lru_cache(maxsize=64)  # asked on every estimate: the planner's thousands share a handful of models
def _unchecked_mechanisms(model: ModelSpec, gemm_format: str) -> tuple[str, ...]:
    return tuple(sorted(mechanisms(model, gemm_format) - checked_mechanisms()))


def mechanisms(model: ModelSpec, gemm_format: str = "bf16") -> frozenset[str]:
    """The code paths of a model, and of its GEMM format (`FORMAT_MECHANISMS`), that the step-time model prices
    apart from a plain transformer layer, each a set of kernels or collectives a published run either ran or did
    not: an estimate that runs one no calibration run had is checked by nothing, whatever its family's cell says."""
    fmt = FORMAT_MECHANISMS.get(gemm_format)
    return _model_mechanisms(model) | (frozenset({fmt}) if fmt else frozenset())


def _model_mechanisms(model: ModelSpec) -> frozenset[str]:
    moe = model.moe
    found = {
        "mixture of experts": moe is not None,
        "latent experts": moe is not None and moe.latent_size is not None,
        "biased experts": moe is not None and model.add_bias_linear,
        "clamped gated activation": model.activation_clamp is not None,
        "multi-latent attention": model.mla is not None,
        "sparse attention (DSA)": model.dsa is not None,
        "sliding-window attention": model.sliding_window is not None,
        "chunked local attention": model.attention_chunk_size is not None,
        "attention sinks": model.softmax_type != "vanilla",
        "Gated DeltaNet": model.gated_delta_net is not None,
        "Mamba-2 mixer": model.mamba is not None,
        "heterogeneous layers": model.layer_blocks is not None,
        "multi-token prediction": model.mtp_num_layers > 0,
        "compressed KV attention (DeepSeek-V4)": model.csa is not None,
        "grouped low-rank output projection": model.csa is not None,
        "hyper-connections": model.residual_streams > 1,
        "hash-routed experts": moe is not None and moe.num_hash_layers > 0,
    }
    return frozenset(name for name, present in found.items() if present)


@lru_cache(maxsize=1)
def checked_mechanisms() -> frozenset[str]:
    """The mechanisms some calibration run had (`data/calibration_coverage.json`)."""
    return frozenset(_coverage_document().get("checked_mechanisms", ()))


@lru_cache(maxsize=256)
def _coverage(family: str, gpu: str, vendor: str, architecture: str, klass: str) -> CalibrationCoverage:
    return nearest_coverage(calibrated_cells(), family, gpu, vendor, architecture, klass)


def nearest_coverage(cells: tuple[CoverageCell, ...], family: str, gpu: str, vendor: str, architecture: str,
                     klass: str) -> CalibrationCoverage:
    """The case's own cell among `cells`, or the nearest (see the module doc); None when outside them all.

    Only the case's own family on its own vendor's GPUs can stand for it: another family's errors are another
    model's (a hybrid borrows the MoE family's for its interval, `related_families`), another vendor's are another
    software stack's. Among those cells, nearest is by the machine first, as the model's errors follow it: every
    fitted parameter is shared by every GPU (efficiency.py), so what sets a cell's error apart is what its GPU does
    beside them - clocks under load, HBM, the NVLink domain, the kernels' maturity on that generation - and a case
    shares all of that with a cell of its own architecture, some with the next generation, little with one two
    generations away (an A100's errors say nothing of a GB200's). Then the precision (the case's own, or the 8-bit
    fit a 4-bit case leans on): of the GEMMs alone, one fitted fraction of the peak. Then this very GPU over its
    siblings (a B200 over a GB200), and only last the cell with more runs.
    """
    own = [c for c in cells if (c.family, c.gpu, c.precision) == (family, gpu, klass)]
    if own:
        return CalibrationCoverage(family, gpu, klass, own[0], True)
    same_vendor = {cell.gpu for cell in cells} & _vendor_gpus(vendor)
    candidates = [c for c in cells if c.family == family and c.gpu in same_vendor]
    if not candidates:
        return CalibrationCoverage(family, gpu, klass, None, False)
    leans_on = "fp8" if klass == "fp4" else None  # no 4-bit run exists: its GEMMs use the 8-bit fit
    best = min(candidates, key=lambda c: (_generations_apart(_architecture(c.gpu), architecture),
                                          -(2 if c.precision == klass else 1 if c.precision == leans_on else 0),
                                          c.gpu != gpu, -c.runs))
    return CalibrationCoverage(family, gpu, klass, best, False)


# Each vendor's architectures in the order they shipped; two in one step are one generation (Ada and Hopper both
# brought FP8 tensor cores in 2022). `_generations_apart` counts the steps between two of one vendor.
GENERATION = {"ampere": 0, "ada": 1, "hopper": 1, "blackwell": 2, "cdna3": 0, "cdna4": 1, "cpu": 0}


def _generations_apart(cell_architecture: str | None, architecture: str) -> int:
    """Generations between a cell's GPU and the case's; a cell whose GPU the catalog lacks is the farthest."""
    if cell_architecture is None or cell_architecture not in GENERATION or architecture not in GENERATION:
        return len(GENERATION)
    return abs(GENERATION[cell_architecture] - GENERATION[architecture])


# ---- the 80 % interval -------------------------------------------------------------------------------------
#
# An estimate's interval is the spread of the model's errors where it was held out: the errors its calibrated cell's
# runs got when the fit saw neither their model family nor their GPU (two per run). Its ends are the split-conformal
# order statistics of those n errors (log throughput), ranks floor((n + 1) x 0.1) and ceil((n + 1) x 0.9) clamped to
# the extremes: with n exchangeable errors the next one falls between them at least 80 % of the time, where the
# interpolated 10th / 90th percentiles fall short on small samples (with 9 errors they are the 2nd and 8th, which
# cover 6 in 10). The ranks stop being clamped at n = 9; a run's two errors are not independent, so a cell with
# fewer than INTERVAL_MIN_RUNS runs' errors borrows its family's (every GPU), then a related family's (a hybrid with
# experts: the MoE family's), then every cell's. A case placed in a
# nearest cell, not its own, gets the band widened by WIDEN_NEAREST (a new GPU brings a shift its neighbour's
# errors do not hold: without it leave-one-GPU-out covers 72 %), a case no published run checks (another vendor, a
# family never calibrated, a mechanism or GEMM format no run had) by WIDEN_OUTSIDE. Coverage on rows held out of the
# interval's own errors and runs, median width of p10-p90 tokens/s in % of the prediction
# (bench/calibration/results.md, physics.md): release hold-out 71 % (65 %: most of its rows bring MXFP8, MLA or
# chunked attention the earlier releases never ran), leave-one-source-out 79 % (33 %), leave-one-family-out 70 %
# (32 %), leave-one-GPU-out 85 % (49 %).
INTERVAL_MIN_RUNS = 9
HELDOUT_ERRORS_PER_RUN = 2  # leave-one-family-out, then leave-one-GPU-out
INTERVAL_COVERAGE = 0.8
WIDEN_NEAREST = 1.5
WIDEN_OUTSIDE = 2.0
MIN_HALF_WIDTH = 0.05  # in log throughput: a handful of errors never claims better than about +-5 %


@dataclass(frozen=True)
class ErrorBand:
    """p10 and p90 of predicted / true throughput - 1 for an estimate, and the residuals they came from."""

    p10_error: float
    p90_error: float
    basis: str

    def tokens_interval(self, predicted: float) -> tuple[float, float]:
        """(p10, p90) of the true tokens/s given the predicted one: a high error means the truth is lower."""
        return predicted / (1 + self.p90_error), predicted / (1 + self.p10_error)


def conformal_bounds(values: list[float], coverage: float = INTERVAL_COVERAGE) -> tuple[float, float]:
    """The split-conformal interval of `values`: the order statistics of ranks floor((n + 1) a) and
    ceil((n + 1) (1 - a)), a = (1 - coverage) / 2, clamped to the smallest and largest value."""
    ordered = sorted(values)
    n = len(ordered)
    tail = (1 - coverage) / 2
    low = min(max(math.floor((n + 1) * tail + 1e-9), 1), n)
    high = min(max(math.ceil((n + 1) * (1 - tail) - 1e-9), 1), n)
    return ordered[low - 1], ordered[high - 1]


def error_band(cells: tuple[CoverageCell, ...], coverage: CalibrationCoverage) -> ErrorBand:
    """The 80 % band of an estimate placed by `coverage` among `cells` (the rules above)."""
    nearest = coverage.nearest
    pools = []
    if nearest is not None:
        pools.append((f"{nearest.family} on {nearest.gpu} {nearest.precision}", list(nearest.heldout_errors)))
    for family in (coverage.family, *coverage.related):
        pools.append((f"{family} models", [e for c in cells if c.family == family for e in c.heldout_errors]))
    pools.append(("every calibrated cell", [e for c in cells for e in c.heldout_errors]))
    enough = INTERVAL_MIN_RUNS * HELDOUT_ERRORS_PER_RUN
    basis, errors = next(((b, e) for b, e in pools if len(e) >= enough), pools[-1])
    if not errors:
        errors = [0.0]
    logs = [math.log1p(e) for e in errors]
    centre = statistics.median(logs)
    low, high = conformal_bounds(logs)
    widen = WIDEN_OUTSIDE if coverage.needs_caveat else (1.0 if coverage.exact else WIDEN_NEAREST)
    below = widen * max(centre - low, MIN_HALF_WIDTH)
    above = widen * max(high - centre, MIN_HALF_WIDTH)
    return ErrorBand(math.expm1(centre - below), math.expm1(centre + above),
                     f"{basis}: {len(errors)} held-out errors" + ("" if widen == 1.0 else f", widened x{widen}"))


def band_for(model: ModelSpec, gpu: GPUSpec, gemm_format: str) -> ErrorBand | None:
    """The 80 % band of an estimate for this model's family on this GPU and GEMM format (`band_of`)."""
    return band_of(coverage_for(model, gpu, gemm_format))


def band_of(coverage: CalibrationCoverage) -> ErrorBand | None:
    """The 80 % band of an estimate placed by `coverage`; None on a host-paced device (a CPU), which no GPU's errors
    speak for (`CalibrationCoverage.statement`)."""
    return None if coverage.host_paced else _band(coverage)


@lru_cache(maxsize=256)
def _band(coverage: CalibrationCoverage) -> ErrorBand:
    return error_band(calibrated_cells(), coverage)


def _vendor_gpus(vendor: str) -> set[str]:
    from megapilot.catalog.gpus import load_gpus

    return {other.name for other in load_gpus().values() if other.vendor == vendor}


def _architecture(gpu_name: str) -> str | None:
    from megapilot.catalog.gpus import load_gpus

    gpu = load_gpus().get(gpu_name)  # the catalog is keyed by the names the cells carry
    return gpu.architecture if gpu is not None else None
