"""Script pieces: every value quoted so bash reads back exactly what was meant, flags one per line."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from megapilot.launch.environment import EnvVar
from megapilot.launch.flags import ArgSection
from megapilot.launch.megatron_args import MEGATRON_RELEASE
from megapilot.launch.shell import bash_array, env_block, header, megatron_args_array, q, strict_mode
from megapilot.spec import TrainingSpec
from tests.launch.plans import LLAMA31_8B, make_plan

HOSTILE = [
    "/data/my corpus/text_document",
    "$(touch /tmp/pwned)",
    "`id`",
    "it's",
    'say "hi"',
    "a;b && c | d > e",
    "$HOME ${USER}",
    "line\nbreak",
    "*",
    "--flag-looking value",
    "",
    "tab\there",
    "back\\slash",
    "mlx5_0,mlx5_1",
]


def _bash_reads_back(lines: list[str], array: str) -> list[str]:
    """Run the lines in a real bash and return the array's items, NUL-separated so newlines survive."""
    script = "\n".join([*strict_mode(), *lines, f'printf "%s\\0" "${{{array}[@]}}"'])
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True, timeout=10, cwd="/").stdout
    return out.decode().split("\0")[:-1]


def test_hostile_strings_come_back_from_bash_unchanged():
    assert _bash_reads_back(bash_array("X", HOSTILE), "X") == HOSTILE


def test_exported_values_are_literal_in_bash():
    env = [EnvVar(f"V{i}", value, "reason") for i, value in enumerate(HOSTILE) if value]
    references = " ".join('"$' + var.name + '"' for var in env)
    lines = env_block(env) + [f"X=({references})"]
    assert _bash_reads_back(lines, "X") == [var.value for var in env]


@pytest.mark.parametrize("value", HOSTILE)
def test_q_is_a_single_shell_word_that_means_the_value(value):
    assert shlex.split(q(value)) == [value]


def test_q_leaves_plain_words_bare_and_quotes_comma_lists():
    assert q("--num-layers") == "--num-layers" and q("/abs/path_1.bin") == "/abs/path_1.bin"
    assert q("99,1,0") == "'99,1,0'"  # shellcheck SC2054 reads a bare comma in an array as a separator


def test_bash_array_puts_each_flag_with_its_values_on_one_line():
    assert bash_array("ARGS", ["--a", "1", "--b", "--c", "x y", "z"]) == [
        "ARGS=(", "  --a 1", "  --b", "  --c 'x y' z", ")",
    ]


def test_bash_array_leaves_raw_words_unquoted_for_bash_to_expand():
    lines = bash_array("ARGS", ["--node-rank", '"$NODE_RANK"'], raw=frozenset({'"$NODE_RANK"'}))
    assert lines[1] == '  --node-rank "$NODE_RANK"'
    assert _bash_reads_back(["NODE_RANK=3", *lines], "ARGS") == ["--node-rank", "3"]


def test_an_empty_array_is_still_valid_bash():
    assert bash_array("EMPTY", []) == ["EMPTY=(", ")"]
    assert _bash_reads_back(bash_array("EMPTY", []) + ["EMPTY+=(x)"], "EMPTY") == ["x"]


def test_megatron_args_get_one_commented_block_per_non_empty_section():
    model = ArgSection("model")
    model.add("--num-layers", 2)
    data = ArgSection("data")
    data.add("--data-path", "/d d/x")
    lines = megatron_args_array([model, ArgSection("nothing here"), data])
    assert lines == ["MEGATRON_ARGS=(", "  # model", "  --num-layers 2", "  # data", "  --data-path '/d d/x'", ")"]
    assert _bash_reads_back(lines, "MEGATRON_ARGS") == ["--num-layers", "2", "--data-path", "/d d/x"]


def test_env_block_puts_each_reason_above_its_export():
    lines = env_block([EnvVar("NCCL_DEBUG", "WARN", "warnings reach the log"), EnvVar("A", "x y", "why a")])
    assert lines == ["# ---- environment: each variable with the reason it is set",
                     "# warnings reach the log", "export NCCL_DEBUG=WARN", "# why a", "export A='x y'", ""]


def test_header_names_the_model_nodes_gpu_layout_and_pinned_release():
    plan = make_plan(LLAMA31_8B, "h100", 2, TrainingSpec(seq_length=4096, global_batch_size=64), tp=2)
    lines = header(plan, 2, "SLURM launch")
    assert lines[0] == "#!/usr/bin/env bash" and all(line.startswith("#") for line in lines)
    assert lines[1] == "# SLURM launch: llama3.1-8b on 2 node(s) x 8 H100-SXM5-80GB"
    assert "TP=2" in lines[2] and "precision bf16" in lines[2]
    assert MEGATRON_RELEASE in lines[3]


def test_strict_mode_stops_on_errors_unset_variables_and_pipe_failures():
    assert strict_mode()[0] == "set -euo pipefail"
    failed = subprocess.run(["bash", "-c", "\n".join([*strict_mode(), 'echo "$UNSET_VARIABLE_X"'])],
                            capture_output=True, timeout=10)
    assert failed.returncode != 0
