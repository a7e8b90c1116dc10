"""The shared split options parse the same way wherever a command declares them."""

from __future__ import annotations

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
