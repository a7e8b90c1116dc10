"""suite.secrets: which values are secrets, and input copies with them masked (the whole run is in tests/faults)."""

from __future__ import annotations

import json
import stat

import pytest

from megapilot.suite.config import load_suite
from megapilot.suite.secrets import MASK, holds_secrets, is_secret_name, mask_text, secret_values, write_masked_copy
from tests.suite.cvs_files import SINGLE_8B, filled_in, raw_cvs, write_suite

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize(("name", "secret"), [
    ("HF_TOKEN", True), ("WANDB_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True), ("db_password", True),
    ("KEY", True), ("SSH_PRIVATE_KEY", True), ("GITHUB_TOKEN", True), ("NCCL_DEBUG", False), ("KEYBOARD", False),
    ("MONKEY_PATCH", False), ("MASTER_PORT", False), ("TOKENIZERS_PARALLELISM", False), ("tokenizer_model", False),
    ("MAX_TOKENS", False), ("hf_token_file", False), ("SSH_PRIVATE_KEY_PATH", False)])
def test_names_that_say_they_hold_a_credential(name, secret):
    assert is_secret_name(name) is secret


def test_a_name_listed_in_the_config_is_a_secret_too():
    assert is_secret_name("LAB_PASS", {"LAB_PASS"}) and not is_secret_name("LAB_PASS")
    assert is_secret_name("TOKEN_FILE", {"TOKEN_FILE"})


def test_short_values_are_not_masked_inside_other_text():
    assert mask_text("token=abcdefgh port=1", ["abcdefgh", "1"]) == f"token={MASK} port=1"


def _suite(tmp_path, env: dict[str, str], secrets: list[str] | None = None):
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["container"]["env"] = env
    if secrets:
        raw["megapilot"] = {"secrets": secrets}
    return load_suite(write_suite(tmp_path, raw, SINGLE_8B)), tmp_path / "suite.json"


def test_secret_values_come_from_secret_names_and_the_listed_ones_longest_first(tmp_path):
    suite, _ = _suite(tmp_path, {"HF_TOKEN": TOKEN, "LAB_PASS": "opensesame", "NCCL_DEBUG": "WARN"}, ["LAB_PASS"])
    assert secret_values(suite) == [TOKEN, "opensesame"] and holds_secrets(suite)
    (tmp_path / "plain").mkdir()
    plain, _ = _suite(tmp_path / "plain", {"NCCL_DEBUG": "WARN", "TOKENIZERS_PARALLELISM": "false"})
    assert not holds_secrets(plain)


def test_the_copy_masks_secret_keys_and_values_and_is_the_owners_alone(tmp_path):
    suite, config = _suite(tmp_path, {"HF_TOKEN": TOKEN, "NOTE": f"see {TOKEN}", "NCCL_DEBUG": "WARN"})
    copy = write_masked_copy(config, tmp_path / "copy.json", suite)
    text = copy.read_text()
    assert TOKEN not in text
    env = json.loads(text)["container"]["env"]
    assert env == {"HF_TOKEN": MASK, "NOTE": f"see {MASK}", "NCCL_DEBUG": "WARN"}
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600 and copy.stat().st_mtime == config.stat().st_mtime


def test_a_copy_without_secrets_is_the_file_as_it_was(tmp_path):
    # hf_token_file (where the token is) and train_params.tokenizer_model stay readable
    suite, config = _suite(tmp_path, {"NCCL_DEBUG": "WARN", "TOKENIZERS_PARALLELISM": "false"})
    copy = write_masked_copy(config, tmp_path / "copy.json", suite)
    assert copy.read_text() == config.read_text() and stat.S_IMODE(copy.stat().st_mode) == 0o644
