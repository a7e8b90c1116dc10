"""Reading a suite config as CVS does: the file and its format, placeholders, `<changeme>` values, the cluster file,
and the words a validation error is reported in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from megapilot.suite.config import SuiteCheck
from megapilot.suite.config_read import (
    VALIDATOR_FIX,
    _dotted,
    _exempt_unused_checkpoint,
    _fix_of,
    _message,
    _read_cluster,
    _read_config,
    changeme_paths,
    edit_distance,
    near_key,
    resolve_placeholders,
    section_keys,
    unknown_key,
    unset_path_variables,
)


def _read(path: Path) -> tuple[dict | None, SuiteCheck]:
    check = SuiteCheck()
    return _read_config(path, check), check


def test_json_and_yaml_by_suffix_with_comment_keys_dropped(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"_comment": "x", "gpu_name": "MI325X", "smoke": {"_c": 1, "iters": 5}}')
    (tmp_path / "a.YML").write_text("_comment: x\ngpu_name: MI325X\nsmoke:\n  _c: 1\n  iters: 5\n")
    assert _read(tmp_path / "a.json")[0] == _read(tmp_path / "a.YML")[0] == {"gpu_name": "MI325X",
                                                                             "smoke": {"iters": 5}}


def test_each_unreadable_file_is_one_problem_at_config(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.yaml").write_text("a: [1, 2\n")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{")
    for name, words in (("missing.json", "cannot read"), ("list.json", "holds a list, not a mapping"),
                        ("broken.yaml", "is not valid YAML"), ("binary.json", "cannot read")):
        raw, check = _read(tmp_path / name)
        assert raw is None and [p.path for p in check.problems] == ["config"], name
        assert words in check.problems[0].message and "\n" not in check.problems[0].message, name


def test_an_empty_file_or_a_bare_value_is_said_in_json_words_not_pythons(tmp_path: Path) -> None:
    for name, text, words in (("empty.json", "", "is empty"), ("blank.yaml", "  \n", "is empty"),
                              ("null.json", "null", "holds null (nothing), not a mapping"),
                              ("number.yaml", "3", "holds a number, not a mapping")):
        (tmp_path / name).write_text(text)
        raw, check = _read(tmp_path / name)
        assert raw is None and [p.path for p in check.problems] == ["config"], name
        assert words in check.problems[0].message and "NoneType" not in check.problems[0].message, name


def test_a_comment_in_a_json_config_says_to_write_a_comment_key(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text('{\n  "gpu_name": "CPU", // laptop\n  "smoke": {}\n}')
    _raw, check = _read(tmp_path / "c.json")
    assert 'a comment at line 2, which JSON does not allow; write it as a "_comment" key' in check.problems[0].message


def test_a_json_key_given_twice_is_a_problem_naming_it(tmp_path: Path) -> None:
    (tmp_path / "dup.json").write_text('{"gpu_name": "MI300X", "smoke": {}, "gpu_name": "MI325X"}')
    raw, check = _read(tmp_path / "dup.json")
    assert raw == {"gpu_name": "MI325X", "smoke": {}}  # as JSON reads it: the last one
    assert [(p.path, p.message) for p in check.problems] == [
        ("config", "key 'gpu_name' appears more than once; only the last one would count")]


def test_a_yaml_key_given_twice_is_the_same_problem(tmp_path: Path) -> None:
    # YAML too keeps the last one silently: gpu_name CPU, then MI300X further down, was read as MI300X
    (tmp_path / "dup.yaml").write_text("gpu_name: CPU\nsmoke: {}\ngpu_name: MI300X\n")
    _raw, check = _read(tmp_path / "dup.yaml")
    assert [(p.path, p.message) for p in check.problems] == [
        ("config", "key 'gpu_name' appears more than once; only the last one would count")]


def test_a_non_finite_number_is_named_at_its_path(tmp_path: Path) -> None:
    (tmp_path / "nan.json").write_text('{"loss_curve": {"max_slope": NaN}}')
    raw, check = _read(tmp_path / "nan.json")
    assert raw is None and [p.path for p in check.problems] == ["loss_curve.max_slope"]
    assert check.problems[0].fix == "write a finite number"


def test_placeholder_passes_user_paths_and_cross_block() -> None:
    raw = {"paths": {"root": "/home/{user-id}/x", "log_dir": "{root}/logs", "deep": "{log_dir}/a",
                     "rel": "data"},
           "container": {"env": {"LOGS": "{paths.log_dir}", "OTHER": "{unknown}"}}}
    out = resolve_placeholders(raw, "alice", Path("/cfg"))
    assert out["paths"]["log_dir"] == "/home/alice/x/logs"
    assert out["paths"]["deep"] == "/home/alice/x/logs/a"
    assert out["paths"]["rel"] == "/cfg/data"
    assert out["container"]["env"] == {"LOGS": "/home/alice/x/logs", "OTHER": "{unknown}"}


def test_unfilled_home_and_absolute_paths_are_not_anchored() -> None:
    paths = {"a": "<changeme>/x", "b": "~/data", "c": "/abs", "d": "", "e": "{missing}/y"}
    assert resolve_placeholders({"paths": paths}, "u", Path("/cfg"))["paths"] == {**paths,
                                                                               "b": str(Path.home() / "data")}


def test_home_and_environment_variables_in_paths_are_expanded_as_a_shell_would(monkeypatch: pytest.MonkeyPatch) -> None:
    # no shell sees these later (they are quoted into the jobs' commands, or opened here): `~/.hf_token` was never
    # found, so the token was neither used nor masked, and `$HOME/logs` was anchored as <config folder>/$HOME/logs
    monkeypatch.setenv("HOME", "/users/alice")
    monkeypatch.setenv("SCRATCH", "/scratch/alice")
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    paths = {"hf_token_file": "~/.hf_token", "log_dir": "$HOME/logs", "data_cache_dir": "${SCRATCH}/cache",
             "scripts_dir": "$NOT_SET_HERE/scripts"}
    raw = resolve_placeholders({"paths": paths}, "alice", Path("/cfg"))
    assert raw["paths"] == {"hf_token_file": "/users/alice/.hf_token", "log_dir": "/users/alice/logs",
                            "data_cache_dir": "/scratch/alice/cache", "scripts_dir": "$NOT_SET_HERE/scripts"}
    assert unset_path_variables(raw) == [("paths.scripts_dir", "$NOT_SET_HERE")]


def test_an_unused_checkpoint_drops_its_dir_and_unfilled_volumes() -> None:
    def raw(enforce: object) -> dict:
        return {"checkpoint": {"enforce": enforce, "checkpoint_dir": "<changeme>"},
                "container": {"runtime": {"args": {"volumes": ["/data:/data", "<changeme>:<changeme>"]}}}}
    off = raw("false")
    _exempt_unused_checkpoint(off)
    assert off["checkpoint"] == {"enforce": "false"}
    assert off["container"]["runtime"]["args"]["volumes"] == ["/data:/data"]
    for enforced in (True, "yes", "1"):
        on = raw(enforced)
        _exempt_unused_checkpoint(on)
        assert on == raw(enforced), enforced  # checkpoint testing on: every field must be filled


def test_changeme_paths_are_dotted_with_list_indices_and_any_case() -> None:
    raw = {"gpu_name": "<changeme>", "container": {"env": {"A": "x", "B": "10.0.0.1 <CHANGEME>"},
                                                   "runtime": {"args": {"volumes": ["/a:/a", "<changeme>:/b"]}}},
           "n": 3}
    assert changeme_paths(raw) == ["gpu_name", "container.env.B", "container.runtime.args.volumes[1]"]
    assert changeme_paths({"a": ["ok", {"b": "fine"}]}) == []


def test_the_cluster_file_is_read_or_its_problem_reported(tmp_path: Path) -> None:
    check = SuiteCheck()
    assert _read_cluster(None, check) is None and check.problems == []
    assert _read_cluster(tmp_path / "nope.json", check) is None
    assert [p.path for p in check.problems] == ["cluster"]
    (tmp_path / "cluster.json").write_text(json.dumps({"username": "bob", "head_node_dict": {"mgmt_ip": "n1"},
                                                       "node_dict": {"n1": {}, "n2": {}}}))
    cluster = _read_cluster(tmp_path / "cluster.json", SuiteCheck())
    assert cluster is not None and cluster.username == "bob"


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    sizes: list[int]
    inner: dict[str, int]


def _errors(data: dict) -> dict:
    try:
        _Shape.model_validate(data)
    except ValidationError as exc:
        return {_dotted(e["loc"]): e for e in exc.errors()}
    raise AssertionError("valid")


def test_validation_errors_read_as_a_path_a_message_and_a_fix() -> None:
    errors = _errors({"sizes": [1, "two"], "inner": {"k": "x" * 100}, "colour": "red"})
    assert set(errors) == {"name", "sizes[1]", "inner.k", "colour"}
    assert _fix_of(errors["name"], "name").startswith("add `name`")
    assert _fix_of(errors["name"], "smoke.iters") == "add `iters` under `smoke`"
    assert _fix_of(errors["sizes[1]"], "sizes[1]") == "fix the value's type or spelling"
    assert _message(errors["colour"]) == "unknown key"  # the key is the problem, not its value
    assert _message(errors["colour"], ["color", "name"]) == "unknown key (did you mean color?)"
    assert _fix_of(errors["colour"], "colour", ["color", "name"]) == "rename it to color"
    assert _fix_of(errors["colour"], "colour", ["name", "sizes"]) == "remove it, or use one of: name, sizes"
    assert _message(errors["sizes[1]"]).endswith("(got 'two')")
    long = _message(errors["inner.k"])
    assert long.endswith("...)") and len(long) < 150  # a huge value is cut short, not reprinted
    assert "got" not in _message(errors["name"])  # a missing field has no value to show


def test_a_value_out_of_bounds_gets_the_bound_and_a_wrong_choice_the_choices_once(cli, tmp_path: Path) -> None:
    config = tmp_path / "suite.json"
    assert cli("suite", "init", "tiny-local", "-o", str(config)).exit_code == 0
    data = json.loads(config.read_text())
    data["megapilot"].update(gpus_per_node=-2, executor="slurmm")
    config.write_text(json.dumps(data))
    problems = {p["path"]: p for p in cli("suite", "check", str(config), "--json").json()["problems"]}
    assert problems["megapilot.gpus_per_node"]["fix"] == "give a value that is greater than 0"
    executor = problems["megapilot.executor"]
    assert executor["message"].count("slurmm") == 1 and executor["fix"] == "use one of: local, slurm, ssh"


# ---- unknown keys ---------------------------------------------------------------------------------------------
LAYOUT = ["tensor_parallelism", "pipeline_parallelism", "fsdp", "model_name", "precision"]


def test_edit_distance_counts_a_swap_of_neighbours_as_one_edit() -> None:
    assert edit_distance("paralellism", "parallelism") == 1
    assert edit_distance("pipline", "pipeline") == 1
    assert edit_distance("abc", "abc") == 0 and edit_distance("", "abc") == 3


def test_a_slip_of_a_known_key_is_named_and_a_foreign_key_is_nobodys() -> None:
    assert near_key("pipline_parallelism", LAYOUT) == "pipeline_parallelism"
    assert near_key("tensor_paralellism", LAYOUT) == "tensor_parallelism"
    assert near_key("Tensor-Parallelism", LAYOUT) == "tensor_parallelism"
    assert near_key("fsd", LAYOUT) == "fsdp"
    assert near_key("tp", LAYOUT, {"tp": "tensor_parallelism"}) == "tensor_parallelism"
    for foreign in ("name", "result_dict", "data_parallelism", "model_size_b", "mode"):
        assert near_key(foreign, LAYOUT) is None, foreign


def test_an_unknown_key_is_said_with_its_near_match_or_the_keys_there_are() -> None:
    assert unknown_key("exectuor", ["executor", "nodes"]) == ("unknown key (did you mean executor?)",
                                                             "rename it to executor")
    assert unknown_key("colour", ["name", "sizes"]) == ("unknown key", "remove it, or use one of: name, sizes")
    message, fix = unknown_key("colour", [f"key{i}" for i in range(20)])
    assert message == "unknown key" and fix.startswith("remove it") and "key19" not in fix


def test_section_keys_follow_the_models_fields_through_optional_sections() -> None:
    from megapilot.suite.config import SuiteConfig

    assert "executor" in section_keys(SuiteConfig, ("megapilot",))
    assert "image" in section_keys(SuiteConfig, ("container",))  # ContainerSpec | None
    assert "network" in section_keys(SuiteConfig, ("container", "runtime", "args"))
    assert section_keys(SuiteConfig, ("nowhere",)) == []
    assert "megapilot" in section_keys(SuiteConfig, ())


def test_a_validator_that_says_its_fix_has_it_as_the_fix_not_in_the_message() -> None:
    error = {"type": "value_error", "loc": ("resume_iters",), "input": 5,
             "msg": f"Value error, resume_iters (5) must be past save_iters (10){VALIDATOR_FIX}"
                    "set resume_iters above 10"}
    assert _message(error) == "resume_iters (5) must be past save_iters (10)"
    assert _fix_of(error, "checkpoint.resume_iters") == "set resume_iters above 10"
