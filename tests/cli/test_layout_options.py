"""The shared split options parse the same way wherever a command declares them."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from megapilot.cli.layout_options import (
    AccountForEmbedding,
    AccountForLoss,
    FirstStageLayers,
    LastStageLayers,
    PpLayout,
    SequenceParallel,
    split_flags,
)
from megapilot.estimate import build_case


def _app(seen: list) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def command(first_stage_layers: FirstStageLayers = None, last_stage_layers: LastStageLayers = None,
                account_for_embedding: AccountForEmbedding = False, account_for_loss: AccountForLoss = False,
                pp_layout: PpLayout = None, sequence_parallel: SequenceParallel = None) -> None:
        seen.append((split_flags(first_stage_layers, last_stage_layers, account_for_embedding, account_for_loss,
                                 pp_layout), sequence_parallel))

    return app


def test_the_options_become_build_case_keys_that_build_the_split():
    seen: list = []
    result = CliRunner().invoke(_app(seen), ["--account-for-embedding", "--account-for-loss", "--sp"])
    assert result.exit_code == 0, result.output
    flags, sequence_parallel = seen[0]
    assert sequence_parallel is True
    case = build_case(model="llama3.1-405b", gpu="h100", gpus=512, tp=8, pp=8, vpp=8, gbs=512, seq_len=8192,
                      **flags)
    assert case.parallel.rank_layer_counts(126) == (15,) + (16,) * 6 + (15,)


def test_a_layout_string_and_the_no_sp_spelling_pass_through():
    seen: list = []
    CliRunner().invoke(_app(seen), ["--pp-layout", "Et*3|(tt|)*29,m|L", "--no-sp"])
    flags, sequence_parallel = seen[0]
    assert flags["pp_layout"] == "Et*3|(tt|)*29,m|L" and flags["account_for_loss"] is None
    assert sequence_parallel is False


LLAMA_405B = ("--model", "llama3.1-405b", "--gpu", "h100", "--gpus", "1024", "--tp", "8", "--gbs", "512",
              "--seq-len", "8192", "--recompute", "full")


def test_estimate_prints_the_balanced_layout_it_computed(cli):
    result = cli("estimate", *LLAMA_405B, "--pp", "16", "--pp-layout", "balanced")
    assert result.exit_code == 0, result.stderr
    assert "pipeline split: Et*" in result.stdout
    doc = json.loads(cli("estimate", *LLAMA_405B, "--pp", "16", "--pp-layout", "balanced", "--json").stdout)
    assert doc["pipeline_split"].startswith("Et*") and doc["pipeline_split"].endswith("L")


def test_a_split_that_does_not_divide_is_one_line_naming_the_legal_options(cli):
    result = cli("estimate", *LLAMA_405B, "--pp", "16")
    assert result.exit_code == 2
    assert "account_for_embedding and account_for_loss" in result.stderr and "\n" not in result.stderr.strip()


def test_script_writes_the_account_for_switches(cli, tmp_path):
    out = tmp_path / "run.sh"
    result = cli("script", *LLAMA_405B, "--pp", "8", "--vpp", "8", "--account-for-embedding", "--account-for-loss",
                 "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--output", str(out))
    assert result.exit_code == 0, result.stderr
    text = out.read_text()
    assert "--account-for-embedding-in-pipeline-split" in text and "--num-virtual-stages-per-pipeline-rank 8" in text


def test_plan_leaves_the_headroom_asked_for(cli):
    args = ("plan", "--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "64", "--seq-len", "8192", "--gbs", "512",
            "--top", "1", "--json")
    memory = json.loads(cli(*args, "--headroom", "0.3").stdout)["candidates"][0]["estimate"]["memory_gib"]
    assert memory["total"] <= 0.7 * memory["capacity"]
