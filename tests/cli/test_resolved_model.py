"""The model a command runs on is named, with where it came from, in its output and in its --json: an alias said
aloud, a hub id that fell back to the preset read from that repository's config.json."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("command", [
    ("plan", "--gpu", "h100", "--gpus", "64", "--top", "1"),
    ("estimate", "--gpu", "h100", "--gpus", "64", "--tp", "8", "--pp", "4", "--gbs", "512", "--seq-len", "4096"),
])
def test_an_alias_is_resolved_aloud_and_in_the_json(cli, command: tuple[str, ...]):
    text = cli(*command, "--model", "llama3-70b")
    assert text.exit_code == 0, text.stderr
    assert "model: llama3.1-70b (preset; 'llama3-70b' is its alias)" in text.stdout
    data = cli(*command, "--model", "llama3-70b", "--json").json()
    assert data["model"] == {"name": "llama3.1-70b", "requested": "llama3-70b", "source": "preset"}


def test_a_script_names_its_model_in_the_json(cli, tmp_path):
    """`script` takes the model from --model (resolved as plan resolves it) or from a plan file (named as such)."""
    layout = ("--gpu", "h100", "--gpus", "64", "--tp", "8", "--pp", "4", "--gbs", "512", "--seq-len", "4096",
              "--mock-data", "--megatron-path", str(tmp_path))
    result = cli("script", "--model", "llama3-70b", *layout, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["model"] == {"name": "llama3.1-70b", "requested": "llama3-70b", "source": "preset"}
    plan = tmp_path / "plan.json"
    saved = cli("plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--top", "1", "--save", str(plan))
    assert saved.exit_code == 0, saved.stderr
    from_plan = cli("script", "--plan", str(plan), "--mock-data", "--megatron-path", str(tmp_path), "--json")
    assert from_plan.exit_code == 0, from_plan.stderr
    assert from_plan.json()["model"] == {"name": "llama3.1-70b", "requested": str(plan), "source": "plan file"}


def test_a_hub_id_without_network_says_the_preset_stood_in(cli, monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: neither cache nor download can give it
    result = cli("plan", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--gpus", "8", "--top", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["model"]["source"] in ("preset for hub id", "hub")
    assert result.json()["model"]["requested"] == "meta-llama/Llama-3.1-8B"
