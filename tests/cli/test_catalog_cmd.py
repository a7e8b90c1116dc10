"""cli.catalog_cmd: `megapilot models` and `megapilot gpus`, their JSON read back and checked for consistency."""

from __future__ import annotations

import json

import pytest


def _model(cli, name: str) -> dict:
    result = cli("models", name, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(("name", "attention", "kv_heads"), [
    ("tiny", "MHA", 4), ("llama3.1-8b", "GQA", 8), ("deepseek-v2-lite", "MLA", None),
    ("deepseek-v4-flash", "MLA+CSA", None)])
def test_the_attention_kind_and_kv_heads_follow_the_model(cli, name, attention, kv_heads):
    row = _model(cli, name)
    assert (row["attention"], row["kv_heads"]) == (attention, kv_heads)


@pytest.mark.parametrize("name", ["llama3.1-8b", "deepseek-v3", "tiny"])
def test_the_parameter_breakdown_adds_up(cli, name):
    row = _model(cli, name)
    params = row["params"]
    assert params["main_model"] == (params["embedding"] + params["output_layer"] + params["layers"]
                                    + params["final_norm"])
    assert params["total"] == params["main_model"] + params["mtp"]
    assert params["active_without_input_embedding"] == params["active"] - params["embedding"]
    assert row["total_params_b"] == round(params["total"] / 1e9, 3)


def test_a_moe_model_is_active_on_a_fraction_of_its_parameters_and_counts_its_mtp(cli):
    row = _model(cli, "deepseek-v3")
    assert (row["num_experts"], row["router_topk"]) == (256, 8)
    assert row["active_params_b"] < row["total_params_b"] / 10 and row["params"]["mtp"] > 0
    dense = _model(cli, "llama3.1-8b")
    assert dense["params"]["active"] == dense["params"]["total"] and dense["router_topk"] is None


def test_every_model_is_listed_once_with_the_same_row_as_on_its_own(cli):
    rows = json.loads(cli("models", "--json").stdout)
    names = [row["name"] for row in rows]
    assert len(names) == len(set(names)) and "tiny" in names
    assert next(row for row in rows if row["name"] == "tiny") == _model(cli, "tiny")


def test_gpus_list_the_catalog_then_this_machines_cpu_with_sorted_precisions(cli):
    result = cli("gpus", "--json")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    aliases = [row["alias"] for row in rows]
    assert {"h100", "mi300x"} <= set(aliases) and aliases[-1] == "cpu"
    for row in rows:
        assert row["precisions"] == sorted(row["precisions"]) and "bf16" in row["precisions"]


def test_the_cpu_row_counts_its_scale_up_domain_in_ranks_not_gpus(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = cli("gpus")
    assert result.exit_code == 0, result.stderr
    [cpu_row] = [line for line in result.stdout.splitlines() if line.startswith("│ cpu ")]
    assert " ranks " in cpu_row and " GPUs " not in cpu_row
    assert any(" 8 GPUs " in line for line in result.stdout.splitlines() if line.startswith("│ h100 "))
