"""Checkpoint save → resume check: did the resumed run carry on exactly where the saved one stopped?

A save run trains with `--save DIR --save-interval K`; a resume run loads DIR and trains on. Checks:

- `checkpoint.resume_step`   the resumed run's first logged iteration is the one after the checkpoint it
                             loaded (the next multiple of the log interval when lines are logged every L
                             steps), and the load line names that checkpoint;
- `checkpoint.loss_continuity` the same step's loss in both runs: |resume[s] - save[s]| <= rtol x
                             max(|save[s]|, 1e-9), two-sided (a drop fails as surely as a rise), at the
                             first step the resumed run logs. When the save run never logged that step
                             (it stopped at the checkpoint), the resumed step is compared with the saved
                             step instead, and the row says so;
- `checkpoint.tracker`       the save directory's `latest_checkpointed_iteration.txt` names the last save;
- `checkpoint.save_s`, `checkpoint.load_s` the save and load durations (recorded, never gated).

Better than CVS (reference: cvs_megatron_suite.md §5.3), which compares step k+1 of the resumed run with
step k of the saved one and fails only on an increase.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from megapilot.logs import parse_logs
from megapilot.suite.results import MetricRow, Verdict

TRACKER_FILE = "latest_checkpointed_iteration.txt"
LOSS_FLOOR = 1e-9


@dataclass(frozen=True)
class CheckpointRun:
    """What the continuity check needs from one run's logs."""

    losses: dict[int, float]  # iteration -> lm loss, each iteration once
    iterations: tuple[int, ...] = ()  # every logged iteration, in order (lines without a loss too)
    saved_iterations: tuple[int, ...] = ()  # completed saves
    save_durations_s: tuple[float, ...] = ()
    save_paths: tuple[str, ...] = ()
    load_iteration: int | None = None
    load_duration_s: float | None = None

    @property
    def first_iteration(self) -> int | None:
        return self.iterations[0] if self.iterations else None

    @property
    def log_interval(self) -> int:
        """The most common gap between logged iterations (1 when fewer than two are logged)."""
        gaps = Counter(b - a for a, b in itertools.pairwise(self.iterations) if b > a)
        return gaps.most_common(1)[0][0] if gaps else 1


def read_checkpoint_run(node_logs: list[Path]) -> CheckpointRun:
    """Losses from the last node that logs iterations; checkpoint saves and loads from every node."""
    parsed = [parse_logs([path]) for path in node_logs if Path(path).is_file()]
    with_iterations = [p for p in parsed if p.iterations]
    iterations: list[int] = []
    losses: dict[int, float] = {}
    for record in with_iterations[-1].iterations if with_iterations else []:
        if iterations and record.iteration <= iterations[-1]:
            continue
        iterations.append(record.iteration)
        if record.lm_loss is not None:
            losses[record.iteration] = record.lm_loss
    ops = [op for p in parsed for op in p.checkpoints if op.completed]
    saves = {op.iteration: op for op in ops if op.kind == "save" and op.iteration is not None}
    loads = [op for op in ops if op.kind == "load"]
    return CheckpointRun(
        losses=losses, iterations=tuple(iterations), saved_iterations=tuple(sorted(saves)),
        save_durations_s=tuple(op.duration_s for _, op in sorted(saves.items()) if op.duration_s is not None),
        save_paths=tuple(dict.fromkeys(op.path for op in saves.values() if op.path)),
        load_iteration=loads[0].iteration if loads else None,
        load_duration_s=loads[0].duration_s if loads else None,
    )


def last_saved_iteration(save: CheckpointRun, *, save_iters: int, save_interval: int) -> tuple[int, str]:
    """The last checkpoint the save run wrote, and where that number comes from."""
    if save.saved_iterations:
        return max(save.saved_iterations), "the save run's checkpoint lines"
    if save_interval <= 0:
        return save_iters, "save_iters (no save interval)"
    return (save_iters // save_interval) * save_interval, "floor(save_iters / save_interval) x save_interval"


def check_continuity(save: CheckpointRun, resume: CheckpointRun, *, save_iters: int, save_interval: int,
                     loss_rtol: float = 0.05, checkpoint_dir: Path | None = None,
                     resume_from: int | None = None) -> list[MetricRow]:
    """The five `checkpoint.*` rows.

    `checkpoint_dir`: where the tracker file is (default: the directory the save run's log names).
    `resume_from`: the checkpoint the resume run was told to load (its `--ckpt-step`); default the last saved.
    """
    last_saved, source = last_saved_iteration(save, save_iters=save_iters, save_interval=save_interval)
    loaded = resume_from if resume_from is not None else last_saved
    return [
        _resume_step(resume, loaded, save.log_interval),
        _loss_continuity(save, resume, loaded, loss_rtol),
        _tracker(save, last_saved, source, checkpoint_dir),
        _duration_row("checkpoint.save_s", save.save_durations_s, "save"),
        _duration_row("checkpoint.load_s", (resume.load_duration_s,) if resume.load_duration_s is not None else (),
                      "load"),
    ]


def _resume_step(resume: CheckpointRun, loaded: int, log_interval: int) -> MetricRow:
    expected = (loaded // log_interval + 1) * log_interval
    threshold = f"== {expected}"
    first = resume.first_iteration
    if first is None:
        return MetricRow(name="checkpoint.resume_step", unit="iteration", threshold=threshold, verdict=Verdict.FAIL,
                         reason="the resume run logged no iteration")
    problems = []
    if first != expected:
        problems.append(f"first resumed iteration {first}, expected {expected} (checkpoint {loaded}"
                        f"{f', log interval {log_interval}' if log_interval > 1 else ''})")
    if resume.load_iteration is not None and resume.load_iteration != loaded:
        problems.append(f"the resume run loaded iteration {resume.load_iteration}, expected {loaded}")
    reason = "; ".join(problems) or f"resumed at iteration {first}, right after checkpoint {loaded}"
    return MetricRow(name="checkpoint.resume_step", value=float(first), unit="iteration", threshold=threshold,
                     verdict=Verdict.FAIL if problems else Verdict.PASS, reason=reason)


def _loss_continuity(save: CheckpointRun, resume: CheckpointRun, loaded: int, rtol: float) -> MetricRow:
    name, threshold = "checkpoint.loss_continuity", f"<= {rtol:g} (relative, two-sided)"
    resumed_steps = sorted(step for step in resume.losses if step > loaded) or sorted(resume.losses)
    if not resumed_steps:
        return MetricRow(name=name, threshold=threshold, verdict=Verdict.FAIL, reason="the resume run logged no loss")
    step = resumed_steps[0]
    note = ""
    if step in save.losses:
        saved_step = step
    else:
        earlier = [s for s in save.losses if s <= loaded] or [s for s in save.losses if s < step]
        if not earlier:
            return MetricRow(name=name, threshold=threshold, verdict=Verdict.FAIL,
                             reason=f"the save run logged no loss at or before step {step} to compare with")
        saved_step = max(earlier)
        note = (f"; the save run did not log step {step}, so step {saved_step} was compared "
                f"(different steps: train the save run past its checkpoint for an exact comparison)")
    resumed_loss, saved_loss = resume.losses[step], save.losses[saved_step]
    if not (math.isfinite(resumed_loss) and math.isfinite(saved_loss)):
        return MetricRow(name=name, threshold=threshold, verdict=Verdict.FAIL,
                         reason=f"non-finite loss: resumed {resumed_loss} at step {step}, saved {saved_loss}{note}")
    relative = abs(resumed_loss - saved_loss) / max(abs(saved_loss), LOSS_FLOOR)
    passed = relative <= rtol
    reason = (f"step {step}: resumed loss {resumed_loss:.6g} vs saved {saved_loss:.6g} (step {saved_step}), "
              f"relative difference {relative:.3g} {'<=' if passed else '>'} {rtol:g}{note}")
    return MetricRow(name=name, value=relative, unit="", threshold=threshold, kind="max",
                     verdict=Verdict.PASS if passed else Verdict.FAIL, reason=reason,
                     margin_pct=(rtol - relative) / rtol * 100.0 if rtol > 0 else None)


def _tracker(save: CheckpointRun, last_saved: int, source: str, checkpoint_dir: Path | None) -> MetricRow:
    name, threshold = "checkpoint.tracker", f"== {last_saved}"
    directory = checkpoint_dir or (Path(save.save_paths[-1]) if save.save_paths else None)
    if directory is None:
        return MetricRow(name=name, unit="iteration", threshold=threshold, verdict=Verdict.SKIPPED,
                         reason="no checkpoint directory given and none named in the save run's log")
    tracker = Path(directory) / TRACKER_FILE
    if not tracker.is_file():
        return MetricRow(name=name, unit="iteration", threshold=threshold, verdict=Verdict.FAIL,
                         reason=f"{tracker} does not exist: the checkpoint was not written")
    text = tracker.read_text(encoding="utf-8", errors="replace").strip()
    if not (text.isascii() and text.isdigit()):
        return MetricRow(name=name, unit="iteration", threshold=threshold, verdict=Verdict.FAIL,
                         reason=f"{tracker} holds {text[:40]!r}, not an iteration number")
    written = int(text)
    passed = written == last_saved
    return MetricRow(name=name, value=float(written), unit="iteration", threshold=threshold,
                     verdict=Verdict.PASS if passed else Verdict.FAIL,
                     reason=f"{tracker} says {written}; last save {last_saved} (from {source})")


def _duration_row(name: str, durations_s: tuple[float, ...], what: str) -> MetricRow:
    if not durations_s:
        return MetricRow(name=name, unit="s", verdict=Verdict.SKIPPED, enforced=False,
                         reason=f"the log gives no {what} duration (no start/done timestamps or timer)")
    mean = sum(durations_s) / len(durations_s)
    each = ", ".join(f"{d:.3g}" for d in durations_s)
    return MetricRow(name=name, value=mean, unit="s", kind="info", verdict=Verdict.RECORD, enforced=False,
                     reason=f"mean of {len(durations_s)} {what}(s): {each} s")


__all__ = ["TRACKER_FILE", "CheckpointRun", "check_continuity", "last_saved_iteration", "read_checkpoint_run"]
