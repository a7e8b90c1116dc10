"""`optimize()`: flag changes ranked by predicted tokens/s gain, against the planner's best layout.

Every proposal lists all the flag edits its layout needs (from the launch package's own rendering:
switching to Megatron-FSDP brings its companion flags and checkpoint format) and is predicted by
`megapilot.estimate` for the launch those edits produce, the planner's best layout included. When a
measured step time is given (from the run's log), predictions are calibrated by one scale factor:
measured / predicted step time of the current layout, so every option's tokens/s is
predicted_tokens x predicted_step / measured_step (the estimator's relative ranking is kept; its
absolute level is fixed to the run). A log of another run than the script calibrates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from megapilot.diagnose.device import CPU_RUN_EVIDENCE, trained_on_cpu
from megapilot.diagnose.findings import Finding, Fix
from megapilot.diagnose.flags import RunConfig
from megapilot.diagnose.layout_flags import rendered_launch
from megapilot.diagnose.megatron_version import recognise_megatron_version
from megapilot.diagnose.mismatch import log_mismatches, mismatch_finding
from megapilot.diagnose.options import (
    LayoutOption,
    current_prediction,
    flex_flags,
    proposed_layout,
    throughput_options,
)
from megapilot.diagnose.predict import refusal
from megapilot.diagnose.release_names import fixes_in_release, release_note
from megapilot.errors import MegapilotError
from megapilot.logs import ParsedLog
from megapilot.plan import plan
from megapilot.plan.reasons import layout_label
from megapilot.plan.search import Candidate
from megapilot.spec import ParallelConfig


@dataclass(frozen=True)
class RankedChange:
    """One proposal: its flag edits and the predicted (calibrated) tokens/s and memory after it."""

    label: str
    fixes: list[Fix]
    predicted_tokens_per_s_per_gpu: float | None
    gain_pct: float | None
    predicted_memory_gib: float | None
    fits: bool | None
    modelled: bool
    source: str  # "option" | "planner"

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "source": self.source, "modelled": self.modelled,
            "predicted_tokens_per_s_per_gpu": _round(self.predicted_tokens_per_s_per_gpu),
            "gain_pct": _round(self.gain_pct), "predicted_memory_gib": _round(self.predicted_memory_gib),
            "fits": self.fits, "fixes": [f.to_dict() for f in self.fixes],
        }


def _round(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


@dataclass
class OptimizeReport:
    """Current layout vs the planner's best, and the ranked changes."""

    current_layout: str
    current_tokens_per_s_per_gpu: float | None
    current_memory_gib: float | None
    measured_step_time_s: float | None
    calibration_scale: float | None  # measured / predicted step time
    best_layout: str | None
    best_tokens_per_s_per_gpu: float | None
    changes: list[RankedChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log_mismatch: Finding | None = None  # the log given is of another run: it calibrated nothing

    def to_dict(self) -> dict[str, Any]:
        return {
            "current": {"layout": self.current_layout,
                        "predicted_tokens_per_s_per_gpu": _round(self.current_tokens_per_s_per_gpu),
                        "predicted_memory_gib": _round(self.current_memory_gib),
                        "measured_step_time_s": _round(self.measured_step_time_s)},
            "calibration_scale": _round(self.calibration_scale),
            "best": {"layout": self.best_layout,
                     "predicted_tokens_per_s_per_gpu": _round(self.best_tokens_per_s_per_gpu)},
            "changes": [c.to_dict() for c in self.changes],
            "notes": self.notes,
            "log_mismatch": self.log_mismatch.to_dict() if self.log_mismatch else None,
        }


def _planner_best(config: RunConfig) -> Candidate | None:
    """The planner's best layout for the same model, GPUs and batch, with the dispatcher it was priced with; None
    when it finds none."""
    assert config.model and config.cluster and config.training
    try:
        result = plan(config.model, config.cluster, config.training, top=1)
    except MegapilotError:
        return None
    return result.best


def optimize(config: RunConfig, *, log: ParsedLog | None = None,
             measured_step_time_s: float | None = None) -> OptimizeReport:
    """Rank throughput changes for the run described by `config` (needs model, batch and GPU).

    The measured step time calibrates the predictions: `measured_step_time_s`, else the steady-state
    median of `log`. A log whose own record of its run differs from the flags (world size, layout,
    batch, sequence length) calibrates nothing: the report carries that finding instead.
    """
    if config.gpu is None:
        raise MegapilotError("optimize needs the GPU type", field="--gpu", fix="pass --gpu, e.g. --gpu h100")
    if not config.complete:
        raise MegapilotError("the flags do not describe the whole run: " + "; ".join(config.notes), field="--flags",
                             fix="pass the full launch script with --script, or the model/batch flags with --flags")
    assert config.parallel is not None and config.training is not None
    current = current_prediction(config)
    report = OptimizeReport(
        current_layout=layout_label(config.parallel), current_tokens_per_s_per_gpu=None,
        current_memory_gib=current.memory_gib if current else None, measured_step_time_s=None,
        calibration_scale=None, best_layout=None, best_tokens_per_s_per_gpu=None, notes=list(config.notes),
    )
    if trained_on_cpu(config, log):
        report.notes.append(f"the run trained on CPU ({CPU_RUN_EVIDENCE}): {config.gpu.name} throughput changes do "
                            "not apply to it and its step time calibrates no GPU prediction; pass a GPU run's script")
        return report
    measured_step_time_s = _measured_step(report, config, log, measured_step_time_s)
    report.measured_step_time_s = measured_step_time_s
    _note_unrenderable(report, config)
    if current is None or current.tokens_per_s_per_gpu is None:
        assert config.model is not None and config.cluster is not None
        why = refusal(config.model, config.cluster, config.training, config.parallel, config.options)
        report.notes.append(f"the estimator refuses the current layout ({why}): changes listed unranked")
        report.changes = [_ranked(o, None, 1.0) for o in throughput_options(config)]
        return report
    scale = 1.0
    if measured_step_time_s and current.step_time_s:
        scale = measured_step_time_s / current.step_time_s
        report.calibration_scale = scale
    current_tokens = current.tokens_per_s_per_gpu / scale
    report.current_tokens_per_s_per_gpu = current_tokens
    changes = [_ranked(o, current_tokens, scale) for o in throughput_options(config)]
    best = _planner_best(config)
    if best is None:
        report.notes.append("the planner found no layout: no best-layout comparison")
    else:
        report.best_layout = layout_label(best.parallel)
        # the flags of the dispatcher the planner priced it with (its expert group leaves the NVLink domain), so
        # that the proposal is priced, and runs, as the planner ranked it
        backend = best.moe_flex_dispatcher
        dispatcher = flex_flags(config.flags, backend, best.parallel.ep) if backend else ()
        option = proposed_layout(config, f"planner's best: {report.best_layout}", best.parallel, extra=dispatcher)
        if option is not None and option.prediction is not None and option.prediction.tokens_per_s_per_gpu:
            report.best_tokens_per_s_per_gpu = option.prediction.tokens_per_s_per_gpu / scale
        if option is not None and option.changes:
            changes.append(_ranked(option, current_tokens, scale, source="planner"))
    # A change the model predicts slower is no optimisation: never proposed. Unless the current layout does not
    # fit: its tokens/s are those of a run that stops at its first step, and a change that fits is what runs.
    slower = [change_ for change_ in changes if change_.gain_pct is not None and change_.gain_pct < 0
              and (current.fits or not change_.fits)]
    if slower:
        report.notes.append(f"{len(slower)} change{'s' if len(slower) > 1 else ''} the model predicts slower left "
                            f"out ({', '.join(f'{c.label} {c.gain_pct:+.1f} %' for c in slower[:3])})")
    report.changes = sorted((c for c in changes if c not in slower), key=_rank_key)
    _in_log_release(report, log, config.parallel)
    return report


def _in_log_release(report: OptimizeReport, log: ParsedLog | None, parallel: ParallelConfig | None) -> None:
    """The changes in the flag names of the release that wrote the log, as diagnose writes its fixes: a flag the
    release spells otherwise is renamed, one it does not have yet says it needs an upgrade (an unknown flag stops
    Megatron's argument parser before the run starts)."""
    version = recognise_megatron_version(log) if log is not None else None
    if version is None:
        return
    said: list[str] = []
    for index, change_ in enumerate(report.changes):
        fixes, notes = fixes_in_release(change_.fixes, version, parallel)
        report.changes[index] = replace(change_, fixes=fixes)
        said += notes
    report.notes += release_note(version) + sorted(set(said))


def _measured_step(report: OptimizeReport, config: RunConfig, log: ParsedLog | None,
                   measured_step_time_s: float | None) -> float | None:
    """The step time to calibrate with: none from a log of another run (the report says why)."""
    if log is None:
        return measured_step_time_s
    finding = mismatch_finding(log_mismatches(log, config))
    if finding is not None:
        report.log_mismatch = finding
        report.notes.append("not calibrated: the log is of another run than the script (see log_mismatch)")
        return None
    if measured_step_time_s is None and log.summary is not None and log.summary.step_time_p50_ms is not None:
        return log.summary.step_time_p50_ms / 1000.0
    return measured_step_time_s


def _note_unrenderable(report: OptimizeReport, config: RunConfig) -> None:
    """Flag edits are derived from the launch package's rendering; say so when it refuses this run."""
    assert config.parallel is not None and config.training is not None
    try:
        rendered_launch(config, config.parallel, config.training)
    except MegapilotError as exc:
        report.notes.append(f"`megapilot script` refuses the current layout ({exc}): no layout change is proposed")


def _ranked(option: LayoutOption, current_tokens: float | None, scale: float, source: str = "option") -> RankedChange:
    prediction = option.prediction
    predicted = prediction.tokens_per_s_per_gpu if (prediction is not None and option.modelled) else None
    tokens = predicted / scale if predicted else None
    gain = (tokens / current_tokens - 1) * 100 if (tokens is not None and current_tokens) else None
    return RankedChange(label=option.label, fixes=option.fixes(), predicted_tokens_per_s_per_gpu=tokens, gain_pct=gain,
                        predicted_memory_gib=prediction.memory_gib if prediction else None,
                        fits=prediction.fits if prediction else None, modelled=option.modelled, source=source)


def _rank_key(change_: RankedChange) -> tuple[int, float]:
    """Fitting, modelled changes by gain first; unmodelled switches next; layouts that do not fit last."""
    if change_.fits is False:
        return 2, -(change_.gain_pct or 0.0)
    if change_.gain_pct is None:
        return 1, 0.0
    return 0, -change_.gain_pct
