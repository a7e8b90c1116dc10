"""`megapilot estimate` layout flags beyond the basic sizes: uneven pipeline stages and a forced cross-node TP."""

from __future__ import annotations

import pytest

LLAMA_405B_PP16 = ("--model", "llama3.1-405b", "--gpu", "h200", "--gpus", "2048", "--tp", "8", "--pp", "16",
                   "--gbs", "2048", "--seq-len", "8192", "--recompute", "full")
GPT3_175B = ("--model", "gpt3-175b", "--gpu", "h100", "--gpus", "256", "--pp", "8", "--gbs", "512",
             "--seq-len", "2048")


def test_126_layers_at_pp16_are_refused_evenly_and_estimated_with_7_on_the_end_ranks(cli):
    even = cli("script", *LLAMA_405B_PP16, "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote")
    assert even.exit_code == 2  # a command line needs the split; estimate prices the balanced one and says so
    assert "first_stage_layers" in even.stderr and len(even.stderr.strip().splitlines()) == 1
    assert "the balanced split, as none was given" in cli("estimate", *LLAMA_405B_PP16).stderr
    uneven = cli("estimate", *LLAMA_405B_PP16, "--first-stage-layers", "7", "--last-stage-layers", "7", "--json")
    assert uneven.exit_code == 0, uneven.stderr
    assert uneven.json()["memory_gib"]["stage"] == 1  # a middle rank with 8 layers is the most loaded


def test_an_uneven_split_megatron_refuses_is_a_one_line_error_naming_the_flag(cli):
    result = cli("estimate", *LLAMA_405B_PP16, "--first-stage-layers", "7", "--last-stage-layers", "8")
    assert result.exit_code == 2
    assert "first_stage_layers" in result.stderr and "14 middle" in result.stderr


def test_tp_across_nodes_is_refused_unless_forced(cli):
    refused = cli("estimate", *GPT3_175B, "--tp", "16", "--json")
    assert refused.exit_code == 2 and "--force-tp-across-nodes" in refused.stderr
    forced = cli("estimate", *GPT3_175B, "--tp", "16", "--force-tp-across-nodes", "--json")
    assert forced.exit_code == 0, forced.stderr
    assert forced.json()["time_breakdown_s"]["tp_comm"] > 0


def test_batch_lines_take_the_same_flags(cli, tmp_path):
    import json

    lines = [{"model": "gpt3-175b", "gpu": "h100", "gpus": 256, "tp": 16, "pp": 8, "gbs": 512, "seq_len": 2048,
              "force_tp_across_nodes": True},
             {"model": "llama3.1-405b", "gpu": "h200", "gpus": 2048, "tp": 8, "pp": 16, "gbs": 2048,
              "seq_len": 8192, "first_stage_layers": 7, "last_stage_layers": 7}]
    batch = tmp_path / "cases.jsonl"
    batch.write_text("\n".join(json.dumps(line) for line in lines))
    results = cli("estimate", "--batch", str(batch), "--json").json()
    assert [("error" in r) for r in results] == [False, False]


def test_megatron_spellings_of_the_layout_flags_mean_the_same(cli):
    """Flags pasted from a Megatron-LM launch script, and those the refusals' fixes quote, are accepted."""
    ours = ("--model", "deepseek-v3", "--gpu", "h100", "--gpus", "1024", "--tp", "2", "--pp", "8", "--ep", "64",
            "--etp", "1", "--mbs", "1", "--gbs", "8192", "--seq-len", "4096", "--precision", "fp8",
            "--pp-layout", "Et*2|(t*2|)*29t|mL", "--moe-capacity-factor", "1.0", "--moe-pad-to-capacity",
            "--recompute", "selective", "--json")
    megatron = ("--model", "deepseek-v3", "--gpu", "h100", "--gpus", "1024", "--tensor-model-parallel-size", "2",
                "--pipeline-model-parallel-size", "8", "--expert-model-parallel-size", "64",
                "--expert-tensor-parallel-size", "1", "--micro-batch-size", "1", "--global-batch-size", "8192",
                "--seq-length", "4096", "--precision", "fp8", "--pipeline-model-parallel-layout", "Et*2|(t*2|)*29t|mL",
                "--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity",
                "--recompute-granularity", "selective", "--json")
    a, b = cli("estimate", *ours), cli("estimate", *megatron)
    assert a.exit_code == 0 and b.exit_code == 0, a.stderr + b.stderr
    assert a.json() == b.json()
    split = cli("estimate", *LLAMA_405B_PP16, "--decoder-first-pipeline-num-layers", "7",
                "--decoder-last-pipeline-num-layers", "7", "--json")
    assert split.exit_code == 0 and split.json() == cli(
        "estimate", *LLAMA_405B_PP16, "--first-stage-layers", "7", "--last-stage-layers", "7", "--json").json()


LLAMA_70B_GB200_FSDP = ("--model", "llama3.1-70b", "--gpu", "gb200", "--gpus", "64", "--fsdp", "--mbs", "2",
                        "--gbs", "256", "--seq-len", "8192", "--precision", "fp8")


def test_offloaded_layers_lower_the_activations_and_add_their_exposed_copies(cli):
    """Megatron-Bridge's GB200 recipe for Llama 3 70B offloads the activations of 40 layers to the Grace's memory."""
    kept = cli("estimate", *LLAMA_70B_GB200_FSDP, "--recompute", "none", "--json").json()
    offloaded = cli("estimate", *LLAMA_70B_GB200_FSDP, "--recompute", "none", "--cpu-offloading-num-layers", "40",
                    "--json").json()
    assert offloaded["memory_gib"]["activations"] < 0.6 * kept["memory_gib"]["activations"]
    assert offloaded["time_breakdown_s"]["cpu_offload"] > 0 == kept["time_breakdown_s"]["cpu_offload"]
    assert offloaded["step_time_s"] > kept["step_time_s"]


@pytest.mark.parametrize(("extra", "words"), [
    (("--recompute", "selective"), "needs recompute 'none'"),
    (("--recompute", "none", "--pp", "2"), "needs pp 1"),
    (("--recompute", "none", "--cpu-offloading-num-layers", "80"), "at most 79"),
])
def test_offloading_megatron_refuses_is_a_one_line_error_naming_the_flag(cli, extra, words):
    flags = ("--cpu-offloading-num-layers", "8", *extra) if "--cpu-offloading-num-layers" not in extra else extra
    result = cli("estimate", *LLAMA_70B_GB200_FSDP, *flags)
    assert result.exit_code == 2
    assert "cpu_offloading_num_layers" in result.stderr and words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
