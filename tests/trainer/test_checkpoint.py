"""Checkpoint bookkeeping that needs no process group: directory names, the tracker file, refusals.

Saving and loading themselves are collective; they run in the training tests (tests/e2e, tests/diagnose).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.trainer import checkpoint
from megapilot.trainer.checkpoint import TRACKER_FILE, iteration_dir, latest_iteration, load_checkpoint


class _Log:
    """Collects what the loader would print, as the trainer's `log(line, rank_zero_only=...)` does."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str, rank_zero_only: bool = False) -> None:
        self.lines.append(line)


def _tracker(root: Path, text: str) -> Path:
    (root / TRACKER_FILE).write_text(text)
    return root


def test_iteration_directories_are_named_as_megatron_lm_names_them():
    assert iteration_dir("/ckpt", 10) == Path("/ckpt/iter_0000010")
    assert iteration_dir("/ckpt", 0).name == "iter_0000000"
    assert iteration_dir("/ckpt", 12345678).name == "iter_12345678"  # more than 7 digits is not truncated


def test_the_tracker_file_is_megatron_lms():
    assert TRACKER_FILE == "latest_checkpointed_iteration.txt"


def test_one_virtual_stage_is_saved_as_model_and_several_as_model0_model1():
    assert checkpoint._model_key(0, 1) == "model"
    assert [checkpoint._model_key(i, 3) for i in range(3)] == ["model0", "model1", "model2"]


def test_no_tracker_means_no_checkpoint(tmp_path):
    assert latest_iteration(str(tmp_path)) is None
    assert latest_iteration(str(tmp_path / "never-created")) is None


@pytest.mark.parametrize(("text", "iteration"), [("10\n", 10), ("0", 0), ("  250  \n", 250)])
def test_the_tracker_names_the_newest_iteration(tmp_path, text, iteration):
    assert latest_iteration(str(_tracker(tmp_path, text))) == iteration


@pytest.mark.parametrize("text", ["", "release", "-1", "1e3", "10\n20", "²"])
def test_a_tracker_that_is_not_an_iteration_number_is_refused_naming_load(tmp_path, text):
    with pytest.raises(MegapilotError, match="not an iteration number") as err:
        latest_iteration(str(_tracker(tmp_path, text)))
    assert err.value.field == "--load"
    assert "--save" in err.value.fix


def test_loading_from_an_empty_directory_warns_as_megatron_does_and_starts_from_random(tmp_path):
    log = _Log()
    loaded = load_checkpoint(str(tmp_path), model=None, optimizer=None, scheduler=None, with_optimizer=True,
                             with_rng=True, finetune=False, log=log)
    assert loaded is None
    assert log.lines == [f"WARNING: could not find the metadata file {tmp_path}/{TRACKER_FILE}",
                         "    will not load any checkpoints and will start from random"]


def test_asking_for_an_iteration_that_was_not_saved_is_refused_naming_ckpt_step(tmp_path):
    iteration_dir(str(tmp_path), 10).mkdir()
    _tracker(tmp_path, "10\n")
    with pytest.raises(MegapilotError, match="iter_0000020 does not exist") as err:
        load_checkpoint(str(tmp_path), model=None, optimizer=None, scheduler=None, with_optimizer=True,
                        with_rng=True, finetune=False, log=_Log(), step=20)
    assert err.value.field == "--ckpt-step"
