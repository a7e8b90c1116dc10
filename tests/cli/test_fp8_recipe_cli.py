"""`--fp8-recipe` on estimate, plan and script, and the batch key `fp8_recipe`: passed through, or refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# two nodes: a remote launch, so the script command does not look for the Megatron checkout here
LAYOUT = ("--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "16", "--tp", "2", "--gbs", "64", "--seq-len", "4096")


def test_script_renders_the_recipe_given(cli) -> None:
    result = cli("script", *LAYOUT, "--precision", "fp8", "--fp8-recipe", "blockwise", "--mock-data",
                 "--megatron-path", "/opt/Megatron-LM", "--json")
    assert result.exit_code == 0, result.stderr
    args = result.json()["megatron_args"]
    assert args[args.index("--fp8-recipe") + 1] == "blockwise"
    assert args[args.index("--fp8-format") + 1] == "hybrid"


@pytest.mark.parametrize(("extra", "field"), [
    (("--precision", "mxfp8", "--fp8-recipe", "blockwise", "--gpu", "b200"), "fp8_recipe"),  # mxfp8 scales itself
    (("--precision", "fp8", "--fp8-recipe", "mxfp8"), "fp8_recipe"),  # a precision, not a recipe
    (("--precision", "mxfp8"), "precision"),  # Hopper has no MXFP8 tensor cores
    (("--precision", "mxfp4", "--gpu", "b200"), "precision"),  # MXFP4 only in Primus on CDNA4
])
@pytest.mark.parametrize("command", ["estimate", "script"])
def test_flavours_that_do_not_exist_are_one_line_exit_2(cli, command: str, extra: tuple[str, ...],
                                                        field: str) -> None:
    tail = ("--mock-data", "--megatron-path", "/opt/Megatron-LM") if command == "script" else ()
    result = cli(command, *LAYOUT, *extra, *tail)
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f" {field}:" in lines[0] and "fix:" in lines[0]


def test_plan_takes_the_recipe_and_refuses_it_where_the_gpu_has_no_fp8(cli) -> None:
    base = ("plan", "--model", "llama3.1-8b", "--gpus", "8", "--gbs", "64", "--top", "1", "--json")
    ok = cli(*base, "--gpu", "h100", "--precision", "fp8", "--fp8-recipe", "blockwise")
    assert ok.exit_code == 0, ok.stderr
    refused = cli(*base, "--gpu", "a100", "--precision", "fp8", "--fp8-recipe", "blockwise")
    assert refused.exit_code == 2 and "precision" in refused.stderr and "Traceback" not in refused.stderr
    wrong = cli(*base, "--gpu", "h100", "--precision", "bf16", "--fp8-recipe", "delayed")
    assert wrong.exit_code == 2 and "fp8-recipe" in wrong.stderr


@pytest.mark.parametrize(("extra", "fix"), [
    (("--precision", "fp8", "--fp8-recipe", "FP8-CS"), "use --fp8-recipe tensorwise"),  # the tables' name
    (("--gpu", "b200", "--precision", "fp8", "--fp8-recipe", "mxfp8"), "use --precision mxfp8"),
    (("--precision", "fp16", "--grad-reduce-in-bf16"), "drop --grad-reduce-in-bf16"),
])
def test_plan_refuses_the_training_as_estimate_does_by_its_flag(cli, extra: tuple[str, ...], fix: str) -> None:
    base = ("--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--gbs", "64", "--seq-len", "4096")
    planned = cli("plan", *base, *extra)
    estimated = cli("estimate", *base, "--tp", "1", *extra)
    assert planned.exit_code == estimated.exit_code == 2, (planned.stdout, estimated.stdout)
    assert fix in planned.stderr and fix in estimated.stderr
    assert planned.stderr.startswith("error: --"), planned.stderr  # plan names the flag as typed


def test_batch_lines_take_the_fp8_recipe_key(cli, tmp_path: Path) -> None:
    line = {"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "tp": 2, "gbs": 64, "seq_len": 4096,
            "precision": "fp8"}
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(json.dumps(line | extra) for extra in (
        {"fp8_recipe": "blockwise"}, {"fp8-recipe": "delayed"}, {"fp8_recipe": "mxfp8"})) + "\n")
    result = cli("estimate", "--batch", str(cases), "--json")
    rows = result.json()
    assert "error" not in rows[0] and "error" not in rows[1]
    assert rows[2]["field"] == "fp8_recipe"
