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


def test_a_hub_id_without_network_says_the_preset_stood_in(cli, monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: neither cache nor download can give it
    result = cli("plan", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--gpus", "8", "--top", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["model"]["source"] in ("preset for hub id", "hub")
    assert result.json()["model"]["requested"] == "meta-llama/Llama-3.1-8B"
