"""suite.resume: which run `--resume` continues, and refusing a config the run did not start with."""

from __future__ import annotations

import os

import pytest

from megapilot.errors import MegapilotError
from megapilot.suite.config import load_suite
from megapilot.suite.resume import check_resumable, latest_run_dir
from tests.report.factory import suite_result
from tests.suite.cvs_files import SINGLE_8B, filled_in, raw_cvs, write_suite


def _run(out, run_id: str, mtime_s: float):
    folder = out / run_id
    folder.mkdir(parents=True)
    (folder / "suite.json").write_text("{}")
    os.utime(folder / "suite.json", (mtime_s, mtime_s))
    return folder


def test_latest_is_the_newest_run_id_whatever_the_file_times_say(tmp_path):
    _run(tmp_path, "20260301-090000-tiny", 2_000_000_000)
    newest = _run(tmp_path, "20260302-090000-tiny", 1_000_000_000)
    (tmp_path / "20260303-090000-no-suite-json").mkdir()
    assert latest_run_dir(tmp_path) == newest


def test_no_run_to_resume_is_a_user_error_naming_resume(tmp_path):
    with pytest.raises(MegapilotError) as caught:
        latest_run_dir(tmp_path)
    assert caught.value.field == "--resume" and str(tmp_path) in caught.value.problem


def test_a_run_continues_only_with_the_config_it_started_with(tmp_path):
    suite = load_suite(write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B))
    previous = suite_result(tmp_path)
    previous.card = previous.card.model_copy(update={"config_hash": suite.config_hash})
    check_resumable(previous, suite)
    previous.card = previous.card.model_copy(update={"config_hash": "cd" * 32})
    with pytest.raises(MegapilotError, match=f"started with another config .* than {suite.config_path.name}"):
        check_resumable(previous, suite)
    previous.card = previous.card.model_copy(update={"config_hash": ""})  # an old run without a hash: trusted
    check_resumable(previous, suite)
