"""Copies each combo's node logs into `<run_dir>/logs/` so the report links to files that travel with it.

A job's logs live at `<run_dir>/<combo dir>/out-node<N>/training.log` (execute.rundir); the copy goes to
`<run_dir>/logs/<combo dir>/node<N>.log`, one flat folder a user can zip with report.html. The paths
come from suite.json, which a user may have edited or another tool written: a path that leaves the run
directory is not followed.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from megapilot.suite.results import ComboResult, SuiteResult

LOGS_DIR_NAME = "logs"
_NODE_DIR = re.compile(r"out-node(\d+)\Z")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._=,+-]")


@dataclass(frozen=True)
class LogLink:
    """A copied node log: which combo and node, and its path relative to the run directory (the link)."""

    combo: str
    node: int
    href: str


def copy_combo_logs(result: SuiteResult, run_dir: Path) -> dict[str, list[LogLink]]:
    """Copy every combo's node logs under `<run_dir>/logs/`; returns the links by combo key."""
    links: dict[str, list[LogLink]] = {}
    for combo in result.combos:
        links[combo.key] = [_copy(combo.key, combo.directory, source, index, run_dir)
                            for index, source in enumerate(_node_logs(combo, run_dir))]
    return links


def copy_stage_logs(result: SuiteResult, run_dir: Path) -> dict[str, list[LogLink]]:
    """Copy the logs of the stages' own jobs (checkpoint save and resume) under `<run_dir>/logs/<job dir>/`;
    returns the links by stage name."""
    root = run_dir.resolve()
    links: dict[str, list[LogLink]] = {}
    for stage in result.stages:
        for job in stage.jobs:
            sources = [run_dir / name for name in job.logs]
            for index, source in enumerate(p for p in sources if _inside(p, root) and p.is_file()):
                folder = PurePosixPath(job.logs[0]).parts[0] if job.logs else stage.name
                links.setdefault(stage.name, []).append(_copy(stage.name, folder, source, index, run_dir))
    return links


def _node_logs(combo: ComboResult, run_dir: Path) -> list[Path]:
    """The job's logs as suite.json lists them, else the `out-node*/training.log` files of its directory."""
    root = run_dir.resolve()
    listed = combo.job.logs if combo.job else []
    candidates = [run_dir / name for name in listed] or sorted(
        (run_dir / combo.directory).glob("out-node*/training.log"), key=_node_number)
    return [path for path in candidates if _inside(path, root) and path.is_file()]


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except OSError:
        return False


def _node_number(path: Path, fallback: int = 0) -> int:
    match = _NODE_DIR.match(path.parent.name)
    return int(match.group(1)) if match else fallback


def _copy(key: str, directory: str, source: Path, index: int, run_dir: Path) -> LogLink:
    node = _node_number(source, fallback=index)  # a log outside out-node<N> is numbered by its place in the list
    folder = _UNSAFE_NAME.sub("_", PurePosixPath(directory).name or key) or "combo"
    relative = PurePosixPath(LOGS_DIR_NAME, folder, f"node{node}.log")
    target = run_dir / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return LogLink(combo=key, node=node, href=str(relative))


__all__ = ["LOGS_DIR_NAME", "LogLink", "copy_combo_logs", "copy_stage_logs"]
