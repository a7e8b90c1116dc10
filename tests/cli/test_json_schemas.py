"""Every command's `--json`: one JSON document alone on stdout (notes and progress go to stderr), with its
documented top-level keys pinned, so that a key renamed or dropped breaks a test before it breaks a user's tool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

LOG = Path(__file__).parents[1] / "data" / "logs" / "synthetic_megatron_core016_full.log"
TINY = ("--model", "tiny", "--gpu", "h100", "--gpus", "8", "--seq-len", "128", "--gbs", "16")

ESTIMATE_KEYS = {"params", "flops_per_step", "memory_gib", "fits", "host_offload_gib", "step_time_s",
                 "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "time_breakdown_s", "warnings", "bubble_fraction",
                 "exposed_comm_fraction",
                 "flop_convention", "calibration", "tokens_per_s_per_gpu_p10", "tokens_per_s_per_gpu_p90",
                 "interval_basis"}
MODEL_KEYS = {"name", "aliases", "source", "hf_architecture", "num_layers", "hidden_size", "ffn_hidden_size",
              "num_attention_heads", "kv_heads", "attention", "num_experts", "router_topk", "vocab_size", "params",
              "total_params_b", "active_params_b", "spec"}
PROFILE_KEYS = {"path", "exists", "profile"}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A clean directory and an empty profile, so no user's saved defaults leak into the output."""
    monkeypatch.setenv("MEGAPILOT_PROFILE", str(tmp_path / "profile.toml"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def json_of(cli, *args: str, exit_code: int = 0):
    """Run a command and return its stdout parsed as the one JSON document it must be."""
    result = cli(*args)
    assert result.exit_code == exit_code, result.stderr
    return json.loads(result.stdout)  # fails on anything printed besides the document


def saved_plan(cli, directory: Path) -> str:
    path = directory / "plan.json"
    json_of(cli, "plan", *TINY, "--save", str(path), "--json")
    return str(path)


def test_gpus(cli, workdir):
    rows = json_of(cli, "gpus", "--json")
    assert set(rows[0]) == {"name", "alias", "vendor", "architecture", "bf16_dense_tflops", "fp8_dense_tflops",
                            "fp4_dense_tflops", "mxfp8_dense_tflops", "nvfp4_dense_tflops", "mxfp4_dense_tflops",
                            "hbm_gib", "hbm_bw_tbps", "scaleup_domain_gpus", "gpus_per_node", "scaleup_bw_gbps",
                            "scaleout_bw_gbps", "host_link_gbps", "host_memory_gib", "tdp_w", "mma_flops_per_exp",
                            "mma_flops_per_smem_byte", "host_op_s", "host_element_s", "host_runtime_gib", "source",
                            "precisions"}


def test_models_list_and_one(cli, workdir):
    assert all(set(row) == MODEL_KEYS for row in json_of(cli, "models", "--json"))
    one = json_of(cli, "models", "tiny", "--json")
    assert set(one) == MODEL_KEYS
    assert set(one["params"]) == {"total", "main_model", "active", "active_without_input_embedding", "embedding",
                                  "output_layer", "layers", "final_norm", "mtp"}


def test_estimate_and_its_batch(cli, workdir):
    result = json_of(cli, "estimate", *TINY, "--json")
    assert set(result) == ESTIMATE_KEYS | {"model", "defaults", "notes"}  # the model it ran on, resolved
    assert any("TP=1" in said for said in result["defaults"]) and result["notes"] == []  # as the assumed: line
    assert {"weights", "gradients", "optimizer", "activations", "overhead", "total", "capacity"} <= set(
        result["memory_gib"])
    cases = workdir / "cases.jsonl"
    cases.write_text('{"model": "tiny", "gpu": "h100", "gpus": 8, "gbs": 16, "seq_len": 128}\n{"model": "nope"}\n')
    result = cli("estimate", "--batch", str(cases), "--json")
    assert result.exit_code == 1  # the second line failed
    good, bad = result.json()
    assert set(good) == ESTIMATE_KEYS | {"line"} and set(bad) == {"error", "field", "fix", "line"}


def test_plan(cli, workdir):
    result = json_of(cli, "plan", *TINY, "--json")
    assert set(result) == {"candidates", "rejected", "shell", "summary", "layouts_costed", "layouts_fitting",
                           "memory_checks", "product_check", "defaults", "saved", "model"}
    assert {"parallel", "estimate", "reasons"} <= set(result["candidates"][0])
    assert set(result["candidates"][0]["estimate"]) >= ESTIMATE_KEYS - {"flop_convention"}


def test_script(cli, workdir):
    result = json_of(cli, "script", "--plan", saved_plan(cli, workdir), "--mock-data", "--entrypoint", "megapilot",
                     "--json")
    assert set(result) == {"script", "launcher", "megatron_args", "env", "nodes", "gpus_per_node", "files",
                           "directories", "notes", "megatron_release",
                           "assumed", "model"}
    assert result["script"].startswith("#!/usr/bin/env bash")
    assert result["model"]["source"] == "plan file"


def test_logs_parse(cli, workdir):
    result = json_of(cli, "logs", "parse", str(LOG), "--json")
    assert set(result) == {"dialect", "framework", "files", "dialect_counts", "lines_read", "iterations", "memory",
                           "theoretical_memory", "timers", "checkpoints", "errors", "markers", "summary", "arguments",
                           "megatron_version", "binary_skipped"}


def test_diagnose(cli, workdir):
    result = json_of(cli, "diagnose", str(LOG), "--json")
    assert set(result) == {"findings", "dialect", "framework", "files", "story", "summary", "notes", "megatron_version",
                           "training_log"}


def test_optimize(cli, workdir):
    script = workdir / "train.sh"
    json_of(cli, "script", "--plan", saved_plan(cli, workdir), "--mock-data", "--entrypoint", "megapilot",
            "-o", str(script), "--json")
    result = json_of(cli, "optimize", "--script", str(script), "--json")
    assert set(result) == {"current", "best", "changes", "calibration_scale", "notes", "log_mismatch"}


def test_profile_set_and_show(cli, workdir):
    assert set(json_of(cli, "profile", "set", "--gpu", "h100", "--gpus", "16", "--json")) == PROFILE_KEYS
    shown = json_of(cli, "profile", "show", "--json")
    assert set(shown) == PROFILE_KEYS and shown["exists"] is True and shown["profile"]["gpus"] == 16


def test_run(cli, workdir):
    script = workdir / "noop.sh"
    script.write_text("#!/bin/bash\ntrue\n")  # exits 0 without an iteration line: a FAILED run, still one document
    result = json_of(cli, "run", str(script), "--run-dir", str(workdir / "runs"), "--json", exit_code=1)
    assert set(result) == {"job_id", "combo", "executor", "state", "exit_code", "reason", "iterations_reached",
                           "train_iters", "step_time_s", "started_at", "ended_at", "duration_s", "logs", "job_dir",
                           "prediction_note"}  # a launch script says why it has no prediction (its flags: none)
    assert result["state"] == "FAILED" and result["prediction_note"]


def test_data_prepare(cli, workdir):
    pytest.importorskip("megatron.core")
    docs = workdir / "docs.jsonl"
    docs.write_text('{"text": "hello"}\n{"text": "world"}\n')
    result = json_of(cli, "data", "prepare", str(docs), "--output-prefix", str(workdir / "corpus"), "--json")
    assert set(result) == {"prefix", "bin_path", "idx_path", "documents", "tokens", "tokenizer", "vocab_size"}
    assert result["documents"] == 2
