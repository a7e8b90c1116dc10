"""Every layout published in both calibration files can be typed into the estimator and gets an answer.

A user types what the table printed; where Megatron needs a pipeline split or an expert TP the table does not
print (126 layers on PP 8 x VPP 8, 61 on PP 16, ETP 1 beside TP 2), the refusal names the rule and offers
the fix, and the row is retyped with it - as the published recipes run it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.estimate.published import (
    PublishedLayout,
    catalog_model,
    enter_published_run,
    parenthesized_run,
    parenthesized_twin,
    preset_named_like,
    published_flags,
    published_precision,
    retype_from_refusal,
    short_id,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "calibration"
ROWS = [PublishedLayout.from_row(row) for name in ("published_calibration.json", "published_calibration_2025.json")
        for row in json.loads((DATA / name).read_text())]
LAYOUT_ROWS = [row for row in ROWS if row.has_layout]


def test_every_row_that_prints_a_layout_is_tried():
    assert len(LAYOUT_ROWS) == 82 and len(ROWS) == 90  # 8 paper rows print only a GPU count


@pytest.mark.parametrize("row", LAYOUT_ROWS, ids=[row.id[:60] for row in LAYOUT_ROWS])
def test_each_published_layout_is_answered_or_retyped_with_the_fix_its_refusal_offers(row):
    entry = enter_published_run(row)
    assert entry.result.tokens_per_s_per_gpu > 0 and entry.result.step_time_s > 0
    assert len(entry.retyped) <= 2


def test_rows_printed_without_the_split_megatron_needs_take_the_balanced_one_as_estimate_does():
    """126-layer Llama 3.1 405B on PP 8 x VPP 8 and 61-layer DeepSeek-V3 on PP 16 need a split no table prints.
    `megapilot estimate` prices such a layout with the balanced split; the bench types them the same way (it had
    retyped them with the refusal's first fix, DeepSeek-V3 on B200 with 2 and 3 layers at the ends: its MTP layer
    and loss beside 3 decoder layers made the last stage the slowest, 2,146 against 2,842 tokens/s/GPU)."""
    by_id = {row.id: row for row in LAYOUT_ROWS}
    entries = {row_id: enter_published_run(row) for row_id, row in by_id.items()
               if ("405B" in row_id.upper() and row.pp == 8 and row.vp == 8)
               or ("DeepSeek" in row_id and row.pp == 16) or ("LLAMA3-70B" in row_id and row.pp == 4)}
    unsplit = {i: e for i, e in entries.items() if "LLAMA3-70B" not in i}
    assert len(unsplit) >= 5 and all(e.retyped == [] for e in unsplit.values())
    for row_id, entry in unsplit.items():
        split = entry.case.parallel.pipeline_split
        assert split.layout is not None and not split.is_even, row_id
        assert entry.result.pipeline_split == split.label()  # what `estimate` names on its assumed line
    deepseek16 = next(e for i, e in unsplit.items() if "DeepSeek" in i)
    # the recipe's own (Megatron-Bridge v0.1.0rc4 deepseek_v3.py): one layer beside the MTP module and the loss
    assert deepseek16.case.parallel.pipeline_split.layout == "Et*4|(t*4|)*14tmL"
    assert all(e.case.parallel.pipeline_split.is_even for i, e in entries.items() if "LLAMA3-70B" in i)


def test_a_published_row_is_priced_as_the_estimate_command_prices_it(tmp_path):
    """The row's printed flags, as `megapilot estimate` resolves them (with --grad-reduce-in-bf16, as the recipes
    run), give the bench's figure."""
    from megapilot.estimate import estimate_case

    row = next(r for r in LAYOUT_ROWS if r.id.startswith("bridge-25.09-pretrain-DGX-B200-DeepSeekV3"))
    entry = enter_published_run(row)
    (tmp_path / "model.json").write_text(entry.model.model_dump_json())
    typed = published_flags(row, str(tmp_path / "model.json"), entry.model)  # as printed: no split, no retype
    flags = typed.changed({"recompute": entry.case.parallel.recompute})
    assert flags.grad_reduce_in_bf16
    case, result = estimate_case(flags)
    assert case.parallel == entry.case.parallel
    assert result.tokens_per_s_per_gpu == pytest.approx(entry.result.tokens_per_s_per_gpu, rel=1e-9)


def test_only_the_split_and_the_expert_tp_are_retyped():
    refusal = MegapilotError("tp=16 does not divide num_attention_heads=8", field="tp", fix="use a TP from: 1, 2")
    assert retype_from_refusal(refusal) is None


def test_moe_rows_take_the_recipes_expert_tp_of_one_and_dense_rows_keep_etp_equal_to_tp():
    moe_tp2 = [row for row in LAYOUT_ROWS if row.moe and (row.tp or 1) > 1]
    assert moe_tp2 and all(enter_published_run(row).case.parallel.expert_tp == 1 for row in moe_tp2)
    dense_tp4 = next(row for row in LAYOUT_ROWS if not row.moe and row.tp == 4)
    assert enter_published_run(dense_tp4).case.parallel.expert_tp == 4


def test_the_tables_unprinted_recompute_is_the_lightest_that_fits():
    """Llama 3 8B on 8 H100s fits without recompute; Llama 3 70B FSDP on GB200 at MBS 1 fits without it too (80
    layers of 8k tokens, about 178 of 186 GiB), while at MBS 2 (Megatron-Bridge 25.09) it needs more than none and
    takes selective, the heaviest the rule tries."""
    entries = {row.id: enter_published_run(row) for row in LAYOUT_ROWS if row.id.startswith(
        ("bridge-25.09-pretrain-DGX-H100-LLAMA3_8B", "nemo-25.04-DGX-GB200-LLAMA3-70B",
         "bridge-25.09-pretrain-DGX-GB200-LLAMA3_70B"))}
    by_prefix = {row_id.split("-FP8")[0]: entry for row_id, entry in entries.items()}
    small = by_prefix["bridge-25.09-pretrain-DGX-H100-LLAMA3_8B"]
    assert small.case.parallel.recompute == "none" and small.result.fits
    mbs1 = by_prefix["nemo-25.04-DGX-GB200-LLAMA3-70B"]
    assert mbs1.case.parallel.recompute == "none" and mbs1.result.fits
    mbs2 = by_prefix["bridge-25.09-pretrain-DGX-GB200-LLAMA3_70B"]
    assert mbs2.case.parallel.mbs == 2 and mbs2.case.parallel.recompute == "selective"


def test_tokendrop_rows_run_bridges_token_drop_and_dropless_rows_do_not():
    """Megatron-Bridge's `apply_moe_token_drop` defaults: capacity factor 1.0, inputs padded to capacity."""
    tokendrop = [row for row in LAYOUT_ROWS if row.token_drop]
    dropless = [row for row in LAYOUT_ROWS if row.moe and not row.token_drop]
    assert len(tokendrop) == 8 and dropless
    for row in tokendrop:
        moe = enter_published_run(row).case.model.moe
        assert moe is not None and (moe.capacity_factor, moe.pad_to_capacity) == (1.0, True)
    for row in dropless:
        moe = enter_published_run(row).case.model.moe
        assert moe is not None and moe.capacity_factor is None and not moe.pad_to_capacity


def test_qwen3_30b_fits_without_recompute_where_bridges_recipe_turns_it_off():
    """Bridge's Qwen3-30B-A3B recipe sets no recompute and runs micro-batch 4 on GB200: megapilot's MoE activations
    (one dispatched token per routed copy, as Megatron-Core keeps it) fit there."""
    row = next(row for row in LAYOUT_ROWS if "GB200-Qwen3_30B" in row.id)
    entry = enter_published_run(row)
    assert row.mbs == 4 and entry.case.parallel.recompute == "none" and entry.result.fits


@pytest.mark.parametrize(("label", "expected"), [
    ("FP8-CS (FP8-MX)", ("fp8", "tensorwise")),  # Bridge 25.11: the figure outside the parentheses is FP8-CS
    ("FP8-MX", ("mxfp8", None)),
    ("NVFP4", ("nvfp4", None)),
    ("FP8-SC", ("fp8", "blockwise")),
    ("FP8 per-tensor current scaling ('per-tensor FP8 quantization')", ("fp8", "tensorwise")),
    ("FP8 (25.09 tables have no precision column; page note says parenthesized values use different FP8 "
     "quantization granularity)", ("fp8", None)),
    ("BF16", ("bf16", None)),
    ("16-bit mixed precision", ("bf16", None)),
    (None, ("bf16", None)),
])
def test_a_tables_precision_label_names_the_format_and_recipe_a_user_would_type(label, expected):
    assert tuple(published_precision(label)) == expected


def test_a_row_labelled_mxfp8_is_estimated_in_mxfp8_and_one_labelled_fp8_cs_in_current_scaling():
    row = next(row for row in LAYOUT_ROWS if row.id == "nemo-25.02-DGX-B200-LLAMA3-8B")
    row = row.model_copy(update={"precision": "FP8-MX"})
    assert enter_published_run(row).case.training.precision == "mxfp8"
    row = row.model_copy(update={"precision": "FP8-CS"})
    training = enter_published_run(row).case.training
    assert (training.precision, training.fp8_recipe) == ("fp8", "tensorwise")


@pytest.mark.parametrize(("label", "preset"), [
    ("LLAMA3_8B", "llama3.1-8b"),  # an alias's whole name (llama3-8b)
    ("Nemotron-340B", "nemotron4-340b"),
    ("DeepSeekV3_tokendrop_", "deepseek-v3"),
    ("DeepSeek-V3.2", "deepseek-v3.2"),  # the longest whole name the label starts with, not deepseek-v3
    ("LLAMA4-Scout-LLM", "llama4-scout-17b-16e"),
    ("Nemotron_3_Super", "nemotron3-super-120b-a12b"),
    ("Qwen3_235B", "qwen3-235b-a22b"),  # the start of one preset's name
    ("GPT_OSS_20B", "gpt-oss-20b"),
])
def test_a_tables_model_label_names_its_preset(label, preset):
    found = preset_named_like(label)
    assert found is not None and found.name == preset


@pytest.mark.parametrize("label", ["LLAMA3", "gpt-oss", "Qwen3-VL-235B", "Nemotron-15B"])
def test_a_label_that_names_several_presets_or_none_names_none(label):
    assert preset_named_like(label) is None


def test_a_row_without_an_architecture_takes_the_preset_its_label_names_or_is_refused_by_field():
    row = PublishedLayout(id="r", model="LLAMA3-70B", seq_len=8192, gpu="H100-SXM5-80GB", num_gpus=64)
    assert catalog_model(row).name == "llama3.1-70b"
    with pytest.raises(MegapilotError) as refused:
        catalog_model(row.model_copy(update={"model": "LLAMA3"}))
    assert refused.value.field == "model"


def test_a_hybrid_whose_layers_the_table_counts_its_own_way_keeps_its_named_preset():
    """A table that counts Nemotron-H 8B's layers otherwise still names a preset of its width, heads and (no)
    experts: the estimate keeps its Mamba mixers rather than a plain transformer built from the row's fields."""
    row = PublishedLayout(id="r", model="NemotronH_8B", layers=24, hidden=4096, heads=32, seq_len=8192,
                          gpu="H100-SXM5-80GB", num_gpus=64)
    assert catalog_model(row).name == "nemotron-h-8b"
    other_width = row.model_copy(update={"hidden": 3072})
    assert catalog_model(other_width).name == "NemotronH_8B"  # the row's own fields: not the named preset's shape


def test_a_sink_model_printed_with_cp_is_entered_with_the_a2a_exchange():
    """GPT-OSS's attention sinks run under CP only by --cp-comm-type a2a: a row printed with CP 2 takes it without a
    retype (the exchange a sink model's CP defaults to), and a refusal naming it would offer it."""
    row = PublishedLayout(id="gpt-oss-120b-h100-cp2", model="GPT-OSS-120B", seq_len=8192, gpu="H100", num_gpus=64,
                          tp=1, pp=1, cp=2, ep=8, mbs=1, gbs=128, precision="bf16")
    entry = enter_published_run(row)
    assert entry.retyped == []
    assert (entry.case.parallel.cp, entry.case.parallel.cp_comm_type) == (2, "a2a")
    assert entry.result.time_breakdown_s["cp_comm"] > 0
    ring = MegapilotError("cp=2 on a ring", field="cp_comm_type", fix="use cp 1, or a smaller tp")
    assert retype_from_refusal(ring) is None  # no a2a to offer where the heads do not split


RAW_2025 = json.loads((DATA / "published_calibration_2025.json").read_text())


def _raw(fragment: str) -> dict:
    return next(raw for raw in RAW_2025 if fragment in raw["id"])


def test_a_parenthesized_run_is_the_other_granularity_at_the_layout_its_parentheses_print():
    """Bridge 25.09's GB200 Llama 3 70B prints FSDP at TP 1 and, in parentheses, MXFP8 at TP2 PP4 VP5 with GA 16:
    64 GPUs / (TP 2 x PP 4) = DP 8, so MBS = 128 / (16 x 8) = 1, without FSDP."""
    beside = parenthesized_run(_raw("bridge-25.09-pretrain-DGX-GB200-LLAMA3_70B"))
    assert beside is not None and not beside.derived_from_tflops
    row = PublishedLayout.from_row(beside.row)
    assert (row.tp, row.pp, row.vp, row.cp, row.mbs, row.fsdp) == (2, 4, 5, 1, 1, False)
    assert row.gemm_precision == ("mxfp8", None) and beside.tokens_per_s_per_gpu == 3546
    assert row.id.endswith("[parenthesized FP8-MX]") and row.gbs == 128 and row.seq_len == 8192
    assert parenthesized_twin(row.id) == _raw("bridge-25.09-pretrain-DGX-GB200-LLAMA3_70B")["id"]
    assert parenthesized_twin(_raw("bridge-25.09-pretrain-DGX-GB200-LLAMA3_70B")["id"]) is None
    assert short_id(row.id, 30) == row.id[:30] + " [parenthesized FP8-MX]"  # a report's cut keeps the tag
    assert short_id(row.id[:40], 30) == row.id[:30]


def test_hoppers_parentheses_are_blockwise_fp8_and_tflops_alone_give_tokens_at_the_rows_own_ratio():
    """H100 has no MX tensor cores: its second granularity is Bridge's sub-channel (blockwise) FP8. The DeepSeek-V3
    row prints 330 TFLOP/s in parentheses beside 338 TFLOP/s and 1,297 tokens/s."""
    beside = parenthesized_run(_raw("bridge-25.09-pretrain-DGX-H100-DeepSeekV3"))
    assert beside is not None and beside.derived_from_tflops
    assert PublishedLayout.from_row(beside.row).gemm_precision == ("fp8", "blockwise")
    assert beside.tokens_per_s_per_gpu == pytest.approx(1297 * 330 / 338)


def test_parentheses_that_print_no_throughput_give_no_run():
    assert parenthesized_run(_raw("bridge-25.09-pretrain-DGX-H100-Qwen3_30B")) is None  # only the model label
    assert parenthesized_run(_raw("nemo-25.02-DGX-B200-LLAMA3-8B")) is None  # no parentheses at all
