"""Recipe-grade performance flags and Megatron-FSDP companions: each emitted where it applies and not elsewhere,
each under a section whose title gives the reason, and every rendered combination passes the pre-write checks."""

from __future__ import annotations

import pytest

from megapilot.errors import MegapilotError
from megapilot.launch import LaunchOptions, render_launch, render_megatron_args
from megapilot.launch.flags import megatron_arg_sections
from megapilot.launch.perf_flags import (
    distributed_timeout_minutes,
    exit_duration_minutes,
    meta_device_init_needed,
    slurm_time_limit_minutes,
)
from megapilot.spec import SavedPlan, TrainingSpec
from tests.launch.plans import (
    DEEPSEEK_V2_LITE,
    LLAMA31_8B,
    LLAMA31_405B,
    MIXTRAL_8X7B,
    make_plan,
)

TRAIN = TrainingSpec(seq_length=4096, global_batch_size=64)
MEGATRON = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False)
EMBEDDED_GPU = LaunchOptions(mock_data=True, entrypoint="megapilot", check_paths_exist=False)
CPU = LaunchOptions(mock_data=True, entrypoint="megapilot", cpu=True, check_paths_exist=False)


def _args(plan: SavedPlan, options: LaunchOptions = MEGATRON) -> list[str]:
    return render_megatron_args(plan, options)


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _reason(plan: SavedPlan, options: LaunchOptions, flag: str) -> str:
    return next(s.title for s in megatron_arg_sections(plan, options) if flag in s.args)


# ---- Megatron-FSDP ------------------------------------------------------------------------------
def test_megatron_fsdp_comes_with_its_companions() -> None:
    args = _args(make_plan(LLAMA31_8B, "h100", 1, TRAIN, fsdp=True, distributed_optimizer=False))
    for flag in ("--use-megatron-fsdp", "--use-distributed-optimizer", "--no-gradient-accumulation-fusion",
                 "--fsdp-double-buffer", "--overlap-grad-reduce", "--overlap-param-gather"):
        assert flag in args, flag
    assert _value(args, "--data-parallel-sharding-strategy") == "optim_grads_params"
    assert _value(args, "--ckpt-format") == "fsdp_dtensor"
    assert "--init-model-with-meta-device" not in args  # 8B: 15 GiB of bf16 weights per rank fit easily


def test_no_fsdp_companions_without_fsdp() -> None:
    args = _args(make_plan(LLAMA31_8B, "h100", 1, TRAIN))
    assert not {"--use-megatron-fsdp", "--fsdp-double-buffer", "--no-gradient-accumulation-fusion",
                "--data-parallel-sharding-strategy", "--init-model-with-meta-device"} & set(args)
    assert _value(args, "--ckpt-format") == "torch_dist"


def test_meta_device_init_when_one_ranks_unsharded_weights_exceed_half_the_hbm() -> None:
    big = make_plan(LLAMA31_405B, "h100", 8, TRAIN, tp=8, sequence_parallel=True, fsdp=True)  # ~94 GiB per rank
    assert meta_device_init_needed(big) and "--init-model-with-meta-device" in _args(big)
    assert "meta device" in _reason(big, MEGATRON, "--init-model-with-meta-device")
    on_b200 = make_plan(LLAMA31_8B, "b200", 1, TRAIN, fsdp=True)
    assert not meta_device_init_needed(on_b200)
    assert not meta_device_init_needed(make_plan(LLAMA31_405B, "h100", 8, TRAIN, tp=8, pp=8))  # no FSDP


def test_a_pipelined_fsdp_plan_is_refused_before_any_script_is_written() -> None:
    plan = make_plan(LLAMA31_8B, "h100", 1, TRAIN, pp=2, fsdp=True)
    with pytest.raises(MegapilotError, match="writes Megatron-FSDP at PP 1 only") as info:
        render_launch(plan, MEGATRON)
    assert info.value.field == "pp"


# ---- overlaps ------------------------------------------------------------------------------------
def test_tp_comm_overlap_only_with_sp_te_nvidia_and_not_nvfp4() -> None:
    tp2 = make_plan(LLAMA31_8B, "h100", 1, TRAIN, tp=2, sequence_parallel=True)
    assert "--tp-comm-overlap" in _args(tp2)
    assert "TE userbuffers" in _reason(tp2, MEGATRON, "--tp-comm-overlap")
    assert "--tp-comm-overlap" not in _args(make_plan(LLAMA31_8B, "h100", 1, TRAIN, tp=2))  # no SP
    assert "--tp-comm-overlap" not in _args(make_plan(LLAMA31_8B, "h100", 1, TRAIN))  # TP 1
    assert "--tp-comm-overlap" not in _args(make_plan(LLAMA31_8B, "mi300x", 1, TRAIN, tp=2, sequence_parallel=True))
    nvfp4 = make_plan(LLAMA31_8B, "b200", 1, TRAIN.model_copy(update={"precision": "nvfp4"}), tp=2,
                      sequence_parallel=True)
    assert "--tp-comm-overlap" not in _args(nvfp4)
    assert "--tp-comm-overlap" not in _args(tp2, EMBEDDED_GPU)


def test_param_gather_overlaps_the_optimizer_step_only_with_vpp_and_no_checkpoints() -> None:
    vpp = make_plan(LLAMA31_8B, "h100", 1, TRAIN, pp=2, vpp=2)
    args = _args(vpp)
    assert "--overlap-param-gather-with-optimizer-step" in args and _value(args, "--ckpt-format") == "torch"
    saving = _args(vpp, MEGATRON.model_copy(update={"save": "/ckpt"}))
    assert "--overlap-param-gather-with-optimizer-step" not in saving and _value(saving,
                                                                                 "--ckpt-format") == "torch_dist"
    assert "--overlap-param-gather-with-optimizer-step" not in _args(make_plan(LLAMA31_8B, "h100", 1, TRAIN, pp=2))
    no_dist_opt = make_plan(LLAMA31_8B, "h100", 1, TRAIN, pp=2, vpp=2, distributed_optimizer=False)
    assert "--overlap-param-gather-with-optimizer-step" not in _args(no_dist_opt)


@pytest.mark.parametrize("precision", ["mxfp8", "nvfp4"])
def test_the_block_scaled_formats_gather_their_weights_outside_the_optimizer_step(precision: str) -> None:
    """MXFP8's weight gather reuses the gradient buffer, refilled only after the step zeroes it: Megatron-Bridge's
    recipes leave the optimizer-step overlap off for MXFP8 and NVFP4 (NaN grad norms), and so does the script; the
    param-gather overlap of the forward stays."""
    args = _args(make_plan(LLAMA31_8B, "b200", 1, TRAIN.model_copy(update={"precision": precision}), pp=2, vpp=2))
    assert "--overlap-param-gather-with-optimizer-step" not in args and "--overlap-param-gather" in args
    assert _value(args, "--ckpt-format") == "torch_dist"
    fp8 = _args(make_plan(LLAMA31_8B, "b200", 1, TRAIN.model_copy(update={"precision": "fp8"}), pp=2, vpp=2))
    assert "--overlap-param-gather-with-optimizer-step" in fp8


# ---- fusions, GC, precision ----------------------------------------------------------------------
def test_fused_kernels_only_where_transformer_engine_runs() -> None:
    plan = make_plan(MIXTRAL_8X7B, "h100", 1, TRAIN, ep=8, etp=1)
    gpu = _args(plan)
    assert _value(gpu, "--cross-entropy-fusion-impl") == "native" and "--cross-entropy-loss-fusion" in gpu
    assert "--no-create-attention-mask-in-dataloader" in gpu and "--moe-permute-fusion" in gpu
    dense = _args(make_plan(LLAMA31_8B, "h100", 1, TRAIN))
    assert "--moe-permute-fusion" not in dense  # no experts
    for options in (EMBEDDED_GPU, CPU):
        args = _args(plan, options)
        assert not {"--cross-entropy-loss-fusion", "--moe-permute-fusion", "--no-create-attention-mask-in-dataloader",
                    "--tp-comm-overlap", "--fp8-param-gather"} & set(args)


def test_manual_gc_on_gpus_only() -> None:
    plan = make_plan(LLAMA31_8B, "h100", 1, TRAIN)
    args = _args(plan)
    assert "--manual-gc" in args and _value(args, "--manual-gc-interval") == "100"
    assert "--manual-gc" in _args(plan, EMBEDDED_GPU)  # the embedded trainer implements it
    assert "--manual-gc" not in _args(plan, CPU)


@pytest.mark.parametrize(("gpu", "precision", "recipe", "param_gather", "reuse_grad_buf"), [
    ("h100", "fp8", "tensorwise", True, False),  # current scaling on Hopper (Bridge fp8_cs)
    ("b200", "mxfp8", "mxfp8", True, True),  # MXFP8 on Blackwell (Bridge fp8_mx)
    ("h100", "bf16", None, False, False),
])
def test_fp8_recipes_and_fp8_param_gather(gpu: str, precision: str, recipe: str | None, param_gather: bool,
                                          reuse_grad_buf: bool) -> None:
    args = _args(make_plan(LLAMA31_8B, gpu, 1, TRAIN.model_copy(update={"precision": precision})))
    assert (_value(args, "--fp8-recipe") if "--fp8-recipe" in args else None) == recipe
    assert ("--fp8-param-gather" in args) == param_gather
    assert ("--reuse-grad-buf-for-mxfp8-param-ag" in args) == reuse_grad_buf


def test_fp8_param_gather_needs_sharded_weights_and_keeps_an_explicit_delayed_recipe() -> None:
    fp8 = TRAIN.model_copy(update={"precision": "fp8"})
    assert "--fp8-param-gather" not in _args(make_plan(LLAMA31_8B, "h100", 1, fp8, distributed_optimizer=False))
    delayed = _args(make_plan(LLAMA31_8B, "h100", 1, fp8.model_copy(update={"fp8_recipe": "delayed"})))
    assert _value(delayed, "--fp8-recipe") == "delayed"


# ---- data and runtime ------------------------------------------------------------------------------
def test_data_cache_path_only_with_real_data() -> None:
    plan = make_plan(LLAMA31_8B, "h100", 1, TRAIN)
    real = LaunchOptions(data_path="/d/x_text_document", tokenizer_model="/t/tok.model", save="/ckpt/run",
                         megatron_path="/opt/Megatron-LM", check_paths_exist=False)
    assert _value(_args(plan, real), "--data-cache-path") == "/ckpt/run/data-cache"
    asked = real.model_copy(update={"data_cache_path": "/scratch/cache"})
    assert _value(_args(plan, asked), "--data-cache-path") == "/scratch/cache"
    assert "--data-cache-path" not in _args(plan)  # mock data builds no index
    assert "--data-cache-path" not in _args(plan, real.model_copy(update={"save": None}))


def test_distributed_timeout_grows_with_nodes_and_the_checkpoint_write() -> None:
    small = make_plan(LLAMA31_8B, "h100", 1, TRAIN)
    assert distributed_timeout_minutes(small, MEGATRON) == 10  # Megatron's default: one node, nothing saved
    saving = MEGATRON.model_copy(update={"save": "/ckpt"})
    # 8B x 14 B/param = 112 GB written by one node at 0.5 GB/s = 3.7 min -> 4
    assert distributed_timeout_minutes(small, saving) == 14
    big = make_plan(LLAMA31_405B, "h100", 64, TRAIN.model_copy(update={"global_batch_size": 512}), tp=8, pp=16)
    minutes = distributed_timeout_minutes(big, saving)
    assert minutes == 10 + 3 + 3  # 64 nodes: +3; 5.7 TB over 64 nodes at 0.5 GB/s: 2.9 min -> 3
    assert _value(_args(big, saving), "--distributed-timeout-minutes") == str(minutes)
    assert "--distributed-timeout-minutes" not in _args(small, CPU)


@pytest.mark.parametrize(("text", "minutes"), [
    ("04:00:00", 240), ("1-00:00:00", 1440), ("2-12", 3600), ("1-02:30", 1590), ("90", 90), ("30:30", 31),
])
def test_slurm_time_limits_in_every_sbatch_format(text: str, minutes: int) -> None:
    assert slurm_time_limit_minutes(text) == minutes


@pytest.mark.parametrize("text", ["UNLIMITED", "Infinite", "0", "00:00:00"])
def test_no_slurm_time_limit_is_none(text: str) -> None:
    assert slurm_time_limit_minutes(text) is None


def test_a_malformed_time_limit_is_refused_naming_the_field() -> None:
    with pytest.raises(MegapilotError, match="not a SLURM time limit") as info:
        slurm_time_limit_minutes("4h")
    assert info.value.field == "time_limit"


def test_exit_duration_leaves_time_to_save_before_the_slurm_limit() -> None:
    plan = make_plan(LLAMA31_8B, "h100", 1, TRAIN)
    slurm = MEGATRON.model_copy(update={"launcher": "slurm", "save": "/ckpt", "log_dir": "/logs"})
    assert exit_duration_minutes(plan, slurm) == 240 - 12  # 5 % of 4 h beats 10 min and 4 + 5 min
    args = _args(plan, slurm)
    assert _value(args, "--exit-duration-in-mins") == "228"
    assert "before the SLURM limit 04:00:00" in _reason(plan, slurm, "--exit-duration-in-mins")
    assert exit_duration_minutes(plan, slurm.model_copy(update={"time_limit": "00:15:00"})) is None  # too short
    assert exit_duration_minutes(plan, slurm.model_copy(update={"save": None})) is None  # nothing to save
    assert exit_duration_minutes(plan, slurm.model_copy(update={"launcher": "torchrun"})) is None  # no limit known


# ---- every combination still passes the checks ---------------------------------------------------
@pytest.mark.parametrize("plan", [
    make_plan(LLAMA31_8B, "h100", 1, TRAIN, tp=2, sequence_parallel=True),
    make_plan(LLAMA31_8B, "b200", 1, TRAIN.model_copy(update={"precision": "mxfp8"}), tp=2, sequence_parallel=True),
    make_plan(LLAMA31_8B, "h100", 1, TRAIN, pp=2, vpp=2),
    make_plan(LLAMA31_405B, "h100", 8, TRAIN, tp=8, sequence_parallel=True, fsdp=True),
    make_plan(DEEPSEEK_V2_LITE, "h100", 1, TRAIN, ep=8, etp=1),
    make_plan(MIXTRAL_8X7B, "mi300x", 1, TRAIN.model_copy(update={"precision": "fp8"}), tp=2, ep=4, etp=1,
              sequence_parallel=True),
], ids=["tp-overlap", "mxfp8-b200", "vpp-no-ckpt", "fsdp-405b", "mla-moe", "amd-moe-fp8"])
@pytest.mark.parametrize("launcher", ["torchrun", "slurm", "primus"])
def test_rendered_launches_pass_every_check(plan: SavedPlan, launcher: str) -> None:
    options = MEGATRON.model_copy(update={"launcher": launcher, "log_dir": "/logs", "save": "/ckpt",
                                          "primus_config_path": "/exp/run.yaml"})
    render_launch(plan, options)  # refusals are raised before any text is produced


# ---- MoE flex dispatcher (opt-in: DeepEP/HybridEP must be in the image) ---------------------------
def test_flex_dispatcher_only_when_asked_for_and_able_to_run() -> None:
    moe = make_plan(MIXTRAL_8X7B, "h100", 1, TRAIN, ep=8, etp=1)
    assert _value(_args(moe), "--moe-token-dispatcher-type") == "alltoall"
    assert "--moe-flex-dispatcher-backend" not in _args(moe)
    deepep = MEGATRON.model_copy(update={"moe_flex_dispatcher": "deepep"})
    args = _args(moe, deepep)
    assert _value(args, "--moe-token-dispatcher-type") == "flex"
    assert _value(args, "--moe-flex-dispatcher-backend") == "deepep"
    env = render_launch(moe, deepep).env
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"  # TP 1: Bridge's value with a flex backend


@pytest.mark.parametrize(("plan", "backend", "problem"), [
    (make_plan(LLAMA31_8B, "h100", 1, TRAIN), "deepep", "has no experts"),
    (make_plan(MIXTRAL_8X7B, "mi300x", 1, TRAIN, ep=8, etp=1), "deepep", "only in Megatron-LM on NVIDIA"),
    (make_plan(MIXTRAL_8X7B, "h100", 1, TRAIN.model_copy(update={"global_batch_size": 64})), "deepep",
     "needs TP x EP > 1"),
])
def test_a_flex_dispatcher_that_cannot_run_is_refused(plan: SavedPlan, backend: str, problem: str) -> None:
    with pytest.raises(MegapilotError, match=problem) as info:
        render_launch(plan, MEGATRON.model_copy(update={"moe_flex_dispatcher": backend}))
    assert info.value.field == "moe_flex_dispatcher"


def test_hybridep_spans_the_nvlink_domain() -> None:
    gb200 = make_plan(MIXTRAL_8X7B, "gb200", 2, TRAIN, ep=8, etp=1)
    hybridep = MEGATRON.model_copy(update={"moe_flex_dispatcher": "hybridep"})
    env = render_launch(gb200, hybridep).env
    assert (env["USE_MNNVL"], env["NVLINK_DOMAIN_SIZE"], env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"]) == \
        ("1", "72", "8")
    with pytest.raises(MegapilotError, match="deepep does not run on"):  # only HybridEP spans an NVL72 rack
        render_launch(gb200, hybridep.model_copy(update={"moe_flex_dispatcher": "deepep"}))
    h100 = render_launch(make_plan(MIXTRAL_8X7B, "h100", 2, TRAIN, ep=4, etp=1), hybridep).env
    assert (h100["USE_MNNVL"], h100["NVLINK_DOMAIN_SIZE"], h100["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"]) == \
        ("0", "8", "4")


def test_the_embedded_trainer_on_gpus_accepts_what_is_left_and_the_notes_say_what_is_not() -> None:
    plan = make_plan(MIXTRAL_8X7B, "h100", 1, TRAIN, tp=2, ep=4, etp=1, sequence_parallel=True)
    launch = render_launch(plan, EMBEDDED_GPU.model_copy(update={"save": "/ckpt"}))  # its own argument check runs
    assert "--manual-gc" in launch.megatron_args and "--distributed-timeout-minutes" in launch.megatron_args
    assert any("GPU kernel flags" in note and "left out" in note for note in launch.notes)


# ---- the expert all-to-all overlap (opt-in, where Megatron-Core allows it) -----------------------------------
def test_a2a_overlap_is_written_where_allowed_and_a_note_says_why_not_elsewhere() -> None:
    overlap = MEGATRON.model_copy(update={"moe_a2a_overlap": True})
    moe = make_plan(MIXTRAL_8X7B, "h100", 2, TRAIN, ep=8, etp=1, recompute="selective")
    args = _args(moe, overlap)
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" in args
    assert "--overlap-moe-expert-parallel-comm" not in _args(moe)  # off unless asked for
    recomputed = make_plan(MIXTRAL_8X7B, "h100", 2, TRAIN, ep=8, etp=1, recompute="full")
    launch = render_launch(recomputed, overlap)
    assert "--overlap-moe-expert-parallel-comm" not in launch.megatron_args
    assert any(note.startswith("--overlap-moe-expert-parallel-comm left out: it does not run with full recompute")
               for note in launch.notes)


# ---- CUDA graphs --------------------------------------------------------------------------------------------
def _graphs(impl: str, *scope: str):
    from megapilot.spec.cuda_graphs import CudaGraphs

    return CudaGraphs(impl=impl, scope=scope)  # type: ignore[arg-type]  # the Literals' words


def _graphed(graphs, **options: object) -> LaunchOptions:
    return MEGATRON.model_copy(update={"cuda_graphs": graphs, **options})


def test_cuda_graphs_are_written_in_each_releases_words_with_what_megatron_asserts_beside_them() -> None:
    moe = make_plan(MIXTRAL_8X7B, "h100", 1, TRAIN, ep=8)
    router = _graphs("transformer_engine", "attn", "moe_router", "moe_preprocess")
    newest = _args(moe, _graphed(router))  # core_v0.18.0 on: --cuda-graph-modules
    assert newest[newest.index("--cuda-graph-impl"):newest.index("--cuda-graph-impl") + 7] == [
        "--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "attn", "moe_router", "moe_preprocess",
        "--te-rng-tracker"]
    older = _args(moe, _graphed(router, megatron_version="core_v0.16.0"))
    assert older[older.index("--cuda-graph-scope") + 1:older.index("--cuda-graph-scope") + 4] == [
        "attn", "moe_router", "moe_preprocess"] and "--cuda-graph-modules" not in older
    assert "CUDA graphs" in _reason(moe, _graphed(router), "--cuda-graph-impl")
    dense = make_plan(LLAMA31_8B, "h100", 1, TRAIN)
    whole = _args(dense, _graphed(_graphs("local", "full_iteration")))
    assert _value(whole, "--cuda-graph-impl") == "full_iteration" and "--no-check-for-nan-in-loss-and-grad" in whole
    whole_16 = _args(dense, _graphed(_graphs("local", "full_iteration"), megatron_version="core_v0.16.0"))
    assert _value(whole_16, "--cuda-graph-impl") == "local"
    assert _value(whole_16, "--cuda-graph-scope") == "full_iteration"
    local_ep = _args(make_plan(MIXTRAL_8X7B, "h100", 1, TRAIN, ep=8, recompute="full"),
                     _graphed(_graphs("local", "full_iteration"), megatron_version="core_v0.16.0"))
    assert "--moe-pad-experts-for-cuda-graph-inference" in local_ep  # arguments.py asserts it with EP > 1
    assert "--cuda-graph-impl" not in _args(dense)


def test_before_core_v0_16_the_graphs_are_one_scope_word_and_recompute_is_refused_as_that_release_refuses_it():
    """core_v0.15 names the implementation by --cuda-graph-impl, core_v0.14 by --enable-cuda-graph (local) or
    --external-cuda-graph (Transformer Engine); both take one scope word (full, the default; attn; full_iteration)
    and refuse activation recompute beside graphs more widely than core_v0.16 (their TransformerConfig)."""
    plain = make_plan(LLAMA31_8B, "h100", 1, TRAIN, recompute="none")
    for release, impl_words in (("core_v0.15.0", ["--cuda-graph-impl", "local"]), ("core_v0.14.0",
                                                                                   ["--enable-cuda-graph"])):
        whole = _args(plain, _graphed(_graphs("local", "full_iteration"), megatron_version=release))
        assert whole[whole.index(impl_words[0]):whole.index(impl_words[0]) + len(impl_words) + 2] == [
            *impl_words, "--cuda-graph-scope", "full_iteration"]
        assert "--no-check-for-nan-in-loss-and-grad" in whole and "--cuda-graph-modules" not in whole
        layers = _args(plain, _graphed(_graphs("local"), megatron_version=release))
        assert "--cuda-graph-scope" not in layers  # "full" (each whole layer) is the flag's default
    attention = _graphs("transformer_engine", "attn")
    outside = make_plan(LLAMA31_8B, "h100", 1, TRAIN, recompute="selective", recompute_modules=("layernorm",))
    v15 = _args(outside, _graphed(attention, megatron_version="core_v0.15.0"))
    assert _value(v15, "--cuda-graph-impl") == "transformer_engine" and _value(v15, "--cuda-graph-scope") == "attn"
    v14 = _args(outside, _graphed(attention, megatron_version="core_v0.14.0"))
    assert "--external-cuda-graph" in v14 and _value(v14, "--cuda-graph-scope") == "attn"
    refused = {  # (graphs, plan, release) -> words of the refusal
        (_graphs("transformer_engine", "attn", "mlp"), "none", "core_v0.15.0"): "one word",
        (_graphs("local", "attn"), "none", "core_v0.15.0"): "transformer_engine only",
        (_graphs("local"), "selective", "core_v0.15.0"): "activation recompute",
        (_graphs("local"), "selective", "core_v0.14.0"): "without activation recompute",
        (_graphs("local", "full_iteration"), "full", "core_v0.15.0"): "activation recompute",
    }
    for (graphs, recompute, release), words in refused.items():
        with pytest.raises(MegapilotError) as err:
            _args(make_plan(LLAMA31_8B, "h100", 1, TRAIN, recompute=recompute),
                  _graphed(graphs, megatron_version=release))
        assert err.value.field == "megatron_version" and words in err.value.problem, err.value.problem


def test_the_moe_graph_scope_beside_the_expert_all_to_all_overlap_is_refused_as_megatron_asserts() -> None:
    """Megatron-Core (core_v0.16 on): 'CUDA graph scope on moe and mlp is not supported with
    overlap_moe_expert_parallel_comm'; the script had written both, a launch that stops before its first step."""
    assert MIXTRAL_8X7B.moe is not None
    padded = MIXTRAL_8X7B.model_copy(update={"moe": MIXTRAL_8X7B.moe.model_copy(
        update={"capacity_factor": 1.0, "pad_to_capacity": True})})
    moe = make_plan(padded, "h100", 1, TRAIN, ep=8)
    graphs = _graphs("transformer_engine", "attn", "moe")
    assert "--cuda-graph-impl" in _args(moe, _graphed(graphs))  # alone, on token drop padded to capacity
    with pytest.raises(MegapilotError) as refused:
        _args(moe, _graphed(graphs, moe_a2a_overlap=True))
    assert refused.value.field == "cuda_graph_scope" and "expert all-to-all overlap" in refused.value.problem


def test_cuda_graphs_megatron_refuses_or_a_release_cannot_say_are_refused_and_a_cpu_run_leaves_them_out() -> None:
    dense = make_plan(LLAMA31_8B, "h100", 1, TRAIN, recompute="full")
    with pytest.raises(MegapilotError) as refused:
        _args(dense, _graphed(_graphs("transformer_engine", "attn")))
    assert refused.value.field == "cuda_graph_scope" and "full_iteration graph" in refused.value.problem
    with pytest.raises(MegapilotError) as old:  # core_v0.15: attention recomputed inside the attention graph
        _args(make_plan(LLAMA31_8B, "h100", 1, TRAIN), _graphed(_graphs("transformer_engine", "attn"),
                                                                megatron_version="core_v0.15.0"))
    assert old.value.field == "megatron_version" and "core_v0.16.0" in (old.value.fix or "")
    assert "core_attn recompute" in old.value.problem
    tiny = make_plan(LLAMA31_8B, "h100", 1, TRAIN)
    cpu = CPU.model_copy(update={"cuda_graphs": _graphs("transformer_engine", "attn")})
    launch = render_launch(tiny.model_copy(update={"model": tiny.model}), cpu)
    assert "--cuda-graph-impl" not in launch.script
    assert any(note.startswith("--cuda-graph-impl left out") for note in launch.notes)
