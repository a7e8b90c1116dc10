"""The trainer's Megatron-Core model setup with an uneven pipeline split (Megatron-Core itself judges it)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("megatron.core")

from megapilot.estimate.params import stage_params
from megapilot.spec import ModelSpec
from megapilot.trainer.config import build_config
from tests.e2e.test_train_layouts import (  # noqa: F401  (corpus_prefix: a fixture)
    assert_learned,
    corpus_prefix,
    layout_flags,
    train,
)

# 3 layers over PP=2: 1 on the first rank (which also holds the embedding), 2 on the last. Megatron-Core
# accepts it: no middle ranks, and no layers left for them.
UNEVEN = ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1",
          "--decoder-last-pipeline-num-layers", "2"]
TINY = ["--num-layers", "3", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--train-iters", "10", "--lr", "1e-3", "--micro-batch-size", "2", "--global-batch-size", "8", "--mock-data"]


def test_megatron_core_transformer_config_takes_the_uneven_split():
    from megapilot.trainer.model import transformer_config

    core = transformer_config(build_config(TINY + UNEVEN), on_gpu=False)
    assert (core.num_layers_in_first_pipeline_stage, core.num_layers_in_last_pipeline_stage) == (1, 2)


@pytest.mark.slow
def test_a_combination_megatron_core_refuses_is_a_user_error_in_its_words():
    from megapilot.errors import MegapilotError
    from megapilot.trainer.model import transformer_config

    top1 = ["--num-experts", "4", "--moe-router-topk", "1", "--moe-ffn-hidden-size", "64"]
    with pytest.raises(MegapilotError, match="--moe-router-pre-softmax when topk is 1") as refused:
        transformer_config(build_config(TINY + top1), on_gpu=False)
    assert refused.value.field == "flags"
    transformer_config(build_config(TINY + top1 + ["--moe-router-pre-softmax"]), on_gpu=False)  # as it asks


def test_pp2_uneven_split_learns_and_each_rank_holds_what_the_estimator_counts(
    tmp_path, corpus_prefix,  # noqa: F811  (pytest passes the imported fixture)
):
    flags = layout_flags(corpus_prefix, 20, *UNEVEN, "--log-interval", "5")
    flags[flags.index("--num-layers") + 1] = "3"
    run = train(tmp_path, "pp2_uneven", 2, *flags)
    assert_learned(run, 20)
    held = {int(rank): int(count) for rank, count in
            re.findall(r"model parallel rank \(0, (\d)\): (\d+)", run.output)}
    # The estimator's account of each rank, for the same model (Megatron-LM's defaults: LayerNorm, biases,
    # GELU, learned positions, tied output; the byte vocabulary padded to 384).
    model = ModelSpec(name="tiny", num_layers=3, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                      vocab_size=384, mlp_activation="gelu", normalization="LayerNorm", add_bias_linear=True,
                      position_embedding="learned_absolute", max_position_embeddings=64, tie_embeddings=True)
    split = dict(first_stage_layers=1, last_stage_layers=2)
    assert held == {rank: stage_params(model, 2, 1, rank, **split) for rank in (0, 1)}
