"""Flag combinations judged before any process starts (torch-free, fast)."""

from __future__ import annotations

import pytest

from megapilot.errors import MegapilotError
from megapilot.trainer.config import build_config

TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--train-iters", "10", "--lr", "1e-3", "--micro-batch-size", "2", "--global-batch-size", "8", "--mock-data"]


def test_defaults_follow_megatron_lm():
    config = build_config(TINY)
    assert config.ffn_hidden_size == 4 * 64
    assert config.num_query_groups == 4  # no GQA: one group per head
    assert config.max_position_embeddings == 64
    assert config.lr_decay_iters == 10
    assert config.expert_tensor_parallel_size == config.tensor_model_parallel_size == 1
    assert config.tokenizer_type == "NullTokenizer"


@pytest.mark.parametrize(("extra", "fp32"), [
    ([], False),  # fp32 training: the gradients are fp32 anyway, no accumulation switch needed
    (["--bf16"], True),  # Megatron-LM's validate_args turns fp32 gradients on for bf16
    (["--bf16", "--grad-reduce-in-bf16"], False),
    (["--bf16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"], False),  # bf16 wins there too
    (["--fp16"], False),
    (["--fp16", "--accumulate-allreduce-grads-in-fp32"], True),
])
def test_gradient_precision_follows_megatron_lm(extra, fp32):
    assert build_config(TINY + extra).accumulate_allreduce_grads_in_fp32 is fp32


def test_parallel_sizes_carry_the_layout_flags_under_megatron_core_keyword_names():
    config = build_config(TINY + ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                  "--num-layers-per-virtual-pipeline-stage", "1", "--expert-model-parallel-size", "2",
                                  "--num-experts", "4"])
    assert config.parallel_sizes() == {
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
        "context_parallel_size": 1, "expert_model_parallel_size": 2, "expert_tensor_parallel_size": 2,
    }


def test_gqa_groups_only_with_the_gqa_switch():
    assert build_config(TINY + ["--num-query-groups", "2"]).num_query_groups == 4
    assert build_config(TINY + ["--group-query-attention", "--num-query-groups", "2"]).num_query_groups == 2


def test_virtual_stages_derive_from_layers_per_virtual_stage():
    config = build_config(TINY + ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                                  "1"])
    assert config.virtual_pipeline_model_parallel_size == 2


def test_virtual_stages_without_pipeline_are_refused():
    with pytest.raises(MegapilotError) as err:
        build_config(TINY + ["--num-layers-per-virtual-pipeline-stage", "1"])
    assert err.value.field == "--num-layers-per-virtual-pipeline-stage"


def test_context_parallel_on_cpu_needs_a_gpu():
    with pytest.raises(MegapilotError, match="needs a GPU") as err:
        build_config(TINY + ["--context-parallel-size", "2"], gpu_available=False)
    assert err.value.field == "--context-parallel-size"
    assert build_config(TINY + ["--context-parallel-size", "2"], gpu_available=True).context_parallel_size == 2


def test_sequence_parallel_on_cpu_needs_a_gpu():
    with pytest.raises(MegapilotError, match="needs a GPU") as err:
        build_config(TINY + ["--tensor-model-parallel-size", "2", "--sequence-parallel"])
    assert err.value.field == "--sequence-parallel"


def test_alltoall_dispatcher_on_cpu_needs_a_gpu():
    with pytest.raises(MegapilotError, match="needs a GPU"):
        build_config(TINY + ["--num-experts", "4", "--moe-token-dispatcher-type", "alltoall"])


@pytest.mark.parametrize(("extra", "field"), [
    (["--data-path", "/x"], "--data-path"),  # two data sources
    (["--save-interval", "5"], "--save-interval"),  # nowhere to save
    (["--bf16", "--fp16"], "--fp16"),
    (["--num-attention-heads", "5"], "--num-attention-heads"),
    (["--tokenizer-type", "GPT2BPETokenizer", "--data-path", "/x"], "--data-path"),
])
def test_inconsistent_flags_are_refused_with_the_field(extra, field):
    with pytest.raises(MegapilotError) as err:
        build_config(TINY + extra)
    assert err.value.field == field


def test_null_tokenizer_reads_pretokenized_data_given_its_vocabulary():
    argv = [a for a in TINY if a != "--mock-data"] + ["--data-path", "/d/ids", "--tokenizer-type", "NullTokenizer"]
    with pytest.raises(MegapilotError) as err:
        build_config(argv)
    assert err.value.field == "--vocab-size"
    assert build_config(argv + ["--vocab-size", "1000"]).tokenizer_type == "NullTokenizer"


def test_missing_required_flag_is_named():
    argv = [a for a in TINY if a not in ("--lr", "1e-3")]
    with pytest.raises(MegapilotError) as err:
        build_config(argv)
    assert err.value.field == "--lr"


def test_world_size_must_tile_the_layout_and_the_batch():
    config = build_config(TINY + ["--tensor-model-parallel-size", "2"])
    config.check_world_size(4)
    assert config.data_parallel_size(4) == 2 and config.num_microbatches(4) == 2
    with pytest.raises(MegapilotError, match="not divisible by TP"):
        config.check_world_size(3)
    with pytest.raises(MegapilotError, match="global batch") as err:
        build_config(TINY + ["--global-batch-size", "6"]).check_world_size(2)
    assert err.value.field == "--global-batch-size"


def test_uneven_pipeline_split_reaches_the_config():
    config = build_config(TINY[:1] + ["3"] + TINY[2:] + [
        "--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1",
        "--decoder-last-pipeline-num-layers", "2"])
    assert (config.decoder_first_pipeline_num_layers, config.decoder_last_pipeline_num_layers) == (1, 2)


def test_uneven_split_with_interleaving_takes_megatron_lms_virtual_stage_flag():
    # 10 layers, PP4 x VPP2: 2 on each end rank leaves 6 for 2 middle ranks, 3 each: not a multiple of VPP.
    flags = TINY[:1] + ["10"] + TINY[2:] + ["--pipeline-model-parallel-size", "4",
                                            "--decoder-first-pipeline-num-layers", "2",
                                            "--decoder-last-pipeline-num-layers", "2"]
    with pytest.raises(MegapilotError, match="middle") as err:
        build_config(flags + ["--num-virtual-stages-per-pipeline-rank", "2"])
    assert err.value.field == "--decoder-first-pipeline-num-layers"
    with pytest.raises(MegapilotError) as err:
        build_config(flags + ["--num-layers-per-virtual-pipeline-stage", "1"])
    assert err.value.field == "--num-layers-per-virtual-pipeline-stage"
    flags[1] = "12"  # 8 left, 4 per middle rank, 2 per chunk
    assert build_config(flags + ["--num-virtual-stages-per-pipeline-rank",
                                 "2"]).virtual_pipeline_model_parallel_size == 2


def test_uneven_split_megatron_refuses_is_named_by_flag():
    with pytest.raises(MegapilotError, match="middle") as err:  # 4 layers, PP2: 1 + 2 leaves one with no rank
        build_config(TINY + ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1",
                             "--decoder-last-pipeline-num-layers", "2"])
    assert err.value.field == "--decoder-first-pipeline-num-layers"



# ---- model semantics: rope scaling, MLA, MTP, routing, windows -----------------------------------------------
MOE = ["--num-experts", "8", "--moe-router-topk", "4", "--moe-ffn-hidden-size", "32"]


def test_model_semantics_flags_reach_the_config():
    config = build_config(TINY + MOE + [
        "--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank", "16", "--rope-type", "yarn",
        "--rotary-scaling-factor", "40", "--mscale-all-dim", "1.0", "--mtp-num-layers", "1",
        "--mtp-loss-scaling-factor", "0.3", "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias", "--moe-router-num-groups", "4", "--moe-router-group-topk", "2",
        "--moe-router-topk-scaling-factor", "2.5", "--moe-layer-freq", "([0]*1+[1]*3)", "--window-size", "(31,0)"])
    assert config.multi_latent_attention and (config.q_lora_rank, config.kv_lora_rank) == (32, 16)
    assert (config.rope_type, config.rotary_scaling_factor, config.mscale_all_dim) == ("yarn", 40.0, 1.0)
    assert (config.mtp_num_layers, config.mtp_loss_scaling_factor) == (1, 0.3)
    assert config.moe_layer_freq == (0, 1, 1, 1) and config.window_size == (31, 0)
    assert (config.moe_router_num_groups, config.moe_router_group_topk, config.moe_router_topk_scaling_factor) == (
        4, 2, 2.5)


@pytest.mark.parametrize(("extra", "field"), [
    (MOE + ["--moe-router-enable-expert-bias"], "--moe-router-enable-expert-bias"),  # needs sigmoid
    (MOE + ["--moe-router-num-groups", "4"], "--moe-router-group-topk"),
    (MOE + ["--moe-router-num-groups", "3", "--moe-router-group-topk", "1"], "--moe-router-num-groups"),
    (["--rope-type", "yarn"], "--rope-type"),  # YaRN is built for MLA only
    (MOE + ["--moe-layer-freq", "([0]*1+[1]*2)"], "--moe-layer-freq"),  # 3 entries for 4 layers
    (MOE + ["--moe-layer-freq", "__import__('os')"], "--moe-layer-freq"),
    (["--window-size", "31"], "--window-size"),
    (["--swiglu", "--squared-relu"], "--squared-relu"),
])
def test_model_semantics_megatron_would_refuse_are_named_by_flag(extra, field):
    with pytest.raises(MegapilotError) as err:
        build_config(TINY + extra)
    assert err.value.field == field
