"""Layout options: exact flag edits, each re-validated, DP re-derived, with the estimators' prediction."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose.flags import apply_fixes, read_flags, run_config
from megapilot.diagnose.options import (
    change,
    combined_memory_option,
    current_prediction,
    memory_options,
    remove,
    throughput_options,
)
from megapilot.diagnose.predict import predict
from megapilot.estimate import estimate
from megapilot.spec import ParallelConfig, validate_layout

# Llama-3-8B shape, TP 2 without SP, MBS 2, no recompute, no distributed optimizer.
LLAMA3_8B = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
             "--group-query-attention --num-query-groups 8 --seq-length 8192 --global-batch-size 128 "
             "--micro-batch-size 2 --bf16 --swiglu --vocab-size 128256 --tensor-model-parallel-size 2")


# Mixtral-8x7B's shape with 8 experts over EP 8 on two nodes, TP 1.
MIXTRAL = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
           "--group-query-attention --num-query-groups 8 --seq-length 4096 --global-batch-size 256 "
           "--micro-batch-size 1 --bf16 --swiglu --vocab-size 32000 --num-experts 8 --moe-router-topk 2 "
           "--expert-model-parallel-size 8 --use-distributed-optimizer")


def _config(flags: str = LLAMA3_8B, gpus: int = 8, gpu: str | None = "h100"):
    return run_config(read_flags(flags=flags), gpu=get_gpu(gpu) if gpu else None, gpus=gpus)


def test_change_sets_a_flag_the_launch_has_and_adds_one_it_lacks():
    flags = read_flags(flags="--micro-batch-size 2")
    assert change(flags, "--micro-batch-size", "1", "r").action == "set"
    assert change(flags, "--sequence-parallel", None, "r").action == "add"
    assert remove("--recompute-method", "r").action == "remove" and remove("--recompute-method", "r").value is None


def test_memory_options_cover_every_saver_the_layout_still_lacks():
    labels = [o.label for o in memory_options(_config(gpu=None))]  # no GPU: nothing predicted, nothing filtered
    assert labels == ["selective recompute", "offload 31 layers' activations", "distributed optimizer",
                      "bf16 gradients", "Megatron-FSDP", "sequence parallel", "micro-batch 1", "full recompute",
                      "pipeline parallel 2", "tensor parallel 4"]


def test_offloading_is_offered_for_the_fewest_layers_that_fit_and_writes_its_one_flag():
    """Megatron runs --cpu-offloading-num-layers only with PP 1 and no recompute. With the distributed optimizer,
    8 of the 32 layers bring the 8B under 80 GiB; without it even 31 of 32 are needed (Megatron's most)."""
    sharded = _config(LLAMA3_8B + " --use-distributed-optimizer")
    option = next(o for o in memory_options(sharded) if o.label.startswith("offload"))
    assert [(c.action, c.flag, c.value) for c in option.changes] == [("add", "--cpu-offloading-num-layers", "8")]
    assert option.parallel.cpu_offloading_num_layers == 8 and option.prediction is not None
    assert option.prediction.fits and not current_prediction(sharded).fits
    most = next(o for o in memory_options(_config()) if o.label.startswith("offload"))
    assert most.parallel.cpu_offloading_num_layers == 31
    for other in (LLAMA3_8B + " --recompute-activations", LLAMA3_8B + " --pipeline-model-parallel-size 2"):
        assert not any(o.label.startswith("offload") for o in memory_options(_config(other)))


def test_every_option_is_a_legal_layout_that_fills_the_world():
    config = _config()
    for option in memory_options(config) + throughput_options(config):
        p = option.parallel
        assert p.tp * p.pp * p.cp * p.dp == config.world_size, option.label
        validate_layout(config.model, config.cluster, option.training, p)


def test_a_layout_that_does_not_divide_the_world_is_not_offered():
    labels = {o.label for o in memory_options(_config(LLAMA3_8B.replace("128", "120", 1), gpus=6))}
    assert "distributed optimizer" in labels  # the world of 6 is 2 x 3: neither TP 4 nor PP 2 x TP 2 divides it
    assert "tensor parallel 4" not in labels and "pipeline parallel 2" not in labels


def test_every_memory_option_predicts_less_memory_than_now():
    config = _config()
    now = current_prediction(config)
    assert now is not None
    options = memory_options(config)
    labels = {o.label for o in options}
    assert {"distributed optimizer", "Megatron-FSDP", "sequence parallel", "micro-batch 1", "full recompute"} <= labels
    for option in options:
        assert option.prediction is not None and option.prediction.memory_gib < now.memory_gib, option.label


def test_selective_recompute_is_not_offered_when_predicted_to_save_nothing():
    # The estimator assumes fused attention, whose scores are never stored: selective recompute saves 0 GiB.
    assert "selective recompute" not in {o.label for o in memory_options(_config())}


def test_fixes_carry_the_option_label_and_prediction_but_unmodelled_switches_no_throughput():
    options = {o.label: o for o in throughput_options(_config(LLAMA3_8B + " --sequence-parallel"))}
    (larger_batch,) = options["micro-batch 4"].fixes()
    assert larger_batch.option == "micro-batch 4" and larger_batch.flag == "--micro-batch-size"
    assert larger_batch.predicted_memory_gib == options["micro-batch 4"].prediction.memory_gib
    # the overlaps are priced: the estimate reads them from the flags, so adding one predicts its gain
    overlap = options["TP communication overlap"]
    now = current_prediction(_config(LLAMA3_8B + " --sequence-parallel"))
    assert overlap.modelled and overlap.prediction.tokens_per_s_per_gpu > now.tokens_per_s_per_gpu
    assert all(f.predicted_tokens_per_s_per_gpu == overlap.prediction.tokens_per_s_per_gpu for f in overlap.fixes())
    # a switch the estimator does not price carries no throughput
    moe = {o.label: o for o in throughput_options(_config(MIXTRAL + " --moe-token-dispatcher-type alltoall"))}
    grouped = moe["grouped GEMM for experts"]
    assert not grouped.modelled and all(f.predicted_tokens_per_s_per_gpu is None for f in grouped.fixes())


def test_the_run_switches_in_the_flags_are_what_the_prediction_prices():
    plain = _config(MIXTRAL + " --moe-token-dispatcher-type alltoall")
    assert not plain.options.tp_comm_overlap and not plain.options.moe_a2a_overlap
    switched = _config(MIXTRAL + " --moe-token-dispatcher-type flex --overlap-moe-expert-parallel-comm "
                                 "--tp-comm-overlap --overlap-grad-reduce")
    assert switched.options.moe_flex_dispatcher and switched.options.moe_a2a_overlap
    assert switched.options.tp_comm_overlap and switched.options.overlap_grad_reduce
    labels = {o.label for o in throughput_options(switched)}
    assert "all-to-all token dispatcher" not in labels  # flex is not switched back to alltoall
    assert "expert all-to-all overlap" in {o.label for o in throughput_options(plain)}


def test_the_all_to_all_overlap_is_not_offered_beside_graph_scopes_megatron_refuses_it_with():
    """Transformer Engine's moe and mlp graph scopes and --overlap-moe-expert-parallel-comm: Megatron-Core asserts
    one or the other (core_v0.16 on), so the option would write a launch that stops before its first step."""
    graphed = _config(MIXTRAL + " --moe-token-dispatcher-type alltoall --moe-expert-capacity-factor 1.0 "
                                "--moe-pad-expert-input-to-capacity --cuda-graph-impl transformer_engine "
                                "--cuda-graph-scope moe")
    assert graphed.options.cuda_graphs is not None
    assert "expert all-to-all overlap" not in {o.label for o in throughput_options(graphed)}


@pytest.mark.parametrize("gpu", ["h100", None])
def test_no_option_interleaves_finer_than_the_layers_gpu_known_or_not(gpu: str | None):
    """32 layers on PP 2 x VPP 16 (one layer per virtual stage): doubling PP leaves half a layer per stage. Without a
    GPU the layout went unchecked and was rendered as --num-layers-per-virtual-pipeline-stage 0, which stopped
    `diagnose` on the run's OOM with an error about a flag the user never wrote."""
    config = _config(LLAMA3_8B.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 1")
                     + " --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1", gpu=gpu)
    labels = {o.label for o in memory_options(config) + throughput_options(config)}
    assert "pipeline parallel 4" not in labels and "distributed optimizer" in labels


def test_tp_communication_overlap_is_offered_only_where_userbuffers_exist():
    flags = LLAMA3_8B + " --sequence-parallel"
    assert "TP communication overlap" in {o.label for o in throughput_options(_config(flags))}
    assert "TP communication overlap" not in {o.label for o in throughput_options(_config(flags, gpu="mi300x"))}


def test_tp_communication_overlap_is_not_offered_under_nvfp4():
    """The recipes run NVFP4 without the userbuffers overlap (`spec.validate.tp_comm_overlap_runs`): the option
    would be priced as a gain no NVFP4 recipe takes."""
    flags = LLAMA3_8B + " --sequence-parallel --fp4-format e2m1 --fp4-recipe nvfp4"
    assert _config(flags, gpu="b200").training.precision == "nvfp4"
    assert "TP communication overlap" not in {o.label for o in throughput_options(_config(flags, gpu="b200"))}
    assert "TP communication overlap" in {o.label for o in throughput_options(_config(
        flags.replace("--fp4-format e2m1 --fp4-recipe nvfp4", "--fp8-format e4m3 --fp8-recipe mxfp8"), gpu="b200"))}
    # with no GPU named the precision still rules it out: no GPU runs it under NVFP4
    assert "TP communication overlap" not in {o.label for o in throughput_options(_config(flags, gpu=None))}
    bf16 = _config(LLAMA3_8B + " --sequence-parallel", gpu=None)
    assert "TP communication overlap" in {o.label for o in throughput_options(bf16)}


def test_fp8_is_offered_only_on_a_gpu_that_has_it():
    assert "FP8 GEMMs" in {o.label for o in throughput_options(_config())}
    assert "FP8 GEMMs" not in {o.label for o in throughput_options(_config(gpu="a100"))}


def test_without_a_model_shape_there_are_no_options_and_no_prediction():
    config = _config("--tensor-model-parallel-size 2 --micro-batch-size 2")
    assert memory_options(config) == [] and throughput_options(config) == []
    assert current_prediction(config) is None and combined_memory_option(config) is None


def test_combined_option_fits_and_names_each_flag_once():
    config = _config(LLAMA3_8B.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 1"))
    now = current_prediction(config)
    assert now is not None and not now.fits
    combined = combined_memory_option(config)
    assert combined is not None and combined.prediction is not None and combined.prediction.fits
    flags = [f.flag for f in combined.changes]
    assert len(flags) == len(set(flags)) and combined.label.startswith("combined: ")


def test_combined_option_needs_the_gpu_to_predict():
    assert combined_memory_option(_config(gpu=None)) is None


def test_every_option_lists_the_flags_that_reparse_into_its_predicted_layout():
    config = _config(LLAMA3_8B + " --sequence-parallel --use-distributed-optimizer --recompute-activations")
    for option in memory_options(config) + throughput_options(config):
        proposed = run_config(apply_fixes(config.flags, option.changes), gpu=config.gpu, gpus=config.world_size)
        assert proposed.parallel == option.parallel and proposed.training == option.training, option.label
        expected = estimate(config.model, config.cluster, option.training, option.parallel)
        assert option.prediction is not None and option.prediction.memory_gib == expected.memory_gib.total, option.label


def test_the_fsdp_option_switches_megatron_fsdp_on_with_its_companions_and_predicts_exactly_that():
    config = _config()
    fsdp = {o.label: o for o in memory_options(config)}["Megatron-FSDP"]
    flags = apply_fixes(config.flags, fsdp.changes)
    assert flags.has("--use-megatron-fsdp") and flags.has("--use-distributed-optimizer")
    assert flags.get("--ckpt-format") == "fsdp_dtensor"
    built_by_hand = ParallelConfig(tp=2, dp=4, mbs=2, recompute="none", distributed_optimizer=True, fsdp=True)
    assert fsdp.parallel == built_by_hand
    by_hand = estimate(config.model, config.cluster, config.training, built_by_hand)
    assert fsdp.prediction is not None and fsdp.prediction.memory_gib == by_hand.memory_gib.total
    plain = current_prediction(config)
    assert plain is not None and fsdp.prediction.memory_gib < plain.memory_gib


def test_no_pipeline_option_is_offered_to_a_megatron_fsdp_run():
    config = _config(LLAMA3_8B + " --use-megatron-fsdp --use-distributed-optimizer")
    assert config.parallel is not None and config.parallel.fsdp
    labels = {o.label for o in memory_options(config)}
    assert "pipeline parallel 2" not in labels and "Megatron-FSDP" not in labels
    combined = combined_memory_option(config)
    assert combined is None or combined.parallel.pp == 1


def test_a_muon_run_is_offered_dist_muon_not_what_megatron_refuses_beside_it():
    muon = LLAMA3_8B + " --optimizer muon"
    for gpu in (None, "h100"):
        labels = [o.label for o in memory_options(_config(muon, gpu=gpu))]
        assert "Muon sharded over DP (dist_muon)" in labels
        assert "distributed optimizer" not in labels and "Megatron-FSDP" not in labels
    sharded = next(o for o in memory_options(_config(muon)) if o.label.startswith("Muon sharded"))
    assert ("--optimizer", "dist_muon") in [(f.flag, f.value) for f in sharded.changes]
    assert not {"--use-distributed-optimizer", "--use-megatron-fsdp"} & {f.flag for f in sharded.changes}
    throughput = [o.label for o in throughput_options(_config(muon))]
    assert "Muon sharded over DP (dist_muon)" in throughput and "DP communication overlap" not in throughput
    dist = [o for o in throughput_options(_config(LLAMA3_8B + " --optimizer dist_muon"))
            if o.label == "DP communication overlap"]
    assert dist and [f.flag for f in dist[0].changes] == ["--overlap-grad-reduce"]


def test_validate_layout_refuses_the_distributed_optimizer_beside_muon():
    import pytest

    from megapilot.errors import MegapilotError

    config = _config(LLAMA3_8B + " --optimizer muon")
    sharded = ParallelConfig.for_world(8, tp=2, mbs=2, distributed_optimizer=True)
    with pytest.raises(MegapilotError) as refused:
        validate_layout(config.model, config.cluster, config.training, sharded)
    assert refused.value.field == "distributed_optimizer"


def test_a_moe_run_short_of_memory_is_offered_the_light_modules_and_one_in_full_recompute_a_way_out():
    config = _config(MIXTRAL, gpus=16)
    option = {o.label: o for o in memory_options(config)}["recompute moe_act, layernorm"]
    assert option.parallel.recompute_modules == ("moe_act", "layernorm")
    assert {f.flag for f in option.fixes()} >= {"--recompute-granularity", "--recompute-modules"}
    full = _config(MIXTRAL + " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
                   gpus=16)
    faster = {o.label: o for o in throughput_options(full)}["recompute moe_act, layernorm"]
    assert faster.prediction.tokens_per_s_per_gpu > current_prediction(full).tokens_per_s_per_gpu
    already = _config(MIXTRAL + " --recompute-granularity selective --recompute-modules moe_act layernorm", gpus=16)
    assert not any(o.label.startswith("recompute moe_act") for o in memory_options(already))


def test_cuda_graphs_are_offered_as_the_recipes_run_them_where_megatron_allows_and_priced():
    def graphs_option(flags: str, gpus: int = 8, gpu: str = "h100"):
        config = _config(flags, gpus=gpus, gpu=gpu)
        return next((o for o in throughput_options(config) if o.label.startswith("CUDA graphs")), None), config

    dense, config = graphs_option(LLAMA3_8B)
    assert dense is not None and dense.label == "CUDA graphs (local over full_iteration)"
    assert {(c.flag, c.value) for c in dense.changes} >= {("--cuda-graph-impl", "local"),
                                                          ("--cuda-graph-scope", "full_iteration"),
                                                          ("--no-check-for-nan-in-loss-and-grad", None)}
    now = predict(config.model, config.cluster, config.training, config.parallel, config.options)
    assert dense.prediction is not None and dense.prediction.tokens_per_s_per_gpu > now.tokens_per_s_per_gpu
    moe, _ = graphs_option(MIXTRAL, gpus=16)
    assert moe is not None and moe.label == "CUDA graphs (transformer_engine over attn, moe_router, moe_preprocess)"
    padded, _ = graphs_option(MIXTRAL + " --moe-router-padding-for-quantization", gpus=16)  # counts read on the host
    assert padded is not None and padded.label == "CUDA graphs (transformer_engine over attn, moe_router)"
    assert graphs_option(LLAMA3_8B + " --cuda-graph-impl transformer_engine --cuda-graph-scope attn")[0] is None
    assert graphs_option(LLAMA3_8B, gpu="mi300x")[0] is None  # CUDA graphs are NVIDIA's
    # the script's allocator has expandable segments, beside which Megatron asserts NCCL's graph registration off
    assert ("env", "NCCL_GRAPH_REGISTER", "0") in {(c.kind, c.flag, c.value) for c in moe.changes}
    # beside the expert all-to-all overlap, the attention graph holds weight gradients it delays: biased attention
    # (GPT-OSS's) is refused there (Megatron-LM core_v0.17 on), so the offer leaves attn out, as DeepSeek-V3's GB200
    # recipe captures the router and preprocess alone
    biased = graphs_option(MIXTRAL + " --add-bias-linear --overlap-moe-expert-parallel-comm --delay-wgrad-compute "
                           "--moe-token-dispatcher-type flex", gpus=16)[0]
    assert biased is not None and biased.label == "CUDA graphs (transformer_engine over moe_router, moe_preprocess)"


def test_the_flex_dispatcher_is_offered_where_the_expert_group_leaves_the_nvlink_domain():
    """EP 16 over two 8-GPU H100 nodes: DeepEP sends a token to the other node once and fans it out over NVLink
    there, where alltoall sends one copy per remote expert; the estimate prices the dispatcher the flags name, so
    the option is predicted faster. Inside one node, on AMD GPUs (no backend) and under flex already: not offered."""
    wide = MIXTRAL.replace("--num-experts 8", "--num-experts 16").replace(
        "--expert-model-parallel-size 8", "--expert-model-parallel-size 16") + " --moe-token-dispatcher-type alltoall"
    options = {o.label: o for o in throughput_options(_config(wide, gpus=16))}
    flex = options["flex token dispatcher (deepep)"]
    assert [(c.action, c.flag, c.value) for c in flex.changes] == [
        ("set", "--moe-token-dispatcher-type", "flex"), ("add", "--moe-flex-dispatcher-backend", "deepep")]
    assert flex.modelled and flex.parallel == _config(wide, gpus=16).parallel
    assert flex.prediction.tokens_per_s_per_gpu > current_prediction(_config(wide, gpus=16)).tokens_per_s_per_gpu
    in_node = MIXTRAL + " --moe-token-dispatcher-type alltoall"
    for config in (_config(in_node), _config(wide, gpus=16, gpu="mi300x"),
                   _config(wide.replace("dispatcher-type alltoall", "dispatcher-type flex"), gpus=16)):
        assert not any(o.label.startswith("flex") for o in throughput_options(config))
