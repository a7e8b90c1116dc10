"""Whether the logs given as one run can be one run: what each file (or each run within a file) says of its run, and
the files grouped by run.

Each file is read for what one run's logs never disagree on: the model's shape in its `arguments` block (a resume
loads the same model), and, unless the files' iterations continue one another, the world size that block prints,
the `train_iters` total its iteration lines print, the log interval its iterations step by, and when each iteration
was logged. Files continue one another when the later one's first iteration falls inside the earlier one's stretch or
right after it (a resume from a checkpoint of that stretch may change the GPU count, the log interval or extend the
schedule), unless the later one starts afresh: its first line is the first its own log interval logs from iteration
0 (10 of a run logging every 10) while the earlier run had logged past it (a resume continues from its checkpoint,
its iteration count and consumed samples with it), and it did not say it loaded a checkpoint of an iteration past 0
before that line (a resume from a checkpoint inside its first log interval logs the same first line as a fresh run;
Megatron's `successfully loaded checkpoint ... at iteration N` tells them apart, N being 0 for a fine-tune, whose
count starts over). Consumed samples do not tell the two apart: with the same batch size a fresh run and a resume
print the same count at each iteration. Rank logs of one run print the same
values, or none (a rank that prints no arguments nor iterations says nothing against any run), and log each iteration
at the same time: they stay one run. Two runs of the same model from scratch print the same values too; their
timestamps for the same iteration tell them apart.

One file may hold several runs one after the other (a job script that trains twice, a log a resubmitted job appends
to): a start-up (an `arguments` block, `training ...`) after iterations, followed by an iteration count that starts
over, begins a new run there, and so does one whose first two lines show it started afresh (as between files). A
start-up whose count continues (a resume from a checkpoint) stays the same run. A rank's file that prints no
start-up (only rank 0 does) begins a new run where its count starts over all the same, unless the lines that go back
are another rank's copies of the iterations (logged at the same time, or by another rank).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from megapilot.diagnose.findings import Finding, Fix
from megapilot.logs.bulk import RowLine
from megapilot.logs.records import (
    ArgumentsRecord,
    CheckpointEvent,
    Evidence,
    IterationRecord,
    ProgressMarker,
    Record,
)
from megapilot.logs.sources import shown_name

# the arguments that fix the model's shape: a run resumed from a checkpoint keeps every one
SHAPE_ARGUMENTS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "num_experts")
# Rank copies of one run log an iteration within a step of each other (clocks of one cluster agree to a second);
# two runs log it this far apart at least: a minute, or ten steps of the slower run.
APART_FLOOR_S = 60.0
APART_STEPS = 10
MAX_TIMED = 32  # the first timed iterations kept per run: enough to find ones two logs share
# markers a run prints while it starts (the parser's `training_started` and start-up `stall_point:` markers)
STARTUP_MARKERS = ("training_started", "stall_point:")


@dataclass(frozen=True)
class Difference:
    """What two runs' logs disagree on that one run's logs cannot: its name, how it reads, the lines that say it."""

    name: str
    text: str
    evidence: tuple[Evidence, ...]


@dataclass
class FileRun:
    """What one file says of its run: the first arguments block it prints, its iteration stretch and when its first
    iterations were logged. A file that holds several runs has one per run, each with the lines it spans."""

    file: str
    shape: dict[str, str] = field(default_factory=dict)
    world_size: int | None = None
    train_iters: int | None = None
    first_iteration: int | None = None
    last_iteration: int | None = None
    evidence: dict[str, Evidence] = field(default_factory=dict)  # the line that says each value, by its name
    times: dict[int, tuple[float, Evidence]] = field(default_factory=dict)  # iteration → when it was logged
    first_line: int = 1  # the lines of the file this run spans (last None: to the file's end)
    last_line: int | None = None
    started_over: StartOver | None = None  # how this run began after another in the same file
    rank: int | None = None  # the rank its first iteration line names, if any
    interval: int | None = None  # the log interval: what its iteration numbers step by (their greatest common step)
    resumed_from: int | None = None  # the iteration of the checkpoint it said it loaded before its first iteration

    @property
    def says_anything(self) -> bool:
        return bool(self.shape) or self.world_size is not None or self.train_iters is not None or bool(self.times)

    @property
    def whole_file(self) -> bool:
        return self.first_line == 1 and self.last_line is None

    @property
    def window(self) -> tuple[int, int | None]:
        return self.first_line, self.last_line

    @property
    def step_s(self) -> float | None:
        """Seconds per iteration between its first and last timed iterations; None with fewer than two."""
        if len(self.times) < 2:
            return None
        first, last = min(self.times), max(self.times)
        return max(0.0, self.times[last][0] - self.times[first][0]) / (last - first)

    def joined(self, other: FileRun) -> FileRun:
        """What the two files say of their one run together: the first said of each value, the stretch of both."""
        firsts = [run.first_iteration for run in (self, other) if run.first_iteration is not None]
        lasts = [run.last_iteration for run in (self, other) if run.last_iteration is not None]
        times = dict(sorted({**other.times, **self.times}.items())[:MAX_TIMED])
        return FileRun(self.file, self.shape or other.shape,
                       self.world_size if self.world_size is not None else other.world_size,
                       self.train_iters if self.train_iters is not None else other.train_iters,
                       min(firsts, default=None), max(lasts, default=None), {**other.evidence, **self.evidence},
                       times, interval=self.interval if self.interval is not None else other.interval)

    @property
    def starts_afresh(self) -> bool:
        """Whether its first line is the first its log interval logs from iteration 0 (Megatron logs the iterations
        that are multiples of it): a run from scratch's first line, unless it loaded a checkpoint past iteration 0
        first (a resume from a checkpoint inside its first log interval logs that same line)."""
        return not self.resumed_from and self.interval is not None and self.first_iteration == self.interval

    @property
    def began(self) -> int | None:
        """The first iteration it ran, as far as its log says: the one after the checkpoint it loaded, 1 for a run
        whose first line is its log interval's first from 0, else its first logged."""
        if self.resumed_from:
            return self.resumed_from + 1
        return 1 if self.starts_afresh else self.first_iteration

    def continues(self, other: FileRun) -> bool:
        """Whether one of the two files' iterations picks up inside or right after the other's (a resume). A run
        that began at 1 (its count started from 0) continues none: where the other had logged past its start, it is
        a run of its own."""
        if None in (self.first_iteration, self.last_iteration, other.first_iteration, other.last_iteration):
            return False
        early, late = sorted((self, other), key=lambda run: run.began or 0)
        assert early.began is not None and early.last_iteration is not None and late.began is not None
        return early.began < late.began <= early.last_iteration + 1

    def differences(self, other: FileRun) -> list[Difference]:
        """What the two files disagree on that one run's logs cannot: empty when they may be one run."""
        said = [self._difference(other, name, f"{name} {self.shape[name]} vs {other.shape[name]}")
                for name in SHAPE_ARGUMENTS
                if name in self.shape and name in other.shape and self.shape[name] != other.shape[name]]
        if self.continues(other):  # a resume may change the GPU count, extend the schedule, and runs later
            return said
        if self.world_size is not None and other.world_size is not None and self.world_size != other.world_size:
            said.append(self._difference(other, "world_size", f"world size {self.world_size} vs {other.world_size}"))
        if self.train_iters is not None and other.train_iters is not None and self.train_iters != other.train_iters:
            said.append(self._difference(other, "train_iters",
                                         f"train_iters {self.train_iters} vs {other.train_iters}"))
        if self.interval is not None and other.interval is not None and self.interval != other.interval:
            said.append(self._difference(other, "log_interval", f"log interval {self.interval} vs {other.interval}"))
        apart = self._apart_in_time(other)
        return said + ([apart] if apart is not None else [])

    def _difference(self, other: FileRun, name: str, text: str) -> Difference:
        return Difference(name, text, tuple(run.evidence[name] for run in (self, other) if name in run.evidence))

    def apart_s(self, other: FileRun | None = None) -> float:
        """How far apart two runs log the same iteration at least (rank copies of one run log it closer)."""
        step = max(self.step_s or 0.0, other.step_s or 0.0 if other is not None else 0.0)
        return max(APART_FLOOR_S, APART_STEPS * step)

    def _apart_in_time(self, other: FileRun) -> Difference | None:
        """The iterations both logged, logged far apart (more than a minute and ten steps at the closest): the same
        iterations run twice, by two runs, where rank copies of one run log each at the same time."""
        shared = set(self.times) & set(other.times)
        if not shared:
            return None
        iteration = min(shared, key=lambda at: abs(self.times[at][0] - other.times[at][0]))
        gap = abs(self.times[iteration][0] - other.times[iteration][0])
        step = max(self.step_s or 0.0, other.step_s or 0.0)
        if gap <= self.apart_s(other):
            return None
        pace = f" (a step takes {step:.0f} s)" if step else ""
        return Difference("logged_at", f"iteration {iteration} logged {_duration(gap)} apart{pace}",
                          (self.times[iteration][1], other.times[iteration][1]))


@dataclass(frozen=True)
class StartOver:
    """Where a run began in a file after another run: its first start-up line (None: the file prints none, a rank's
    but rank 0's), the iteration the run before it had reached, and its own first iteration (the count started
    over)."""

    startup: Evidence | None
    after_iteration: int
    first_iteration: Evidence


def _merge(run: FileRun, resume: FileRun) -> None:
    """`resume`'s iterations, read apart until they told it is no run of its own, into the run it resumes."""
    run.last_iteration = max(filter(None, (run.last_iteration, resume.last_iteration)), default=None)
    for iteration, timed in sorted(resume.times.items()):
        if len(run.times) < MAX_TIMED:
            run.times.setdefault(iteration, timed)


def _copied(run: FileRun, first: IterationRecord) -> bool:
    """Whether `first`, an iteration `run` logged already, is another rank's copy of it rather than a new run's:
    logged at the same time as the run's (a rank's copy is, a new run's comes later), or, untimed, by another rank."""
    if first.time_s is not None and first.iteration in run.times:
        return abs(first.time_s - run.times[first.iteration][0]) <= run.apart_s()
    return None not in (first.rank, run.rank) and first.rank != run.rank


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


@dataclass
class _Startup:
    """A start-up read in a file after its run logged iterations: a new run's, or a resume's (its iteration count
    tells, once it logs one). `run` is the run it would begin; the checkpoint it loaded, when it says."""

    run: FileRun
    evidence: Evidence
    loaded_iteration: int | None = None  # it loaded a checkpoint of this iteration: a resume
    no_checkpoint: bool = False  # it found none to load: a start from scratch

    def starts_over(self, before: FileRun, iteration: int) -> bool:
        """Whether `iteration`, the first it logs, begins a run of its own rather than resuming `before`: the count
        went back to where `before` began or lower (a resume continues from its checkpoint, inside or after the
        stretch), unless it says it loaded a checkpoint; with no checkpoint found, any count that went back."""
        if self.loaded_iteration or before.first_iteration is None or before.last_iteration is None:
            return False
        return iteration <= (before.last_iteration if self.no_checkpoint else before.first_iteration)

    def may_start_afresh(self, before: FileRun, iteration: int) -> bool:
        """Whether `iteration`, the first it logs, inside `before`'s stretch, may yet begin a run of its own: its
        next iteration tells whether it is the first of its log interval (`FileRun.starts_afresh`)."""
        return not self.loaded_iteration and before.last_iteration is not None and iteration <= before.last_iteration


@dataclass(frozen=True)
class RunGroup:
    """Files (or a file's runs) of one run, and what set them apart from the groups before them."""

    paths: list[str]
    files: list[FileRun]
    together: FileRun  # what its files say of the run together

    @property
    def windows(self) -> dict[str, tuple[int, int | None]]:
        """The lines to read of each file that holds more than this run (`parse_logs`'s `windows`)."""
        return {path: run.window for path, run in zip(self.paths, self.files, strict=True) if not run.whole_file}

    def name(self, labels: dict[str, str]) -> str:
        """`a.log, b.log`, a file's part of it as `c.log (lines 1-40)` or `c.log (from line 41)`."""
        return ", ".join(_part_name(path, run, labels) for path, run in zip(self.paths, self.files, strict=True))


def _part_name(path: str, run: FileRun, labels: dict[str, str]) -> str:
    name = labels.get(path, Path(path).name)
    if run.whole_file:
        return name
    if run.last_line is None:
        return f"{name} (from line {run.first_line})"
    return f"{name} (lines {run.first_line}-{run.last_line})"


class RunFingerprints:
    """Receives the records of a parse (`add`, `add_row`) and keeps, per file, what says which run it is of: one
    `FileRun` per run the file holds."""

    def __init__(self) -> None:
        self._files: dict[str, list[FileRun]] = {}
        self._startups: dict[str, _Startup] = {}  # a start-up after a file's iterations, until its first iteration

    def _current(self, file: str) -> FileRun:
        return self._files.setdefault(file, [FileRun(file)])[-1]

    def add(self, record: Record) -> None:
        if isinstance(record, ArgumentsRecord):
            # the record is read at the block's end; the block begins on its header, the line before its first value
            line, text = min(record.value_lines.values(), default=(record.line + 1, record.text))
            self._starting(record.file, line - 1, Evidence(record.file, min(line, record.line), text))
            startup = self._startups.get(record.file)
            self._arguments(startup.run if startup is not None else self._current(record.file), record)
        elif isinstance(record, ProgressMarker) and record.marker.startswith(STARTUP_MARKERS):
            self._starting(record.file, record.line, Evidence(record.file, record.line, record.text))
        elif isinstance(record, CheckpointEvent) and record.kind == "load":
            # Megatron loads a checkpoint only while it starts: a load after iterations is a start-up's
            self._starting(record.file, record.line, Evidence(record.file, record.line, record.text))
            startup = self._startups.get(record.file)
            if startup is not None and record.phase == "not_found":
                startup.no_checkpoint = True
            elif startup is not None and record.phase == "done":
                # the done line's count, not the start line's: a fine-tune loads iteration N and starts over at 0
                startup.loaded_iteration = record.iteration
            elif startup is None and record.phase == "done" and self._current(record.file).first_iteration is None:
                self._current(record.file).resumed_from = record.iteration
        elif isinstance(record, IterationRecord):
            self._iteration(record.file, record.iteration, record.time_s, lambda: record)

    def add_row(self, row: RowLine) -> None:
        self._iteration(row.parser.file, row.iteration, row.time_s, row.record)

    def _starting(self, file: str, line: int, evidence: Evidence) -> None:
        """A start-up from `line` on: after the file's run logged iterations, the first one may begin a new run."""
        if (startup := self._startups.get(file)) is not None and startup.run.first_iteration is not None:
            self._settle(file)  # the start-up before logged one iteration only: nothing says it started afresh
        if self._current(file).first_iteration is not None and file not in self._startups:
            self._startups[file] = _Startup(FileRun(file, first_line=max(1, line)), evidence)

    @staticmethod
    def _arguments(run: FileRun, record: ArgumentsRecord) -> None:
        if run.shape or run.world_size is not None:  # the first block a run prints: the run it started
            return
        run.shape = {name: record.values[name] for name in SHAPE_ARGUMENTS
                     if record.values.get(name) not in (None, "None")}
        run.world_size = record.world_size
        for name in (*run.shape, "world_size"):
            line, text = record.value_lines.get(name, (record.line, record.text))
            run.evidence[name] = Evidence(record.file, line, text)

    def _iteration(self, file: str, iteration: int, time_s: float | None,
                   record: Callable[[], IterationRecord]) -> None:
        run = self._current(file)
        startup = self._startups.pop(file, None)
        if startup is not None and startup.run.first_iteration is not None:  # its second: is the first afresh?
            tentative, began = startup.run, startup.run.first_iteration
            tentative.interval = iteration - began if iteration > began else None
            if tentative.starts_afresh:
                self._split(run, startup, tentative.evidence["train_iters"])
                run = tentative
            else:
                _merge(run, tentative)
        elif startup is not None and startup.starts_over(run, iteration):  # a new run from here on
            first = record()
            self._split(run, startup, Evidence(first.file, first.line, first.text))
            run = startup.run
        elif startup is not None and startup.may_start_afresh(run, iteration):
            self._startups[file] = startup  # its iterations are its own until the next one tells
            run = startup.run
        elif startup is None and run.first_iteration is not None and run.last_iteration is not None \
                and iteration <= run.first_iteration < run.last_iteration:
            first = record()  # the count went back to the run's start with no start-up: a new run, or a copy
            if not _copied(run, first):
                run.last_line = first.line - 1
                run = FileRun(file, first_line=first.line, started_over=StartOver(
                    None, run.last_iteration, Evidence(first.file, first.line, first.text)))
                self._files[file].append(run)
        if time_s is not None and len(run.times) < MAX_TIMED and iteration not in run.times:
            timed = record()
            run.times[iteration] = (time_s, Evidence(timed.file, timed.line, timed.text))
        if run.first_iteration is None:
            first = record()  # the first line of a run only: its total and its evidence
            run.first_iteration = run.last_iteration = iteration
            run.train_iters, run.rank = first.train_iters, first.rank
            run.evidence["train_iters"] = Evidence(first.file, first.line, first.text)
            return
        if run.last_iteration is not None and iteration > run.last_iteration:
            run.interval = math.gcd(run.interval or 0, iteration - run.last_iteration)
        run.last_iteration = max(run.last_iteration or iteration, iteration)

    def _split(self, run: FileRun, startup: _Startup, first: Evidence) -> None:
        """The file's `run` ends before `startup`, whose run begins at `first` (its count started over)."""
        assert run.last_iteration is not None  # the run before logged iterations
        run.last_line = startup.run.first_line - 1
        startup.run.started_over = StartOver(startup.evidence, run.last_iteration, first)
        self._files[startup.run.file].append(startup.run)

    def _settle(self, file: str) -> None:
        """A start-up that logged one iteration only, nothing after it telling its log interval: a resume."""
        startup = self._startups.pop(file, None)
        if startup is not None and startup.run.first_iteration is not None:
            _merge(self._current(file), startup.run)

    def groups(self, paths: list[str]) -> list[RunGroup]:
        """The files (each run of a file that holds several) grouped by run, in the order given: a run joins the
        first group whose files together (rank 0's arguments, the last rank's iterations, a resume's stretch) it does
        not disagree with, and that holds no other run of its file; one that says nothing of its run joins the group
        before it."""
        for file in list(self._startups):
            self._settle(file)
        groups: list[RunGroup] = []
        for path in paths:
            for run in self._files.get(shown_name(path)) or [FileRun(shown_name(path))]:
                open_to = [index for index, group in enumerate(groups)  # a file's runs are apart by their split
                           if all(member.file != run.file for member in group.files)]
                if not run.says_anything:
                    home = len(groups) - 1 if open_to and open_to[-1] == len(groups) - 1 else None
                else:
                    home = next((index for index in open_to if not groups[index].together.differences(run)), None)
                if home is None:
                    groups.append(RunGroup([path], [run], run))
                else:
                    group = groups[home]
                    groups[home] = RunGroup([*group.paths, path], [*group.files, run], group.together.joined(run))
        return groups


def differences_between(groups: list[RunGroup]) -> list[tuple[RunGroup, RunGroup, list[Difference]]]:
    """For each group after the first, an earlier group it disagrees with and what differs (none for a group set
    apart only by starting over in a file an earlier group holds a run of: `_share_a_file`)."""
    told: list[tuple[RunGroup, RunGroup, list[Difference]]] = []
    for index, group in enumerate(groups[1:], start=1):
        pair = next(((earlier, group, said) for earlier in groups[:index] if not _share_a_file(earlier, group)
                     and (said := earlier.together.differences(group.together))), None)
        if pair is not None:
            told.append(pair)
    return told


def _share_a_file(one: RunGroup, other: RunGroup) -> bool:
    """Whether the two hold runs of one file: what sets them apart is where the file starts over (told as such), not
    what their logs disagree on (the later run's iterations are logged later, for one)."""
    return any(run.file == theirs.file for run in one.files for theirs in other.files)


def mixed_runs_finding(groups: list[RunGroup], labels: dict[str, str]) -> Finding:
    """The logs given are of `len(groups)` runs: which files (and which lines of a file that holds several), what
    sets them apart (with the lines that say it), and a diagnosis per run to run instead."""
    def name(path: str) -> str:
        return labels.get(path, Path(path).name)

    runs = "; ".join(group.name(labels) for group in groups)
    split = _split_files(groups)
    causes = [_started_over_cause(name(path), parts) for path, parts in split.items()]
    overs = [part.started_over for parts in split.values() for part in parts if part.started_over is not None]
    evidence = [line for over in overs for line in (over.startup, over.first_iteration) if line is not None]
    told = differences_between(groups)
    if told:
        causes.append("; ".join(f"{earlier.name(labels)} and {later.name(labels)} differ in "
                                f"{', '.join(difference.text for difference in differences)}"
                                for earlier, later, differences in told)
                      + ": the logs of one run (its ranks, or a resume from its checkpoint) cannot disagree on these")
        evidence += [line for _, _, differences in told for difference in differences for line in difference.evidence]
    return Finding(
        "mixed_runs", "warning", f"The logs are of {len(groups)} different runs, not one: {runs}",
        list(dict.fromkeys(evidence))[:6],
        ". ".join(causes) + ". Read as one run, one run's iterations would hide the other's; each run is judged on its "
        "own below, its findings titled with its files.",
        [Fix("add", "megapilot diagnose " + " ".join(_command_path(path, run) for path, run in
                                                      zip(group.paths, group.files, strict=True)), None,
             f"diagnose the run of {group.name(labels)} alone", kind="command")
         for group in groups])


def _split_files(groups: list[RunGroup]) -> dict[str, list[FileRun]]:
    """The files that hold several runs, each with its runs in the file's order."""
    parts: dict[str, list[FileRun]] = {}
    for group in groups:
        for path, run in zip(group.paths, group.files, strict=True):
            if not run.whole_file:
                parts.setdefault(path, []).append(run)
    return {path: sorted(runs, key=lambda run: run.first_line) for path, runs in parts.items()}


def _started_over_cause(name: str, parts: list[FileRun]) -> str:
    """`a.log holds 2 runs one after the other, starting at lines 1 and 41: at line 41 a new start-up, and its
    iteration count starts over at 10 after 30 (a resume would continue from its checkpoint)`."""
    starts = ", ".join(str(part.first_line) for part in parts[:-1]) + f" and {parts[-1].first_line}"
    overs = "; ".join(f"at line {part.first_line}{' a new start-up,' if part.started_over.startup else ''} its "
                      f"iterations start over at {part.first_iteration} after {part.started_over.after_iteration}"
                      for part in parts if part.started_over is not None)
    return (f"{name} holds {len(parts)} runs one after the other, starting at lines {starts}: {overs} (a resume from "
            "a checkpoint would continue the count)")


def _command_path(path: str, run: FileRun) -> str:
    """The path for a command line; a run's part of a file as the lines it spans (`<(sed -n '41,$p' a.log)`)."""
    if run.whole_file:
        return shlex.quote(path)
    lines = f"{run.first_line},{run.last_line if run.last_line is not None else '$'}p"
    return f"<(sed -n {shlex.quote(lines)} {shlex.quote(path)})"
