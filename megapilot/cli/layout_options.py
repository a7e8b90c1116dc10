"""The pipeline-split and sequence-parallel options, declared once for `estimate`, `plan` and `script`.

Each is a typer option type (`Annotated`), so the three commands spell, default and document them the same
way; `split_flags` turns them into the `build_case` keys (`--batch` lines use the same names, with `-` or
`_`). The meaning of each is `megapilot.spec.pipeline.PipelineSplit`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

FirstStageLayers = Annotated[int | None, typer.Option(
    "--first-stage-layers",
    help="Decoder layers on the first pipeline rank (--decoder-first-pipeline-num-layers; default: even split).")]
LastStageLayers = Annotated[int | None, typer.Option(
    "--last-stage-layers",
    help="Decoder layers on the last pipeline rank (--decoder-last-pipeline-num-layers; default: even split).")]
AccountForEmbedding = Annotated[bool, typer.Option(
    "--account-for-embedding", help="The embedding takes a layer slot (--account-for-embedding-in-pipeline-split).")]
AccountForLoss = Annotated[bool, typer.Option(
    "--account-for-loss", help="The loss takes a layer slot (--account-for-loss-in-pipeline-split).")]
PpLayout = Annotated[str | None, typer.Option(
    "--pp-layout",
    help="Megatron layout string, e.g. 'Et*3|(tt|)*29,m|L' (--pipeline-model-parallel-layout; VPP follows from "
         "it), or 'balanced' for the most balanced one Megatron can express (printed).")]
SequenceParallel = Annotated[bool | None, typer.Option(
    "--sequence-parallel/--no-sequence-parallel", "--sp/--no-sp", help="Default: on when tp > 1.")]


def split_flags(
    first_stage_layers: int | None, last_stage_layers: int | None, account_for_embedding: bool | None,
    account_for_loss: bool | None, pp_layout: str | None,
) -> dict[str, Any]:
    """The split options as `build_case` keys (None: not given; the account-for switches are given when on)."""
    return {
        "first_stage_layers": first_stage_layers, "last_stage_layers": last_stage_layers,
        "account_for_embedding": True if account_for_embedding else None,
        "account_for_loss": True if account_for_loss else None,
        "pp_layout": pp_layout,
    }
