"""Resuming an interrupted suite run: which run, and whether this config may continue it.

What a resume keeps and re-runs is the lifecycle's (`run_suite` with `RunRequest.resume_from`): every
stage and combo the run finished is kept as it was, the one it was interrupted in runs again from
scratch. Here: finding the run (`latest` is the newest run directory under `--out`) and refusing a
config that is not the one the run started with, since its kept results would not be this config's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from megapilot.errors import MegapilotError
from megapilot.suite.results import SUITE_RESULT_NAME, SuiteResult

if TYPE_CHECKING:
    from megapilot.suite.config import LoadedSuite


def latest_run_dir(out_dir: Path) -> Path:
    """The newest run directory under `out_dir` (run ids sort by their UTC start time)."""
    runs = sorted(p for p in Path(out_dir).glob(f"*/{SUITE_RESULT_NAME}") if p.is_file())
    if not runs:
        raise MegapilotError(f"no run under {out_dir} to resume", field="--resume",
                             fix="pass the --out the run used, or its run id / run directory")
    return max(runs, key=lambda p: (p.parent.name, p.stat().st_mtime)).parent


def check_resumable(previous: SuiteResult, suite: LoadedSuite) -> None:
    """Refuse to continue a run with another config: its kept stages would not be this config's."""
    if previous.card.config_hash and previous.card.config_hash != suite.config_hash:
        raise MegapilotError(f"run {previous.run_id} was started with another config (or threshold file) than "
                             f"{suite.config_path.name} as it is now", field="--resume",
                             fix="resume with the config the run started with, or start a new run without --resume")


__all__ = ["check_resumable", "latest_run_dir"]
