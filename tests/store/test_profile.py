"""The saved profile: TOML round trip, location rules, merge, and errors for broken files."""

from __future__ import annotations

import pytest
import tomllib

from megapilot.errors import MegapilotError
from megapilot.store.profile import PROFILE_ENV, Profile, load_profile, profile_path, save_profile


def test_save_then_load_round_trips_every_field(tmp_path):
    path = tmp_path / "p.toml"
    save_profile(path, gpu="h100", gpus=64, gpus_per_node=8, data_path="/data/c4_text_document",
                 tokenizer="meta-llama/Llama-3.1-8B", save_dir="/ckpt")
    loaded = load_profile(path)
    assert loaded.values() == {"gpu": "h100", "gpus": 64, "gpus_per_node": 8, "data_path": "/data/c4_text_document",
                               "tokenizer": "meta-llama/Llama-3.1-8B", "save_dir": "/ckpt"}
    assert loaded.source == str(path)
    assert tomllib.loads(path.read_text())["gpu"] == "h100"  # plain TOML a person can edit


def test_save_merges_over_existing_values(tmp_path):
    path = tmp_path / "p.toml"
    save_profile(path, gpu="h100", tokenizer="gpt2")
    save_profile(path, gpus_per_node=4)
    assert load_profile(path).values() == {"gpu": "h100", "gpus_per_node": 4, "tokenizer": "gpt2"}


def test_missing_default_profile_is_empty(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "absent.toml"))
    assert load_profile().values() == {}


def test_env_variable_overrides_the_config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "env.toml"))
    assert profile_path() == tmp_path / "env.toml"
    assert profile_path(tmp_path / "explicit.toml") == tmp_path / "explicit.toml"


def test_default_location_is_the_user_config_dir(monkeypatch):
    import platformdirs

    monkeypatch.delenv(PROFILE_ENV, raising=False)
    assert str(profile_path()) == f"{platformdirs.user_config_dir('megapilot')}/profile.toml"


def test_explicitly_named_missing_profile_is_an_error(tmp_path):
    with pytest.raises(MegapilotError, match="profile"):
        load_profile(tmp_path / "nope.toml")


def test_broken_toml_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("gpu = = 'h100'")
    with pytest.raises(MegapilotError, match="not valid TOML"):
        load_profile(path)


def test_bad_value_names_the_field(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("gpus = -3\n")
    with pytest.raises(MegapilotError) as info:
        load_profile(path)
    assert info.value.field == "profile.gpus"


def test_default_note_says_where_the_value_came_from(tmp_path):
    saved = save_profile(tmp_path / "p.toml", gpu="h100")
    assert saved.default_note("gpu") == f"gpu=h100 from profile {tmp_path / 'p.toml'}"
    assert Profile().values() == {}


def test_a_bad_value_in_the_profile_names_its_file_and_the_fix(tmp_path):
    path = tmp_path / "profile.toml"
    path.write_text('gpus = "eight"\n')
    with pytest.raises(MegapilotError) as caught:
        load_profile(path)
    assert caught.value.field == "profile.gpus" and str(path) in caught.value.problem
    assert "megapilot profile set --gpus" in caught.value.fix


@pytest.mark.parametrize(("field", "value"), [("data_path", "data/c4"), ("save_dir", ""), ("save_dir", "ckpt"),
                                               ("tokenizer", ""), ("tokenizer", "  "), ("gpu", "")])
def test_set_refuses_values_a_launch_cannot_use_naming_the_flag(tmp_path, field, value):
    # stored as given, they came back at `script` time as a bad --data-path the user never passed
    path = tmp_path / "p.toml"
    with pytest.raises(MegapilotError) as info:
        save_profile(path, **{field: value})
    assert info.value.field == f"--{field.replace('_', '-')}" and info.value.fix
    assert not path.exists()


def test_a_relative_path_written_into_the_file_is_named_at_load(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('save_dir = "ckpt"\n')
    with pytest.raises(MegapilotError, match="not an absolute path") as info:
        load_profile(path)
    assert info.value.field == "profile.save_dir" and str(path) in info.value.fix
