"""Layout changes a fix can propose, each as the complete set of flag edits with its prediction.

Two families: `memory_options` (to get out of an OOM: recompute, distributed optimizer, Megatron-FSDP,
sequence parallel, smaller micro-batch, more TP or PP) and `throughput_options` (to go faster: larger
micro-batch, fewer TP ranks, interleaved pipeline, lighter recompute, FP8 where the GPU has it,
communication overlap). Every option is checked with `validate_layout` (Megatron's own rules), so no
option proposes a layout Megatron would refuse; its flag edits are everything `megapilot script`
writes differently for the new layout (companion flags included), and its prediction is the
estimator's for the launch those edits produce.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from megapilot.diagnose.findings import Fix
from megapilot.diagnose.flags import LaunchFlags, RunConfig, apply_fixes, cuda_graphs_of, run_config
from megapilot.diagnose.layout_flags import layout_flag_changes, stand_in_cluster
from megapilot.diagnose.predict import predict
from megapilot.errors import MegapilotError
from megapilot.estimate.cases import cross_domain_flex_backend
from megapilot.estimate.moe_terms import a2a_overlap_runs, ep_leaves_domain
from megapilot.launch.environment import GRAPH_REGISTRATION_OFF
from megapilot.spec import ParallelConfig, Prediction, TrainingSpec, validate_layout
from megapilot.spec.cuda_graphs import CudaGraphs, cuda_graph_refusal
from megapilot.spec.validate import (
    flex_dispatcher_refusal,
    light_recompute_modules,
    most_offloaded_layers,
    tp_comm_overlap_runs,
)


@dataclass(frozen=True)
class LayoutOption:
    """One proposed change: its flag edits, the layout after it, and what the estimators predict."""

    label: str
    changes: list[Fix]
    parallel: ParallelConfig
    training: TrainingSpec
    prediction: Prediction | None
    modelled: bool = True  # False: the estimator does not price this switch; prediction = the layout's

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
    """The current layout with some fields changed, DP re-derived; None if Megatron would refuse it. With the GPU
    unknown, the layout's rules are checked on a stand-in all the same (unchecked, an interleaving finer than the
    layers would be written as --num-layers-per-virtual-pipeline-stage 0), all but how many GPUs a node holds (TP
    beyond a node is the user's to know)."""
    assert config.parallel is not None and config.model is not None and config.training is not None
    fields = config.parallel.model_dump(exclude={"dp"}) | update
    if fields["tp"] == 1:
        fields["sequence_parallel"] = False
    try:
        parallel = ParallelConfig.for_world(config.world_size, **fields)  # MegapilotError if TP*PP*CP does not divide
        validate_layout(config.model, config.cluster or stand_in_cluster(config, config.training), config.training,
                        parallel, allow_tp_across_nodes=config.cluster is None)
    except (MegapilotError, ValueError):
        return None
    return parallel


def proposed_layout(config: RunConfig, label: str, parallel: ParallelConfig | None,
                    training: TrainingSpec | None = None, *, reasons: dict[str, str] | None = None,
                    extra: tuple[Fix, ...] = (), modelled: bool = True) -> LayoutOption | None:
    """The option with every flag its layout needs, predicted for exactly what those flags say.

    The flag edits come from the launch package (`layout_flag_changes`); `extra` adds switches the
    layout does not express (overlap flags). The prediction is the estimator's for the launch as it
    reads after the edits, so memory and step time are those of what is proposed. None when the
    launch side refuses the layout.
    """
    if parallel is None:
        return None
    assert config.training is not None
    training = training or config.training
    try:
        changes = layout_flag_changes(config, parallel, training, label=label, reasons=reasons)
    except MegapilotError:
        return None  # e.g. a layout `megapilot script` would refuse to write
    changes += [fix for fix in extra if fix.flag not in {c.flag for c in changes}]
    proposed = run_config(apply_fixes(config.flags, changes), gpu=config.gpu, gpus=config.world_size)
    assert proposed.parallel is not None and proposed.training is not None
    prediction = None
    if proposed.complete:
        assert proposed.model is not None and proposed.cluster is not None
        prediction = predict(proposed.model, proposed.cluster, proposed.training, proposed.parallel, proposed.options)
    return LayoutOption(label=label, changes=changes, parallel=proposed.parallel, training=proposed.training,
                        prediction=prediction, modelled=modelled)


def _muon_sharded(config: RunConfig, reason: str) -> LayoutOption | None:
    """Plain Muon -> dist_muon: its state and Newton-Schulz work shared over DP, its all-reduce overlappable
    (the distributed optimizer and Megatron-FSDP, Adam's ways to shard, are refused beside Muon)."""
    assert config.training is not None and config.parallel is not None
    if config.training.optimizer != "muon" or config.parallel.dp == 1:
        return None
    sharded = config.training.model_copy(update={"optimizer": "dist_muon"})
    return proposed_layout(config, "Muon sharded over DP (dist_muon)", config.parallel, sharded,
                           reasons={"--optimizer": reason})


def current_prediction(config: RunConfig) -> Prediction | None:
    if not config.complete:
        return None
    assert config.model and config.cluster and config.training and config.parallel
    return predict(config.model, config.cluster, config.training, config.parallel, config.options)


def memory_options(config: RunConfig) -> list[LayoutOption]:
    """Ways to lower the memory of the most-loaded GPU, least throughput cost first.

    An option the estimator predicts to save nothing (selective recompute under fused attention, whose
    scores are never stored) is left out: it would cost compute and not cure the OOM.
    """
    if not (config.model and config.training and config.parallel):
        return []
    now = current_prediction(config)
    now_gib = now.memory_gib if now else None
    return [o for o in _memory_candidates(config) if o is not None
            and (now_gib is None or o.prediction is None or o.prediction.memory_gib is None
                 or o.prediction.memory_gib < now_gib)]


def _memory_candidates(config: RunConfig) -> Iterator[LayoutOption | None]:
    p, model = config.parallel, config.model
    assert p is not None and model is not None
    if p.recompute == "none":
        yield proposed_layout(config, "selective recompute", _layout(config, recompute="selective"), reasons={
            "--recompute-activations":
                "recompute the attention core in the backward pass instead of storing it (small compute cost)"})
    yield _light_recompute(config, "rerun {modules} in the backward instead of storing their outputs (a forward "
                                   "pass over small or memory-bound tensors)")
    yield _offloading(config)
    if not p.distributed_optimizer and not p.fsdp and p.dp > 1:  # (with Muon, _layout refuses both)
        yield proposed_layout(config, "distributed optimizer", _layout(config, distributed_optimizer=True), reasons={
            "--use-distributed-optimizer": f"shard the fp32 optimizer states over the {p.dp} DP ranks"})
    yield _muon_sharded(config, f"deal Muon's fp32 state out over the {p.dp} DP ranks, layer by layer")
    yield _bf16_gradients(config)
    if not p.fsdp and p.pp == 1 and p.dp > 1:
        yield proposed_layout(config, "Megatron-FSDP", _layout(config, fsdp=True, distributed_optimizer=True), reasons={
            "--use-megatron-fsdp": f"shard weights, gradients and optimizer states over the {p.dp} DP ranks"})
    if p.tp > 1 and not p.sequence_parallel:
        yield proposed_layout(config, "sequence parallel", _layout(config, sequence_parallel=True), reasons={
            "--sequence-parallel": f"split norm/dropout activations over the {p.tp} TP ranks"})
    if p.mbs > 1:
        yield proposed_layout(config, f"micro-batch {p.mbs // 2}", _layout(config, mbs=p.mbs // 2), reasons={
            "--micro-batch-size": "halve the activations held per micro-batch"})
    if p.recompute != "full" or p.recompute_num_layers != 1:
        layers_per_stage = max(1, model.num_layers // (p.pp * p.vpp))
        yield proposed_layout(config, "full recompute", _layout(
            config, recompute="full", recompute_method="uniform", recompute_num_layers=1), reasons={
            "--recompute-granularity": "store only each layer's input; recompute the layer",
            "--recompute-method": "recompute uniformly across the stage's layers",
            "--recompute-num-layers":
                f"checkpoint every layer (1 of the {layers_per_stage} per stage): the most saved"})
    if p.pp * 2 <= model.num_layers and not p.fsdp:  # megapilot plans and scripts Megatron-FSDP at PP 1 only
        yield proposed_layout(config, f"pipeline parallel {p.pp * 2}", _layout(config, pp=p.pp * 2), reasons={
            "--pipeline-model-parallel-size": "split the layers over twice as many pipeline stages"})
    more_tp = _layout(config, tp=p.tp * 2, sequence_parallel=True)
    yield proposed_layout(config, f"tensor parallel {p.tp * 2}", more_tp, reasons={
        "--tensor-model-parallel-size": "split every weight and activation over twice the ranks",
        "--sequence-parallel": "with TP > 1, also split the sequence"})


def _offloading(config: RunConfig) -> LayoutOption | None:
    """Activation offloading of the fewest layers that fit by the estimate, from a quarter, half and three quarters of
    the model's layers; Megatron's most when none of those does or nothing is predicted; None where Megatron
    offloads no more than now (beside PP or recompute)."""
    p, model = config.parallel, config.model
    assert p is not None and model is not None
    layers, most = model.num_layers, most_offloaded_layers(model.num_layers, p.pp, p.recompute)
    counts = sorted(n for n in {layers // 4, layers // 2, 3 * layers // 4, most}
                    if p.cpu_offloading_num_layers < n <= most)
    option = None
    for offloaded in counts:
        option = proposed_layout(config, f"offload {offloaded} layers' activations", _layout(
            config, cpu_offloading_num_layers=offloaded), reasons={
            "--cpu-offloading-num-layers": f"move the activations of the first {offloaded} layers to host memory "
                                           "between their forward and backward (copies overlap the other layers)"})
        if option is not None and option.prediction is not None and option.prediction.fits:
            return option
    return option


def _light_recompute(config: RunConfig, reason: str) -> LayoutOption | None:
    """Selective recompute of the modules MoE and MLA recipes rerun (`light_recompute_modules`), added to the
    modules recomputed now; None where the model has none or they are recomputed already."""
    p, model, training = config.parallel, config.model, config.training
    assert p is not None and model is not None and training is not None
    light = light_recompute_modules(model, training.quant_flavour)
    if not light or set(light) <= p.recomputed_modules:
        return None
    kept = p.recompute_modules or () if p.recompute == "selective" else ()
    modules = tuple(dict.fromkeys((*kept, *light)))
    listed = ", ".join(modules)
    return proposed_layout(config, f"recompute {listed}", _layout(
        config, recompute="selective", recompute_modules=modules, recompute_method="uniform",
        recompute_num_layers=None), reasons={
        "--recompute-granularity": "selective: rerun chosen modules, not whole layers",
        "--recompute-modules": reason.format(modules=listed)})


def throughput_options(config: RunConfig) -> list[LayoutOption]:
    """Ways to raise tokens/s, for `optimize` and low-throughput findings."""
    if not (config.model and config.training and config.parallel):
        return []
    return [o for o in _throughput_candidates(config) if o is not None]


def _throughput_candidates(config: RunConfig) -> Iterator[LayoutOption | None]:
    p, model, training = config.parallel, config.model, config.training
    assert p is not None and model is not None and training is not None
    yield proposed_layout(config, f"micro-batch {p.mbs * 2}", _layout(config, mbs=p.mbs * 2), reasons={
        "--micro-batch-size": "larger GEMMs and fewer pipeline/optimizer steps per sample"})
    if p.tp > 1:
        yield proposed_layout(config, f"tensor parallel {p.tp // 2}", _layout(config, tp=p.tp // 2), reasons={
            "--tensor-model-parallel-size": "fewer TP ranks: less TP communication per layer"})
    if p.pp > 1 and p.vpp == 1:
        layers_per_stage = model.num_layers // p.pp
        if layers_per_stage >= 2 and layers_per_stage % 2 == 0:
            yield proposed_layout(config, "interleaved pipeline (VPP 2)", _layout(config, vpp=2), reasons={
                "--num-layers-per-virtual-pipeline-stage": "two virtual stages per rank: half the pipeline bubble"})
    if p.recompute == "full":
        yield _light_recompute(config, "recompute only {modules}, as the MoE and MLA recipes do, instead of whole "
                                       "layers")
        yield proposed_layout(config, "selective instead of full recompute",
                      _layout(config, recompute="selective", recompute_num_layers=None), reasons={
                          "--recompute-activations": "recompute only the attention core",
                          "--recompute-method": "only for full recompute",
                          "--recompute-num-layers": "only for full recompute"})
    if p.recompute == "selective":
        yield proposed_layout(config, "no recompute", _layout(config, recompute="none"), reasons={
            "--recompute-activations": "skip the recompute pass", "--recompute-granularity": "skip the recompute pass"})
    gpu = config.gpu
    if gpu is not None and gpu.supports("fp8") and training.precision in ("bf16", "fp16"):
        yield proposed_layout(config, "FP8 GEMMs", p, training.model_copy(update={"precision": "fp8"}), reasons={
            "--fp8-format": f"{gpu.alias} runs FP8 GEMMs at {gpu.peak_tflops('fp8'):.0f} TF/s"})
    yield from _overlap_options(config)
    if p.dp * p.cp > 1:  # a reduction to halve
        yield _bf16_gradients(config)


def _bf16_gradients(config: RunConfig) -> LayoutOption | None:
    """Gradients kept and reduced in bf16 where a bf16 run keeps them in fp32 (Megatron's default): half the
    gradient buffers and half the bytes of the DP reduction. The sum runs in bf16, which is why Megatron does not
    default to it; NeMo's and Megatron-Bridge's performance recipes run it. None where there is nothing to halve."""
    training = config.training
    assert training is not None
    if not config.flags.has("--bf16") or training.grad_reduce_in_bf16:
        return None
    return proposed_layout(config, "bf16 gradients", config.parallel,
                           training.model_copy(update={"grad_reduce_in_bf16": True}), reasons={
        "--grad-reduce-in-bf16": "keep and reduce the gradients in bf16: half their memory and DP traffic (the sum "
                                 "loses fp32's precision; NeMo's and Megatron-Bridge's recipes run it)"})


def _overlap_options(config: RunConfig) -> Iterator[LayoutOption | None]:
    """Switches offered with the prediction of the flags they leave: the overlaps (priced: the estimate reads them
    from the flags), the alltoall dispatcher and grouped GEMM (not priced: their prediction is the layout's)."""
    flags, p, model = config.flags, config.parallel, config.model
    assert p is not None and model is not None and config.training is not None
    # where it runs on this GPU; with none named, wherever NVIDIA's would run it
    if tp_comm_overlap_runs(config.gpu, p, config.training.precision) and not flags.has("--tp-comm-overlap"):
        yield proposed_layout(config, "TP communication overlap", p, extra=(change(
            flags, "--tp-comm-overlap", None,
            "overlap TP all-gather/reduce-scatter with GEMMs (needs SP, Transformer Engine)"),))
    if p.dp > 1 and config.training is not None and config.training.optimizer == "muon":
        yield _muon_sharded(config, "Megatron overlaps the gradient all-reduce with dist_muon, never with muon")
    elif p.dp > 1 and config.training is not None and config.training.uses_muon:
        if not flags.has("--overlap-grad-reduce"):
            yield proposed_layout(config, "DP communication overlap", p, extra=(change(
                flags, "--overlap-grad-reduce", None, "overlap the gradient all-reduce with the backward pass"),))
    elif p.dp > 1 and not flags.has("--overlap-grad-reduce"):
        # the param all-gather overlap needs sharded parameters: the distributed optimizer comes with it
        sharded = _layout(config, distributed_optimizer=True) if not (p.distributed_optimizer or p.fsdp) else p
        yield proposed_layout(config, "DP communication overlap", sharded, reasons={
            "--use-distributed-optimizer": "needed for the param all-gather overlap"}, extra=(
            change(flags, "--overlap-grad-reduce", None, "overlap the gradient reduce-scatter with the backward pass"),
            change(flags, "--overlap-param-gather", None, "overlap the parameter all-gather with the forward pass")))
    if model.is_moe:
        if p.ep > 1 and not flags.has("--overlap-moe-expert-parallel-comm") and config.training is not None and (
                a2a_overlap_runs(model, config.training, p, config.options)):  # the layout and the run's graphs
            yield proposed_layout(config, "expert all-to-all overlap", p, extra=(
                change(flags, "--overlap-moe-expert-parallel-comm", None,
                       "run one micro-batch's expert all-to-all under another's compute"),
                change(flags, "--delay-wgrad-compute", None, "the weight gradients wait to make room")))
        yield _flex_dispatcher_option(config)
        if flags.get("--moe-token-dispatcher-type") not in ("alltoall", "flex"):  # Megatron's default: allgather
            yield proposed_layout(config, "all-to-all token dispatcher", p, modelled=False, extra=(change(
                flags, "--moe-token-dispatcher-type", "alltoall",
                "all-to-all dispatch scales with EP; allgather does not"),))
        if not flags.has("--moe-grouped-gemm"):
            yield proposed_layout(config, "grouped GEMM for experts", p, modelled=False, extra=(change(
                flags, "--moe-grouped-gemm", None, "one grouped GEMM for the local experts instead of a loop"),))
    yield _cuda_graphs_option(config)


def _flex_dispatcher_option(config: RunConfig) -> LayoutOption | None:
    """The flex dispatcher where the expert group leaves the NVLink domain and the launch dispatches otherwise: a
    token crosses to each remote domain once and fans out over NVLink there, instead of one copy per remote expert
    (Megatron-Core's MoE guide pairs cross-node expert parallelism with it; `plan` prices such layouts so, and the
    25.09 DeepSeek-V3 recipe on 1,024 H100 ran DeepEP). Priced: the estimate reads the dispatcher from the flags.
    None inside the domain, where the backend that runs here is not known to beat alltoall, or where none runs."""
    flags, p, model, cluster = config.flags, config.parallel, config.model, config.cluster
    assert p is not None and model is not None
    if (flags.get("--moe-token-dispatcher-type") == "flex" or cluster is None or not ep_leaves_domain(cluster, p)
            or flex_dispatcher_refusal(p) is not None):
        return None
    backend = cross_domain_flex_backend(model, cluster)
    if backend is None:
        return None
    return proposed_layout(config, f"flex token dispatcher ({backend})", p, extra=flex_flags(flags, backend, p.ep))


def flex_flags(flags: LaunchFlags, backend: str, ep: int) -> tuple[Fix, Fix]:
    """The two flags that put the MoE tokens through the flex dispatcher's `backend`."""
    return (change(flags, "--moe-token-dispatcher-type", "flex",
                   f"EP {ep} leaves the NVLink domain: each token crosses to a remote domain once, then fans out "
                   "over NVLink, instead of one copy per remote expert"),
            change(flags, "--moe-flex-dispatcher-backend", backend, f"the fused {backend} all-to-all (the library "
                   "must be in the image)"))


# The graphs the later Megatron-Bridge recipes run, most captured first: a dense model's whole iteration (Llama 3),
# a MoE model's attention, router and preprocess (DeepSeek-V3, Qwen3, GPT-OSS), or without the preprocess where the
# alltoall dispatcher reads token counts on the host, or without the attention (DeepSeek-V3 on GB200) where it may not
# be captured. Said in core_v0.16's words, which later releases migrate.
_DENSE_GRAPHS = (CudaGraphs(impl="local", scope=("full_iteration",)),)
_MOE_GRAPHS = (CudaGraphs(impl="transformer_engine", scope=("attn", "moe_router", "moe_preprocess")),
               CudaGraphs(impl="transformer_engine", scope=("attn", "moe_router")),
               CudaGraphs(impl="transformer_engine", scope=("moe_router", "moe_preprocess")))


def _cuda_graphs_option(config: RunConfig) -> LayoutOption | None:
    """CUDA graphs where the launch runs none, on NVIDIA GPUs, the first of the recipes' scopes Megatron-Core
    allows for this model and layout: the captured kernels skip the host's launches."""
    p, model, flags = config.parallel, config.model, config.flags
    assert p is not None and model is not None and config.training is not None
    if cuda_graphs_of(flags) is not None or config.gpu is None or config.gpu.vendor != "NVIDIA":
        return None
    padding = flags.has("--moe-router-padding-for-quantization") or flags.has("--moe-router-padding-for-fp8")
    flex = flags.get("--moe-token-dispatcher-type") == "flex"
    overlap = flags.has("--overlap-moe-expert-parallel-comm")
    graphs = next((g for g in (_MOE_GRAPHS if model.is_moe else _DENSE_GRAPHS)
                   if cuda_graph_refusal(model, p, g, flex_dispatcher=flex, router_padding=padding,
                                         a2a_overlap=overlap) is None), None)
    if graphs is None:
        return None
    why = "replay the captured kernels from a graph: no host launch (and no Python before it) per kernel"
    extra = [change(flags, "--cuda-graph-impl", graphs.impl, why),
             change(flags, "--cuda-graph-scope", " ".join(graphs.scope), "what the graphs capture"),
             change(flags, "--te-rng-tracker", None, "graph-safe random streams"),
             Fix("set", GRAPH_REGISTRATION_OFF.name, GRAPH_REGISTRATION_OFF.value, GRAPH_REGISTRATION_OFF.why,
                 kind="env")]
    if "full_iteration" in graphs.scope:
        extra.append(change(flags, "--no-check-for-nan-in-loss-and-grad", None,
                            "the NaN check's host sync cannot sit inside the captured step (Megatron asserts it)"))
    return proposed_layout(config, f"CUDA graphs ({graphs.describe()})", p, extra=tuple(extra))


def combined_memory_option(config: RunConfig) -> LayoutOption | None:
    """The cheapest-first combination of memory savers that the estimator predicts to fit.

    Steps are applied in order of throughput cost (distributed optimizer, sequence parallel, smaller
    micro-batches, full recompute, more PP, more TP) until the prediction fits; None when nothing does
    or memory cannot be predicted. The flags listed are every edit from the current launch to the
    combined layout.
    """
    if not config.complete:
        return None
    assert config.parallel is not None and config.model is not None and config.cluster is not None
    update: dict[str, object] = {}
    for step in _memory_steps(config.parallel):
        trial = update | step
        parallel = _layout(config, **trial)
        if parallel is None:
            continue
        update = trial
        option = proposed_layout(config, "combined", parallel)
        if option is None or option.prediction is None:
            return None
        if option.prediction.fits:
            label = "combined: " + ", ".join(f"{f.flag} {f.value or ''}".strip()
                                             for f in option.changes if f.action != "remove")
            return replace(option, label=label)
    return None


def _memory_steps(p: ParallelConfig) -> list[dict[str, object]]:
    """Layout updates in order of throughput cost, each applied on top of the ones before."""
    steps: list[dict[str, object]] = []
    if not p.distributed_optimizer and not p.fsdp and p.dp > 1:
        steps.append({"distributed_optimizer": True})
    if p.tp > 1 and not p.sequence_parallel:
        steps.append({"sequence_parallel": True})
    mbs = p.mbs
    while mbs > 1:
        mbs //= 2
        steps.append({"mbs": mbs})
    if p.recompute != "full":
        steps.append({"recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 1})
    if not p.fsdp:
        steps += [{"pp": p.pp * factor} for factor in (2, 4, 8)]
    steps += [{"tp": p.tp * factor, "sequence_parallel": True} for factor in (2, 4, 8)]
    return steps
