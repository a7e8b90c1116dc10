"""Each pre-write check fires with a MegapilotError naming the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.launch import (
    LaunchOptions,
    check_megatron_args,
    render_launch,
    render_megatron_args,
)
from megapilot.launch.checks import (
    check_absolute_path,
    check_environment,
    check_no_placeholder,
    combination_refusals,
)
from megapilot.launch.megatron_args import flag_table
from megapilot.spec import TrainingSpec
from tests.launch.plans import GOLDEN_PLANS, LLAMA31_8B, make_plan

PLAN_70B = GOLDEN_PLANS["llama3.3-70b_8nodes"]
PLAN_8B = GOLDEN_PLANS["llama3.1-8b_1node"]
H100 = get_gpu("h100")
MOCK = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False)


def _base_args() -> list[str]:
    return render_megatron_args(PLAN_70B, MOCK)


def _without(args: list[str], *flags: str) -> list[str]:
    out, skip = [], False
    for token in args:
        if token.startswith("--"):
            skip = token in flags
        if not skip:
            out.append(token)
    return out


def _with_value(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return args[: i + 1] + [value] + args[i + 2:]


def test_rendered_arguments_pass_all_checks() -> None:
    check_megatron_args(_base_args(), H100)


@pytest.mark.parametrize(("mutate", "field", "problem"), [
    (lambda a: _with_value(a, "--tensor-model-parallel-size", "1"), "sequence_parallel", "needs --tensor-model"),
    (lambda a: _with_value(a, "--pipeline-model-parallel-size", "1") + ["--num-layers-per-virtual-pipeline-stage", "5"],
     "vpp", "need --pipeline-model-parallel-size > 1"),
    (lambda a: _without(a, "--use-distributed-optimizer"), "overlap_param_gather", "needs --use-distributed"),
    (lambda a: _without(a, "--overlap-grad-reduce"), "overlap_param_gather", "needs --overlap-grad-reduce"),
    (lambda a: _with_value(a, "--transformer-impl", "local") + ["--fp8-format", "hybrid"], "precision",
     "needs Transformer Engine"),
    (lambda a: a + ["--kv-lora-rank", "512"], "mla", "without --multi-latent-attention"),
    (lambda a: _without(a, "--num-query-groups"), "num_query_groups", "needs --num-query-groups"),
    (lambda a: a + ["--recompute-method", "uniform"], "recompute", "need --recompute-granularity full"),
    (lambda a: a + ["--data-path", "/d/x"], "data_path", "exactly one of"),
    (lambda a: _without(a, "--mock-data"), "data_path", "exactly one of"),
    (lambda a: a + ["--bf16"], "megatron_args", "given twice"),
    (lambda a: a + ["--moe-grouped-gemm"], "moe", "without --num-experts"),
    (lambda a: a + ["--no-such-flag"], "megatron_args",
     "not a flag of Megatron-LM core_v0.19.0"),  # the newest table, the default
    (lambda a: a + ["--save", "/path/to/ckpt"], "--save", "placeholder"),
    (lambda a: _with_value(a, "--max-position-embeddings", "4096"), "seq_length", "exceeds --max-position"),
    (lambda a: _with_value(a, "--min-lr", "0.1"), "min_lr", "above --lr"),
    (lambda a: _with_value(a, "--position-embedding-type", "learned_absolute") + ["--mtp-num-layers", "1"],
     "mtp_num_layers", "needs rope"),
    (lambda a: a + ["--expert-model-parallel-size", "4"], "ep", "divisible"),
    # Megatron-FSDP and its companions
    (lambda a: _with_value(a, "--ckpt-format", "fsdp_dtensor"), "ckpt_format", "only for Megatron-FSDP"),
    (lambda a: a + ["--use-megatron-fsdp"], "ckpt_format", "saves only fsdp_dtensor checkpoints, not torch_dist"),
    (lambda a: _without(_with_value(a, "--ckpt-format", "fsdp_dtensor"), "--use-distributed-optimizer")
     + ["--use-megatron-fsdp"], "fsdp", "needs --use-distributed-optimizer"),
    (lambda a: _with_value(a, "--ckpt-format", "fsdp_dtensor") + ["--use-megatron-fsdp"], "pp",
     "writes Megatron-FSDP at PP 1 only"),
    (lambda a: _with_value(_with_value(a, "--ckpt-format", "fsdp_dtensor"), "--pipeline-model-parallel-size", "1")
     + ["--use-megatron-fsdp", "--use-torch-fsdp2"], "fsdp", "exclude each other"),
    # overlaps and fused kernels
    (lambda a: a + ["--overlap-param-gather-with-optimizer-step"], "vpp", "needs interleaved pipeline"),
    (lambda a: a + ["--overlap-param-gather-with-optimizer-step", "--num-layers-per-virtual-pipeline-stage", "10"],
     "ckpt_format", "does not work with distributed checkpoints"),
    (lambda a: _without(a, "--overlap-param-gather") + ["--overlap-param-gather-with-optimizer-step"],
     "overlap_param_gather", "needs --overlap-param-gather"),
    (lambda a: _without(a, "--sequence-parallel"), "tp_comm_overlap", "needs --sequence-parallel"),
    (lambda a: _with_value(_with_value(a, "--transformer-impl", "local"), "--cross-entropy-fusion-impl", "te")
     + ["--moe-permute-fusion"], "transformer_impl",
     "--tp-comm-overlap, --moe-permute-fusion, --cross-entropy-fusion-impl need Transformer Engine"),
    (lambda a: a + ["--fp8-param-gather"], "fp8_param_gather", "without FP8 training"),
    (lambda a: _without(a, "--use-distributed-optimizer", "--overlap-param-gather") + ["--fp8-param-gather"],
     "fp8_param_gather", "needs the distributed optimizer or Megatron-FSDP"),
    (lambda a: a + ["--fp8-format", "hybrid", "--reuse-grad-buf-for-mxfp8-param-ag"], "fp8_param_gather",
     "needs --fp8-param-gather"),
    (lambda a: a + ["--moe-flex-dispatcher-backend", "deepep"], "moe_flex_dispatcher",
     "has no effect with the allgather"),
    (lambda a: _without(_with_value(a, "--tensor-model-parallel-size", "1"), "--sequence-parallel", "--tp-comm-overlap")
     + ["--moe-token-dispatcher-type", "flex"],
     "moe_flex_dispatcher", "needs TP x EP > 1"),
    (lambda a: a + ["--moe-token-dispatcher-type", "flex", "--moe-expert-capacity-factor", "1.0",
                    "--moe-pad-expert-input-to-capacity"], "moe_flex_dispatcher", "does not pad expert inputs"),
    (lambda a: a + ["--attention-backend", "local"], "attention_backend", "only with --spec local"),
    (lambda a: _with_value(a, "--context-parallel-size", "2") + ["--attention-backend", "unfused"],
     "attention_backend", "runs only in TE's flash or fused attention"),
    # the expert all-to-all overlap: Megatron-Core's TransformerConfig rules
    (lambda a: a + ["--delay-wgrad-compute"], "moe_a2a_overlap", "needs --overlap-moe-expert-parallel-comm"),
    (lambda a: a + ["--overlap-moe-expert-parallel-comm"], "moe_a2a_overlap", "needs expert parallelism"),
    (lambda a: a + ["--overlap-moe-expert-parallel-comm", "--num-experts", "8", "--expert-model-parallel-size", "2",
                    "--recompute-granularity", "full"], "moe_a2a_overlap", "does not run with full recompute"),
    # Muon: plain DDP only, and plain muon overlaps nothing
    (lambda a: a + ["--optimizer", "dist_muon"], "optimizer", "does not run with --use-distributed-optimizer"),
    (lambda a: _without(a, "--use-distributed-optimizer", "--overlap-param-gather") + ["--optimizer", "muon"],
     "optimizer", "does not support --overlap-grad-reduce"),
    # how the model splits over the parallel sizes
    (lambda a: _with_value(a, "--pipeline-model-parallel-size", "3"), "pp", "do not split evenly over PP=3"),
    (lambda a: a + ["--num-layers-per-virtual-pipeline-stage", "3"], "vpp", "do not split into chunks of 3"),
    (lambda a: _with_value(a, "--num-attention-heads", "60"), "tp", "60 attention heads do not split over TP=8"),
    (lambda a: _with_value(a, "--num-query-groups", "12"), "tp",
     "12 query groups are neither a multiple nor a divisor of TP=8"),
    (lambda a: _with_value(a, "--context-parallel-size", "3"), "seq_length", "not a multiple of 2 x CP = 6"),
])
def test_flag_combination_rules_fire(mutate, field: str, problem: str) -> None:
    with pytest.raises(MegapilotError, match=problem) as info:
        check_megatron_args(mutate(_base_args()), H100)
    assert info.value.field == field and info.value.fix


def test_tp_with_ep_without_sequence_parallel_is_refused_only_where_megatron_raised_on_it() -> None:
    args = _without(_base_args(), "--sequence-parallel", "--tp-comm-overlap") + [
        "--num-experts", "8", "--expert-model-parallel-size", "2"]
    with pytest.raises(MegapilotError, match=r"needs sequence parallelism before Megatron-LM core_v0\.15") as info:
        check_megatron_args(args, H100, flag_table("core_v0.14.0"))
    assert info.value.field == "sequence_parallel"
    check_megatron_args(args, H100, flag_table("core_v0.16.0"))  # core_v0.15 on: a warning, not an error


def test_tp_above_the_query_groups_is_refused_only_before_megatron_core_0_16() -> None:
    args = _with_value(_base_args(), "--num-query-groups", "4")  # TP 8: each KV head serves two ranks
    with pytest.raises(MegapilotError, match="4 query groups do not split over TP=8"):
        check_megatron_args(args, H100, flag_table("core_v0.14.0"))
    check_megatron_args(args, H100, flag_table("core_v0.16.0"))


def test_full_recompute_of_a_hybrid_is_refused_before_megatron_core_0_18_whose_mamba_stack_ignores_it() -> None:
    """core 0.18's HybridStack recomputes whole layers (#4496); 0.16 and 0.17's MambaStack never reads the flag."""
    hybrid = _base_args() + ["--hybrid-override-pattern", "M-M*" * 20]
    full = hybrid + ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    with pytest.raises(MegapilotError, match="MambaStack ignores it") as info:
        check_megatron_args(full, H100, flag_table("core_v0.17.0"))
    assert info.value.field == "recompute" and info.value.fix
    check_megatron_args(full, H100, flag_table("core_v0.18.0"))
    check_megatron_args(hybrid + ["--recompute-granularity", "selective"], H100, flag_table("core_v0.17.0"))


def test_attention_sinks_run_under_cp_only_on_the_a2a_path() -> None:
    """Transformer Engine 2.8-2.11: a sink under CP has FusedAttention only with cp_comm_type a2a."""
    sinks = _base_args() + ["--softmax-type", "learnable"]
    check_megatron_args(sinks, H100)
    cp2 = _with_value(sinks, "--context-parallel-size", "2")
    with pytest.raises(MegapilotError, match="only with --cp-comm-type a2a, not p2p") as info:
        check_megatron_args(cp2, H100)
    assert info.value.field == "cp" and info.value.fix
    tp4 = _with_value(cp2, "--tensor-model-parallel-size", "4")  # 16 heads and 2 KV heads per TP rank
    check_megatron_args(tp4 + ["--cp-comm-type", "a2a"], H100)


def test_a2a_context_parallelism_needs_whole_heads_per_cp_rank_and_no_mla() -> None:
    """TE's AttnFuncWithCPAndQKVOA2A asserts a TP rank's query and KV heads divide by CP; MLA takes no a2a."""
    cp2 = _with_value(_base_args(), "--context-parallel-size", "2") + ["--cp-comm-type", "a2a"]
    with pytest.raises(MegapilotError, match="8 attention heads and 1 KV heads of a TP rank") as info:
        check_megatron_args(cp2, H100)  # 64 heads, 8 KV heads over TP 8
    assert info.value.field == "cp" and info.value.fix.endswith("or --cp-comm-type p2p")
    check_megatron_args(_with_value(cp2, "--tensor-model-parallel-size", "4"), H100)
    check_megatron_args(_with_value(_base_args(), "--context-parallel-size", "2"), H100)  # the ring takes TP 8
    mla = render_megatron_args(GOLDEN_PLANS["deepseek-v2-lite_mla"], MOCK)
    with pytest.raises(MegapilotError, match="MLA") as info:
        check_megatron_args(_with_value(mla, "--context-parallel-size", "2") + ["--cp-comm-type", "a2a"], H100)
    assert info.value.field == "cp_comm_type"


def test_a_hand_written_hybrids_mamba_heads_and_groups_split_over_tp_and_cp() -> None:
    """MambaMixer / MambaContextParallel asserts, from the flags (TP 8 on the 8192-wide base: 256 heads of 64)."""
    hybrid = _base_args() + ["--hybrid-override-pattern", "M-M*" * 20]
    check_megatron_args(hybrid, H100)  # 8 groups: one per TP rank
    with pytest.raises(MegapilotError, match="256 heads and 4 groups") as info:
        check_megatron_args(hybrid + ["--mamba-num-groups", "4"], H100)
    assert info.value.field == "tp" and info.value.fix == "use a TP from: 1, 2, 4"
    with pytest.raises(MegapilotError, match="does not divide the 3 Mamba-2 heads of a TP rank") as info:
        check_megatron_args(_with_value(hybrid, "--context-parallel-size", "2") + ["--mamba-num-heads", "24"], H100)
    assert info.value.field == "cp"


def test_a_hybrid_pattern_takes_only_the_split_flags_its_release_places() -> None:
    """Megatron places a hybrid's split by the pattern's | segments (core 0.17 on) or first/last counts (0.16.1 on);
    the virtual-pipeline, layout and account-for flags never go beside the pattern (asserted, or ignored)."""
    hybrid = _base_args() + ["--hybrid-override-pattern", "M-M*" * 20]  # PP 2, 80 layers
    check_megatron_args(hybrid, H100)
    with pytest.raises(MegapilotError, match="beside a hybrid's layer pattern") as info:
        check_megatron_args(hybrid + ["--num-layers-per-virtual-pipeline-stage", "5"], H100)
    assert info.value.field == "vpp" and "--hybrid-layer-pattern" in (info.value.fix or "")
    ends = ["--decoder-first-pipeline-num-layers", "44", "--decoder-last-pipeline-num-layers", "36"]
    check_megatron_args(hybrid + ends, H100, flag_table("core_v0.16.0"))  # 0.16.1's stack places them
    with pytest.raises(MegapilotError, match="splits a hybrid evenly whatever they say") as info:
        check_megatron_args(hybrid + ends, H100, flag_table("core_v0.15.0"))
    assert info.value.field == "pp"
    segmented = _base_args() + ["--hybrid-layer-pattern", "|".join(["M-M*" * 5] * 4)]  # PP 2 x VPP 2
    check_megatron_args(segmented, H100, flag_table("core_v0.17.0"))
    with pytest.raises(MegapilotError, match="invalid layer symbol") as info:
        check_megatron_args(_base_args() + ["--hybrid-override-pattern", "|".join(["M-M*" * 10] * 2)], H100,
                            flag_table("core_v0.16.0"))
    assert info.value.field == "megatron_version"
    with pytest.raises(MegapilotError, match="beside \\| segments"):
        check_megatron_args(segmented + ends, H100)
    with pytest.raises(MegapilotError, match="3 \\| segments do not divide over PP=2"):
        check_megatron_args(_base_args() + ["--hybrid-layer-pattern", "M-M*" * 6 + "|" + "M-M*" * 6 + "|"
                                            + "M-M*" * 8], H100)


def test_fp8_refused_on_hardware_without_it() -> None:
    args = render_megatron_args(PLAN_8B, MOCK)
    with pytest.raises(MegapilotError, match=r"fp8 is not supported on A100.*needs FP8 tensor cores") as info:
        check_megatron_args(args, get_gpu("a100"))
    assert info.value.field == "precision"


def test_fp8_plan_on_ampere_is_refused_before_rendering() -> None:
    plan = make_plan(LLAMA31_8B, "a100", 1, TrainingSpec(seq_length=4096, global_batch_size=64, precision="bf16"))
    fp8 = plan.model_copy(update={"training": plan.training.model_copy(update={"precision": "fp8"})})
    with pytest.raises(MegapilotError, match="fp8 is not supported on A100") as info:
        render_launch(fp8, MOCK)
    assert info.value.field == "precision"


def test_world_size_must_match_nodes_times_gpus() -> None:
    with pytest.raises(MegapilotError,
                       match="TP\\*PP\\*CP\\*DP = 1\\*1\\*1\\*8 = 8 but the launch starts 2 nodes") as info:
        render_launch(PLAN_8B, MOCK.model_copy(update={"nodes": 2}))
    assert info.value.field == "nodes"


@pytest.mark.parametrize("value", ["/path/to/data", "<changeme>", "/data/<your dataset>", "TODO", "/x/FIXME/y"])
def test_placeholders_are_refused(value: str) -> None:
    with pytest.raises(MegapilotError, match="placeholder"):
        check_no_placeholder("data_path", value)


@pytest.mark.parametrize("field", ["data_path", "save", "megatron_path", "vocab_file", "log_dir", "load"])
def test_relative_paths_are_refused(field: str) -> None:
    update = {field: "relative/dir"}
    if field == "vocab_file":
        update["merge_file"] = "/abs/merges.txt"
    if field == "data_path":
        update["mock_data"] = False
        update["tokenizer_model"] = "meta-llama/Llama-3.1-8B"
    with pytest.raises(MegapilotError, match="not an absolute path") as info:
        render_launch(PLAN_8B, MOCK.model_copy(update=update))
    assert info.value.field == field


def test_placeholder_in_an_option_is_refused_before_writing() -> None:
    with pytest.raises(MegapilotError, match="placeholder") as info:
        render_launch(PLAN_8B, MOCK.model_copy(update={"save": "/path/to/checkpoints"}))
    assert info.value.field == "save"


def test_local_launch_requires_existing_inputs(tmp_path: Path) -> None:
    megatron = tmp_path / "Megatron-LM"
    megatron.mkdir()
    local = LaunchOptions(data_path=str(tmp_path / "corpus_text_document"), tokenizer_model=str(tmp_path / "tok"),
                          megatron_path=str(megatron), save=str(tmp_path / "ckpt"))
    with pytest.raises(MegapilotError, match="dataset files missing") as info:
        render_launch(PLAN_8B, local)
    assert info.value.field == "data_path"
    for suffix in (".bin", ".idx"):
        (tmp_path / f"corpus_text_document{suffix}").write_bytes(b"")
    with pytest.raises(MegapilotError, match="does not exist") as info:
        render_launch(PLAN_8B, local)
    assert info.value.field == "tokenizer_model"
    (tmp_path / "tok").mkdir()
    with pytest.raises(MegapilotError, match=r"pretrain_gpt\.py does not exist") as info:
        render_launch(PLAN_8B, local)
    assert info.value.field == "megatron_path"
    (megatron / "pretrain_gpt.py").write_text("")
    assert render_launch(PLAN_8B, local).megatron_args  # all present now
    with pytest.raises(MegapilotError, match="does not exist") as info:
        render_launch(PLAN_8B, local.model_copy(update={"save": str(tmp_path / "missing" / "ckpt")}))
    assert info.value.field == "save"


def test_multi_node_launch_does_not_require_paths_on_this_machine() -> None:
    remote = LaunchOptions(launcher="slurm", data_path="/lustre/d_text_document", tokenizer_model="/lustre/tok",
                           megatron_path="/opt/Megatron-LM", save="/lustre/ckpt", log_dir="/lustre/logs")
    assert render_launch(PLAN_70B, remote).nodes == 8


def test_check_absolute_path_accepts_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("x")
    check_absolute_path("vocab_file", str(target), must_exist=True, kind="file")


@pytest.mark.parametrize(("gpu", "args_change", "env", "problem"), [
    ("h100", [], {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, "needs CUDA_DEVICE_MAX_CONNECTIONS=1"),
    ("mi300x", [], {}, "needs CUDA_DEVICE_MAX_CONNECTIONS=1 .got unset."),
    ("h100", ["--use-megatron-fsdp"], {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, "refuses CUDA_DEVICE_MAX_CONNECTIONS=1"),
])
def test_environment_must_match_megatrons_device_connection_asserts(
        gpu: str, args_change: list[str], env: dict[str, str | None], problem: str) -> None:
    with pytest.raises(MegapilotError, match=problem) as info:
        check_environment(_base_args() + args_change, env, get_gpu(gpu))
    assert info.value.field == "env"


def test_environment_rules_accept_what_megatron_accepts() -> None:
    check_environment(_base_args(), {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, H100)
    check_environment(_base_args(), {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}, get_gpu("b200"))  # no rule on Blackwell
    check_environment(_base_args() + ["--use-megatron-fsdp"], {"CUDA_DEVICE_MAX_CONNECTIONS": None}, H100)
    check_environment(_base_args(), {}, H100, cpu=True)  # nothing to order on CPUs


def test_a_sliding_window_runs_under_cp_only_off_the_p2p_ring() -> None:
    """Transformer Engine 2.8-2.11 asserts a sliding window under CP runs with cp_comm_type a2a or all_gather."""
    windowed = _with_value(_base_args(), "--tensor-model-parallel-size", "4") + ["--window-size", "4095,0"]
    check_megatron_args(windowed, H100)
    cp2 = _with_value(windowed, "--context-parallel-size", "2")
    with pytest.raises(MegapilotError, match=r"sliding window .* only with --cp-comm-type a2a or all_gather") as info:
        check_megatron_args(cp2, H100)
    assert info.value.field == "cp" and info.value.fix
    check_megatron_args(cp2 + ["--cp-comm-type", "a2a"], H100)
    check_megatron_args(_with_value(_base_args(), "--context-parallel-size", "2"), H100)  # no window: the ring


def test_combination_refusals_asks_every_rule_not_the_first_only() -> None:
    values = {"--sequence-parallel": [], "--tensor-model-parallel-size": ["1"],  # SP without TP
              "--overlap-param-gather-with-optimizer-step": [], "--use-distributed-optimizer": []}  # no param gather
    problems = [exc.problem for exc in combination_refusals(values, H100)]
    assert "--sequence-parallel needs --tensor-model-parallel-size > 1" in problems
    assert "--overlap-param-gather-with-optimizer-step needs --overlap-param-gather" in problems
    assert "pass exactly one of --data-path and --mock-data" in problems
    rendered = {name: vals for name, vals in flag_table().split_args(_base_args())}
    assert combination_refusals(rendered, H100) == []
