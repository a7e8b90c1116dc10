"""Whether the logs given as one run can be one run: what each file says of its run, and the files grouped by run.

Each file is read for what one run's logs never disagree on: the model's shape in its `arguments` block (a resume
loads the same model), and, unless the files' iterations continue one another, the world size that block prints
and the `train_iters` total its iteration lines print. Files continue one another when the later one's first
iteration falls inside the earlier one's stretch or right after it (a resume from a checkpoint of that stretch may
change the GPU count or extend the schedule). Rank logs of one run print the same values, or none (a rank that
prints no arguments nor iterations says nothing against any run): they stay one run.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from megapilot.diagnose.findings import Finding, Fix
from megapilot.logs.bulk import RowLine
from megapilot.logs.records import ArgumentsRecord, Evidence, IterationRecord, Record
from megapilot.logs.sources import shown_name

# the arguments that fix the model's shape: a run resumed from a checkpoint keeps every one
SHAPE_ARGUMENTS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "num_experts")


@dataclass
class FileRun:
    """What one file says of its run: the first arguments block it prints and its iteration stretch."""

    file: str
    shape: dict[str, str] = field(default_factory=dict)
    world_size: int | None = None
    train_iters: int | None = None
    first_iteration: int | None = None
    last_iteration: int | None = None
    evidence: dict[str, Evidence] = field(default_factory=dict)  # the line that says each value, by its name

    @property
    def says_anything(self) -> bool:
        return bool(self.shape) or self.world_size is not None or self.train_iters is not None

    def joined(self, other: FileRun) -> FileRun:
        """What the two files say of their one run together: the first said of each value, the stretch of both."""
        firsts = [run.first_iteration for run in (self, other) if run.first_iteration is not None]
        lasts = [run.last_iteration for run in (self, other) if run.last_iteration is not None]
        return FileRun(self.file, self.shape or other.shape,
                       self.world_size if self.world_size is not None else other.world_size,
                       self.train_iters if self.train_iters is not None else other.train_iters,
                       min(firsts, default=None), max(lasts, default=None), {**other.evidence, **self.evidence})

    def continues(self, other: FileRun) -> bool:
        """Whether one of the two files' iterations picks up inside or right after the other's (a resume)."""
        if None in (self.first_iteration, self.last_iteration, other.first_iteration, other.last_iteration):
            return False
        early, late = sorted((self, other), key=lambda run: run.first_iteration or 0)
        assert early.first_iteration is not None and early.last_iteration is not None
        assert late.first_iteration is not None
        return early.first_iteration < late.first_iteration <= early.last_iteration + 1

    def differences(self, other: FileRun) -> list[tuple[str, str]]:
        """What the two files disagree on that one run's logs cannot, as (value's name, what differs): empty when
        they may be one run."""
        said = [(name, f"{name} {self.shape[name]} vs {other.shape[name]}") for name in SHAPE_ARGUMENTS
                if name in self.shape and name in other.shape and self.shape[name] != other.shape[name]]
        if self.continues(other):
            return said
        if self.world_size is not None and other.world_size is not None and self.world_size != other.world_size:
            said.append(("world_size", f"world size {self.world_size} vs {other.world_size}"))
        if self.train_iters is not None and other.train_iters is not None and self.train_iters != other.train_iters:
            said.append(("train_iters", f"train_iters {self.train_iters} vs {other.train_iters}"))
        return said


@dataclass(frozen=True)
class RunGroup:
    """Files of one run, and what set them apart from the groups before them."""

    paths: list[str]
    files: list[FileRun]
    together: FileRun  # what its files say of the run together


class RunFingerprints:
    """Receives the records of a parse (`add`, `add_row`) and keeps, per file, what says which run it is of."""

    def __init__(self) -> None:
        self._files: dict[str, FileRun] = {}

    def _of(self, file: str) -> FileRun:
        return self._files.setdefault(file, FileRun(file))

    def add(self, record: Record) -> None:
        if isinstance(record, ArgumentsRecord):
            run = self._of(record.file)
            if not run.shape and run.world_size is None:  # the first block a file prints: the run it started
                run.shape = {name: record.values[name] for name in SHAPE_ARGUMENTS
                             if record.values.get(name) not in (None, "None")}
                run.world_size = record.world_size
                for name in (*run.shape, "world_size"):
                    line, text = record.value_lines.get(name, (record.line, record.text))
                    run.evidence[name] = Evidence(record.file, line, text)
        elif isinstance(record, IterationRecord):
            self._iteration(record.file, record.iteration, lambda: record)

    def add_row(self, row: RowLine) -> None:
        self._iteration(row.parser.file, row.iteration, row.record)

    def _iteration(self, file: str, iteration: int, record: Callable[[], IterationRecord]) -> None:
        run = self._of(file)
        if run.first_iteration is None:
            first = record()  # the first line of a file only: its total and its evidence
            run.first_iteration = run.last_iteration = iteration
            run.train_iters = first.train_iters
            run.evidence["train_iters"] = Evidence(first.file, first.line, first.text)
            return
        run.last_iteration = max(run.last_iteration or iteration, iteration)

    def groups(self, paths: list[str]) -> list[RunGroup]:
        """The files grouped by run, in the order given: a file joins the first group whose files together (rank 0's
        arguments, the last rank's iterations, a resume's stretch) it does not disagree with; a file that says
        nothing of its run joins the group of the file before it."""
        groups: list[RunGroup] = []
        for path in paths:
            run = self._files.get(shown_name(path)) or FileRun(shown_name(path))
            home = len(groups) - 1 if groups and not run.says_anything else next(
                (index for index, group in enumerate(groups) if not group.together.differences(run)), None)
            if home is None:
                groups.append(RunGroup([path], [run], run))
            else:
                group = groups[home]
                groups[home] = RunGroup([*group.paths, path], [*group.files, run], group.together.joined(run))
        return groups


def differences_between(groups: list[RunGroup]) -> list[tuple[FileRun, FileRun, list[tuple[str, str]]]]:
    """For each group after the first, what an earlier group and it say of their runs, and what differs."""
    told: list[tuple[FileRun, FileRun, list[tuple[str, str]]]] = []
    for index, group in enumerate(groups[1:], start=1):
        pair = next(((earlier.together, group.together, said) for earlier in groups[:index]
                     if (said := earlier.together.differences(group.together))), None)
        if pair is not None:
            told.append(pair)
    return told


def mixed_runs_finding(groups: list[RunGroup], labels: dict[str, str]) -> Finding:
    """The logs given are of `len(groups)` runs: which files, what sets them apart (with the lines that say it), and
    a diagnosis per run to run instead."""
    def name(path: str) -> str:
        return labels.get(path, Path(path).name)

    runs = "; ".join(", ".join(name(path) for path in group.paths) for group in groups)
    shown = {shown_name(path): name(path) for group in groups for path in group.paths}
    told = differences_between(groups)
    said = "; ".join(f"{shown.get(earlier.file, earlier.file)} and {shown.get(later.file, later.file)} differ in "
                     f"{', '.join(text for _, text in values)}" for earlier, later, values in told)
    evidence = [run.evidence[name] for earlier, later, values in told for name, _ in values for run in (earlier, later)
                if name in run.evidence]
    unique = list(dict.fromkeys(evidence))
    return Finding(
        "mixed_runs", "warning", f"The logs are of {len(groups)} different runs, not one: {runs}",
        unique[:6],
        f"{said}: the logs of one run (its ranks, or a resume from its checkpoint) cannot disagree on these. Read as "
        "one run, one run's iterations would hide the other's; each run is judged on its own below, its findings "
        "titled with its files.",
        [Fix("add", "megapilot diagnose " + " ".join(shlex.quote(path) for path in group.paths), None,
             f"diagnose the run of {', '.join(name(path) for path in group.paths)} alone", kind="command")
         for group in groups])
