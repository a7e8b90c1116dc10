"""`optimize()`: flag changes ranked by predicted tokens/s gain, against the planner's best layout.

Predictions come from `megapilot.estimate` (per option) and `megapilot.plan` (the best layout for the
same model, GPUs and batch). When a measured step time is given (from the run's log), predictions
are calibrated by one scale factor: measured / predicted step time of the current layout, so every
option's tokens/s is predicted_tokens x predicted_step / measured_step (the estimator's relative
ranking is kept; its absolute level is fixed to the run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from megapilot.diagnose.findings import Fix
from megapilot.diagnose.flags import RunConfig
from megapilot.diagnose.options import LayoutOption, change, current_prediction, remove, throughput_options
from megapilot.diagnose.predict import Prediction, full_estimator_available, predict
from megapilot.errors import MegapilotError
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "current": {"layout": self.current_layout, "predicted_tokens_per_s_per_gpu": _round(self.current_tokens_per_s_per_gpu),
                        "predicted_memory_gib": _round(self.current_memory_gib),
                        "measured_step_time_s": _round(self.measured_step_time_s)},
            "calibration_scale": _round(self.calibration_scale),
            "best": {"layout": self.best_layout, "predicted_tokens_per_s_per_gpu": _round(self.best_tokens_per_s_per_gpu)},
            "changes": [c.to_dict() for c in self.changes],
            "notes": self.notes,
        }


def layout_label(p: ParallelConfig) -> str:
    label = f"TP{p.tp} PP{p.pp}" + (f" VPP{p.vpp}" if p.vpp > 1 else "") + (f" CP{p.cp}" if p.cp > 1 else "")
    label += (f" EP{p.ep}" if p.ep > 1 else "") + f" DP{p.dp} MBS{p.mbs} recompute={p.recompute}"
    return label + (" SP" if p.sequence_parallel else "") + (" dist-opt" if p.distributed_optimizer else "")


def layout_changes(config: RunConfig, target: ParallelConfig) -> list[Fix]:
    """The flag edits that turn the current layout into `target`."""
    assert config.parallel is not None and config.model is not None
    flags, p = config.flags, config.parallel
    fixes: list[Fix] = []
    sizes = (("tp", "--tensor-model-parallel-size"), ("pp", "--pipeline-model-parallel-size"),
             ("cp", "--context-parallel-size"), ("ep", "--expert-model-parallel-size"), ("mbs", "--micro-batch-size"))
    for field_name, flag in sizes:
        if getattr(target, field_name) != getattr(p, field_name):
            fixes.append(change(flags, flag, str(getattr(target, field_name)), f"{field_name.upper()} {getattr(p, field_name)} → {getattr(target, field_name)}"))
    if target.vpp != p.vpp:
        if target.vpp > 1:
            per_stage = config.model.num_layers // (target.pp * target.vpp)
            fixes.append(change(flags, "--num-layers-per-virtual-pipeline-stage", str(per_stage), f"VPP {target.vpp}"))
        else:
            fixes.append(remove("--num-layers-per-virtual-pipeline-stage", "no interleaving"))
    if target.sequence_parallel != p.sequence_parallel:
        fixes.append(change(flags, "--sequence-parallel", None, "with TP > 1") if target.sequence_parallel
                     else remove("--sequence-parallel", "TP is 1"))
    if target.distributed_optimizer and not p.distributed_optimizer:
        fixes.append(change(flags, "--use-distributed-optimizer", None, "shard optimizer states over DP"))
    if target.recompute != p.recompute or target.recompute_num_layers != p.recompute_num_layers:
        if target.recompute == "none":
            fixes.append(remove("--recompute-granularity", "no recompute"))
        else:
            fixes.append(change(flags, "--recompute-granularity", target.recompute, f"recompute {target.recompute}"))
            if target.recompute == "full":
                fixes.append(change(flags, "--recompute-method", target.recompute_method, "full recompute method"))
                if target.recompute_num_layers:
                    fixes.append(change(flags, "--recompute-num-layers", str(target.recompute_num_layers), "layers per chunk"))
    return fixes


def _planner_best(config: RunConfig) -> tuple[ParallelConfig, Prediction] | None:
    try:
        from megapilot.plan import plan
    except ImportError:
        return None
    assert config.model and config.cluster and config.training
    try:
        result = plan(config.model, config.cluster, config.training, top=1)
    except (MegapilotError, ImportError):
        return None
    best = result.best
    return best.parallel, Prediction(memory_gib=best.estimate.memory_gib.total, capacity_gib=best.estimate.memory_gib.capacity,
                                     step_time_s=best.estimate.step_time_s,
                                     tokens_per_s_per_gpu=best.estimate.tokens_per_s_per_gpu, mfu=best.estimate.mfu)


def optimize(config: RunConfig, *, measured_step_time_s: float | None = None) -> OptimizeReport:
    """Rank throughput changes for the run described by `config` (needs model, batch and GPU)."""
    if config.gpu is None:
        raise MegapilotError("optimize needs the GPU type", field="gpu", fix="pass --gpu, e.g. --gpu h100")
    if not config.complete:
        raise MegapilotError("the flags do not describe the whole run: " + "; ".join(config.notes), field="flags",
                             fix="pass the full launch script with --script, or the model/batch flags with --flags")
    assert config.parallel is not None
    current = current_prediction(config)
    report = OptimizeReport(
        current_layout=layout_label(config.parallel), current_tokens_per_s_per_gpu=None,
        current_memory_gib=current.memory_gib if current else None, measured_step_time_s=measured_step_time_s,
        calibration_scale=None, best_layout=None, best_tokens_per_s_per_gpu=None, notes=list(config.notes),
    )
    if not full_estimator_available() or current is None or current.tokens_per_s_per_gpu is None:
        report.notes.append("step-time estimator not available: changes listed with predicted memory only, unranked")
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
    if best is not None:
        parallel, prediction = best
        report.best_layout = layout_label(parallel)
        report.best_tokens_per_s_per_gpu = (prediction.tokens_per_s_per_gpu or 0) / scale
        if parallel != config.parallel:
            changes.append(_ranked(LayoutOption(label=f"planner's best: {report.best_layout}",
                                                changes=layout_changes(config, parallel), parallel=parallel,
                                                training=config.training, prediction=prediction),  # type: ignore[arg-type]
                                   current_tokens, scale, source="planner"))
    else:
        report.notes.append("planner not available or found no layout: no best-layout comparison")
    report.changes = sorted(changes, key=_rank_key)
    return report


def _ranked(option: LayoutOption, current_tokens: float | None, scale: float, source: str = "option") -> RankedChange:
    prediction = option.prediction
    tokens = prediction.tokens_per_s_per_gpu / scale if (prediction and prediction.tokens_per_s_per_gpu and option.modelled) else None
    gain = (tokens / current_tokens - 1) * 100 if (tokens is not None and current_tokens) else None
    return RankedChange(label=option.label, fixes=option.fixes(), predicted_tokens_per_s_per_gpu=tokens, gain_pct=gain,
                        predicted_memory_gib=prediction.memory_gib if prediction else None,
                        fits=prediction.fits if prediction else None, modelled=option.modelled, source=source)


def _rank_key(change_: RankedChange) -> tuple[int, float]:
    """Fitting, modelled changes by gain first; unmodelled switches next; layouts that do not fit last."""
    if change_.fits is False:
        return 2, 0.0
    if change_.gain_pct is None:
        return 1, 0.0
    return 0, -change_.gain_pct
