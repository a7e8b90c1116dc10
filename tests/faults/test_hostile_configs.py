"""Hostile and mistaken configs: each is one line from `suite check` (exit 2 from `suite run`), fast, naming
the field, never a traceback, a RecursionError or a stall; and the hang window in use is stated."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from megapilot.suite.config import check_suite
from megapilot.suite.templates import template_path
from tests.faults.helpers import megapilot_argv


def _tiny(tmp_path: Path) -> tuple[Path, dict]:
    import shutil

    from megapilot.suite.templates import threshold_paths

    for path in threshold_paths("tiny-local"):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / "suite.json", json.loads(template_path("tiny-local").read_text())


def _problems(path: Path) -> list[tuple[str, str]]:
    return [(p.path, p.message) for p in check_suite(path).problems]


@pytest.mark.parametrize(("where", "value", "path"), [
    (("megapilot", "hang_factor"), 0.5, "megapilot.hang_factor"),
    (("train_params", "training_iterations"), str(10**30), "train_params.training_iterations"),
    (("loss_curve", "max_slope"), float("nan"), "loss_curve.max_slope"),
    (("checkpoint", "loss_rtol"), float("inf"), "checkpoint.loss_rtol"),
    (("megapilot", "startup_timeout_s"), 1e30, "megapilot.startup_timeout_s"),
    (("megapilot", "job_timeout_s"), -1, "megapilot.job_timeout_s"),
    (("megapilot", "job_lease_s"), 3, "megapilot.job_lease_s"),
    (("megapilot", "job_lease_s"), float("nan"), "megapilot.job_lease_s"),
    (("checkpoint", "resume_iters"), 3, "checkpoint"),
])
def test_out_of_bounds_values_are_refused_by_check(tmp_path: Path, where: tuple[str, str], value: object,
                                                   path: str) -> None:
    config, data = _tiny(tmp_path)
    data[where[0]][where[1]] = value
    config.write_text(json.dumps(data))  # json writes NaN / Infinity literals, as a hand-edited file may hold
    problems = _problems(config)
    assert problems, f"{path} = {value!r} passed check"
    assert any(p == path or p.startswith(path) or path.startswith(p) for p, _ in problems), problems


def test_hang_factor_below_one_is_a_one_line_error_from_run_not_a_validation_error(tmp_path: Path) -> None:
    config, data = _tiny(tmp_path)
    data["megapilot"]["hang_factor"] = 0.5
    config.write_text(json.dumps(data))
    done = subprocess.run(megapilot_argv("suite", "run", str(config), "--out", str(tmp_path / "runs"),
                                         "--no-history"), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "megapilot.hang_factor" in done.stderr and "ValidationError" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "internal error" not in done.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was created


def test_a_message_names_the_bad_value_once(tmp_path: Path) -> None:
    config, data = _tiny(tmp_path)
    data["train_params"]["training_iterations"] = "twenty"
    config.write_text(json.dumps(data))
    (message,) = [m for p, m in _problems(config) if p == "train_params.training_iterations"]
    assert message.count("twenty") == 1, message


def test_deep_nesting_is_refused_fast_in_json_and_yaml(tmp_path: Path) -> None:
    for name, text in (("deep.json", "[" * 100_000 + "]" * 100_000),
                       ("deep.yaml", "a: " + "[" * 100_000 + "]" * 100_000)):
        path = tmp_path / name
        path.write_text(text)
        started = time.monotonic()
        problems = _problems(path)
        assert time.monotonic() - started < 2.0
        assert problems and "nested more than" in problems[0][1], problems


def test_a_yaml_alias_bomb_is_refused_fast(tmp_path: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    problems = _problems(path)
    assert time.monotonic() - started < 5.0
    assert problems and "aliases" in problems[0][1], problems


def test_a_few_yaml_aliases_are_still_fine(tmp_path: Path) -> None:
    from megapilot.suite.parsing import parse_yaml

    assert parse_yaml("base: &b {x: 1}\nother: *b\n") == {"base": {"x": 1}, "other": {"x": 1}}


def test_the_hang_window_is_stated_with_where_each_number_came_from(tmp_path: Path) -> None:
    config, data = _tiny(tmp_path)
    data["megapilot"]["hang_min_window_s"] = 30
    config.write_text(json.dumps(data))
    done = subprocess.run(megapilot_argv("suite", "check", str(config), "--json"), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    window = json.loads(done.stdout)["hang_window"]
    assert "20 x the observed step time (megapilot.hang_factor, config)" in window
    assert "at least 30 s (megapilot.hang_min_window_s, config)" in window
