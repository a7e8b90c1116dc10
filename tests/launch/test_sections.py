"""An argument section keeps its flags and values in order, each value as Megatron-LM's parser reads it."""

from __future__ import annotations

import argparse

from megapilot.launch.sections import ArgSection


def test_flags_and_values_keep_their_order_and_a_switch_takes_no_value():
    section = ArgSection("model")
    section.add("--num-layers", 32)
    section.add("--swiglu")
    section.add("--moe-layer-freq", 1, 0)
    assert section.args == ["--num-layers", "32", "--swiglu", "--moe-layer-freq", "1", "0"]


def test_floats_print_in_their_shortest_form_and_read_back_to_the_same_number():
    section = ArgSection("optimizer")
    for value in (3e-05, 0.0003, 1.0, 0.1 + 0.2):
        section.add("--lr", value)
    assert section.args[1::2] == ["3e-05", "0.0003", "1.0", "0.30000000000000004"]
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float)
    assert [parser.parse_args(["--lr", text]).lr for text in section.args[1::2]] == [3e-05, 0.0003, 1.0, 0.1 + 0.2]


def test_sections_do_not_share_their_argument_lists():
    first, second = ArgSection("a"), ArgSection("b")
    first.add("--x", 1)
    assert second.args == [] and first.title == "a"


def test_a_field_carrying_flag_is_written_from_its_vocabulary_row():
    from megapilot.spec import ModelSpec, ParallelConfig

    section = ArgSection("rows")
    parallel = ParallelConfig(tp=2, sequence_parallel=True)
    section.add_terms(parallel, "--tensor-model-parallel-size", "--sequence-parallel", "--use-megatron-fsdp")
    assert section.args == ["--tensor-model-parallel-size", "2", "--sequence-parallel"]  # a false switch: left out
    model = ModelSpec(name="m", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                      vocab_size=128, rotary_percent=1.0)
    section.args.clear()
    section.add_terms(model, "--num-layers", "--moe-router-topk", "--q-lora-rank")  # no MoE, no MLA: left out
    section.add_terms(model, "--rotary-percent", left_out_at_default=True)  # Megatron's own 1.0
    assert section.args == ["--num-layers", "2"]
