"""Layout changes a fix can propose, each as exact flag changes with its prediction.

Two families: `memory_options` (to get out of an OOM: recompute, distributed optimizer, sequence
parallel, smaller micro-batch, more TP or PP) and `throughput_options` (to go faster: larger
micro-batch, fewer TP ranks, interleaved pipeline, lighter recompute, FP8 where the GPU has it,
communication overlap). Every option is checked with `validate_layout` (Megatron's own rules), so no
option proposes a layout Megatron would refuse.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from megapilot.diagnose.findings import Fix
from megapilot.diagnose.flags import LaunchFlags, RunConfig
from megapilot.diagnose.predict import Prediction, predict
from megapilot.errors import MegapilotError
from megapilot.spec import ParallelConfig, TrainingSpec, validate_layout


@dataclass(frozen=True)
class LayoutOption:
    """One proposed change: its flag edits, the layout after it, and what the estimators predict."""

    label: str
    changes: list[Fix]
    parallel: ParallelConfig
    training: TrainingSpec
    prediction: Prediction | None
    modelled: bool = True  # False: the estimator does not model this switch; prediction = current layout

    def fixes(self) -> list[Fix]:
        """The flag edits, each carrying the option's label and prediction."""
        memory = self.prediction.memory_gib if self.prediction else None
        tokens = self.prediction.tokens_per_s_per_gpu if (self.prediction and self.modelled) else None
        return [Fix(action=c.action, flag=c.flag, value=c.value, reason=c.reason, kind=c.kind, option=self.label,
                    predicted_memory_gib=memory, predicted_tokens_per_s_per_gpu=tokens) for c in self.changes]


def change(flags: LaunchFlags, name: str, value: str | None, reason: str) -> Fix:
    """Add the flag, or set it when the launch already has it."""
    return Fix(action="set" if flags.has(name) else "add", flag=name, value=value, reason=reason)


def remove(name: str, reason: str) -> Fix:
    return Fix(action="remove", flag=name, value=None, reason=reason)


def _layout(config: RunConfig, **update: object) -> ParallelConfig | None:
    """The current layout with some fields changed, DP re-derived; None if Megatron would refuse it."""
    assert config.parallel is not None and config.model is not None and config.training is not None
    fields = config.parallel.model_dump() | update
    tp, pp, cp = int(fields["tp"]), int(fields["pp"]), int(fields["cp"])  # type: ignore[call-overload]
    if config.world_size % (tp * pp * cp):
        return None
    fields["dp"] = config.world_size // (tp * pp * cp)
    if tp == 1:
        fields["sequence_parallel"] = False
    try:
        parallel = ParallelConfig.model_validate(fields)
        if config.cluster is not None:
            validate_layout(config.model, config.cluster, config.training, parallel)
    except (MegapilotError, ValueError):
        return None
    return parallel


def _option(config: RunConfig, label: str, changes: list[Fix], parallel: ParallelConfig | None,
            training: TrainingSpec | None = None, *, modelled: bool = True) -> LayoutOption | None:
    if parallel is None:
        return None
    training = training or config.training
    assert training is not None and config.model is not None
    prediction = None
    if config.cluster is not None:
        prediction = predict(config.model, config.cluster, training, parallel)
    return LayoutOption(label=label, changes=changes, parallel=parallel, training=training,
                        prediction=prediction, modelled=modelled)


def current_prediction(config: RunConfig) -> Prediction | None:
    if not config.complete:
        return None
    assert config.model and config.cluster and config.training and config.parallel
    return predict(config.model, config.cluster, config.training, config.parallel)


def memory_options(config: RunConfig) -> list[LayoutOption]:
    """Ways to lower the memory of the most-loaded GPU, least throughput cost first.

    An option the estimator predicts to save nothing (selective recompute under fused attention, whose
    scores are never stored) is left out: it would cost compute and not cure the OOM.
    """
    if not (config.model and config.training and config.parallel):
        return []
    now = current_prediction(config)
    return [o for o in _memory_candidates(config) if o is not None
            and (now is None or o.prediction is None or o.prediction.memory_gib < now.memory_gib)]


def _memory_candidates(config: RunConfig) -> Iterator[LayoutOption | None]:
    flags, p, model = config.flags, config.parallel, config.model
    assert p is not None and model is not None
    if p.recompute == "none":
        yield _option(config, "selective recompute", [change(
            flags, "--recompute-granularity", "selective",
            "recompute the attention core in the backward pass instead of storing it (small compute cost)")],
            _layout(config, recompute="selective"))
    if not p.distributed_optimizer and p.dp > 1:
        yield _option(config, "distributed optimizer", [change(
            flags, "--use-distributed-optimizer", None, f"shard the fp32 optimizer states over the {p.dp} DP ranks")],
            _layout(config, distributed_optimizer=True))
    if p.tp > 1 and not p.sequence_parallel:
        yield _option(config, "sequence parallel", [change(
            flags, "--sequence-parallel", None, f"split norm/dropout activations over the {p.tp} TP ranks")],
            _layout(config, sequence_parallel=True))
    if p.mbs > 1:
        yield _option(config, f"micro-batch {p.mbs // 2}", [change(
            flags, "--micro-batch-size", str(p.mbs // 2), "halve the activations held per micro-batch")],
            _layout(config, mbs=p.mbs // 2))
    if p.recompute != "full" or p.recompute_num_layers != 1:
        layers_per_stage = max(1, model.num_layers // (p.pp * p.vpp))
        yield _option(config, "full recompute", [
            change(flags, "--recompute-granularity", "full", "store only each layer's input; recompute the layer"),
            change(flags, "--recompute-method", "uniform", "recompute uniformly across the stage's layers"),
            change(flags, "--recompute-num-layers", "1",
                   f"checkpoint every layer (1 of the {layers_per_stage} per stage): the most memory saved"),
        ], _layout(config, recompute="full", recompute_method="uniform", recompute_num_layers=1))
    if p.pp * 2 <= model.num_layers:
        yield _option(config, f"pipeline parallel {p.pp * 2}", [change(
            flags, "--pipeline-model-parallel-size", str(p.pp * 2),
            "split the layers over twice as many pipeline stages")], _layout(config, pp=p.pp * 2))
    yield _option(config, f"tensor parallel {p.tp * 2}", [change(
        flags, "--tensor-model-parallel-size", str(p.tp * 2), "split every weight and activation over twice the ranks")]
        + ([change(flags, "--sequence-parallel", None, "with TP > 1, also split the sequence")]
           if not flags.has("--sequence-parallel") else []),
        _layout(config, tp=p.tp * 2, sequence_parallel=True))


def throughput_options(config: RunConfig) -> list[LayoutOption]:
    """Ways to raise tokens/s, for `optimize` and low-throughput findings."""
    if not (config.model and config.training and config.parallel):
        return []
    return [o for o in _throughput_candidates(config) if o is not None]


def _throughput_candidates(config: RunConfig) -> Iterator[LayoutOption | None]:
    flags, p, model, training = config.flags, config.parallel, config.model, config.training
    assert p is not None and model is not None and training is not None
    yield _option(config, f"micro-batch {p.mbs * 2}", [change(
        flags, "--micro-batch-size", str(p.mbs * 2), "larger GEMMs and fewer pipeline/optimizer steps per sample")],
        _layout(config, mbs=p.mbs * 2))
    if p.tp > 1:
        yield _option(config, f"tensor parallel {p.tp // 2}", [change(
            flags, "--tensor-model-parallel-size", str(p.tp // 2), "fewer TP ranks: less TP communication per layer")],
            _layout(config, tp=p.tp // 2))
    if p.pp > 1 and p.vpp == 1:
        layers_per_stage = model.num_layers // p.pp
        if layers_per_stage >= 2 and layers_per_stage % 2 == 0:
            yield _option(config, "interleaved pipeline (VPP 2)", [change(
                flags, "--num-layers-per-virtual-pipeline-stage", str(layers_per_stage // 2),
                "two virtual stages per rank: half the pipeline bubble")], _layout(config, vpp=2))
    if p.recompute == "full":
        yield _option(config, "selective instead of full recompute", [
            change(flags, "--recompute-granularity", "selective", "recompute only the attention core"),
            remove("--recompute-method", "only for full recompute"), remove("--recompute-num-layers", "only for full recompute"),
        ], _layout(config, recompute="selective", recompute_num_layers=None))
    if p.recompute == "selective":
        yield _option(config, "no recompute", [remove("--recompute-granularity", "skip the recompute pass"),
                                               remove("--recompute-activations", "skip the recompute pass")],
                      _layout(config, recompute="none"))
    gpu = config.gpu
    if gpu is not None and gpu.supports("fp8") and training.precision in ("bf16", "fp16"):
        fp8_training = training.model_copy(update={"precision": "fp8"})
        yield _option(config, "FP8 GEMMs", [
            change(flags, "--fp8-format", "hybrid", f"{gpu.alias} runs FP8 GEMMs at {gpu.peak_tflops('fp8'):.0f} TF/s"),
            change(flags, "--fp8-recipe", "delayed", "delayed scaling, the Transformer Engine default"),
        ], p, fp8_training)
    yield from _overlap_options(config)


def _overlap_options(config: RunConfig) -> Iterator[LayoutOption | None]:
    """Switches the step-time estimate does not model: offered with the current prediction."""
    flags, p, model = config.flags, config.parallel, config.model
    assert p is not None and model is not None
    if p.tp > 1 and not flags.has("--tp-comm-overlap") and p.sequence_parallel:
        yield _option(config, "TP communication overlap", [change(
            flags, "--tp-comm-overlap", None, "overlap TP all-gather/reduce-scatter with GEMMs (needs SP, Transformer Engine)")],
            p, modelled=False)
    if p.dp > 1 and not flags.has("--overlap-grad-reduce"):
        extra = [change(flags, "--use-distributed-optimizer", None, "needed for the param all-gather overlap")] \
            if not p.distributed_optimizer else []
        yield _option(config, "DP communication overlap", [
            change(flags, "--overlap-grad-reduce", None, "overlap the gradient reduce-scatter with the backward pass"),
            change(flags, "--overlap-param-gather", None, "overlap the parameter all-gather with the forward pass"),
        ] + extra, p, modelled=False)
    if model.is_moe:
        if flags.get("--moe-token-dispatcher-type") != "alltoall":
            yield _option(config, "all-to-all token dispatcher", [change(
                flags, "--moe-token-dispatcher-type", "alltoall", "all-to-all dispatch scales with EP; allgather does not")],
                p, modelled=False)
        if not flags.has("--moe-grouped-gemm"):
            yield _option(config, "grouped GEMM for experts", [change(
                flags, "--moe-grouped-gemm", None, "one grouped GEMM for the local experts instead of a loop")],
                p, modelled=False)


def combined_memory_option(config: RunConfig) -> LayoutOption | None:
    """The cheapest-first combination of memory savers that the estimator predicts to fit.

    Steps are applied in order of throughput cost (distributed optimizer, sequence parallel, smaller
    micro-batches, full recompute, more PP, more TP) until the prediction fits; None when nothing does
    or memory cannot be predicted.
    """
    if not config.complete:
        return None
    assert config.parallel is not None and config.model is not None and config.cluster is not None
    p, flags = config.parallel, config.flags
    steps: list[tuple[dict[str, object], list[Fix]]] = []
    if not p.distributed_optimizer and p.dp > 1:
        steps.append(({"distributed_optimizer": True},
                      [change(flags, "--use-distributed-optimizer", None, "shard optimizer states over DP")]))
    if p.tp > 1 and not p.sequence_parallel:
        steps.append(({"sequence_parallel": True}, [change(flags, "--sequence-parallel", None, "split activations over TP")]))
    mbs = p.mbs
    while mbs > 1:
        mbs //= 2
        steps.append(({"mbs": mbs}, [change(flags, "--micro-batch-size", str(mbs), "fewer activations per micro-batch")]))
    if p.recompute != "full":
        steps.append(({"recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 1}, [
            change(flags, "--recompute-granularity", "full", "recompute each layer in the backward pass"),
            change(flags, "--recompute-method", "uniform", "uniform recompute"),
            change(flags, "--recompute-num-layers", "1", "checkpoint every layer")]))
    for pp in (p.pp * 2, p.pp * 4, p.pp * 8):
        steps.append(({"pp": pp}, [change(flags, "--pipeline-model-parallel-size", str(pp), "more pipeline stages")]))
    for tp in (p.tp * 2, p.tp * 4, p.tp * 8):
        steps.append(({"tp": tp, "sequence_parallel": True}, [
            change(flags, "--tensor-model-parallel-size", str(tp), "more tensor-parallel ranks"),
            change(flags, "--sequence-parallel", None, "split activations over TP")]))
    update: dict[str, object] = {}
    changes: dict[str, Fix] = {}
    for step_update, step_changes in steps:
        trial = update | step_update
        parallel = _layout(config, **trial)
        if parallel is None:
            continue
        update = trial
        for fix in step_changes:
            changes[fix.flag] = fix
        option = _option(config, "combined: " + ", ".join(f"{f.flag} {f.value or ''}".strip() for f in changes.values()),
                         list(changes.values()), parallel)
        if option is None or option.prediction is None:
            return None
        if option.prediction.fits:
            return option
    return None
