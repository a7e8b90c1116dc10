"""Logs given as one run that are of several runs: told as a finding, each run judged on its own; the ranks and the
resumes of one run stay one run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from megapilot.diagnose import diagnose
from tests.diagnose.timed_logs import timed_log

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
ARGUMENTS_LOG = DATA / "synthetic_megatron_arguments.log"  # rank 0's arguments block, the last rank's iterations


def _categories(paths: list[Path]) -> list[str]:
    return [finding.category for finding in diagnose(paths).findings]


def test_two_runs_in_one_directory_are_told_apart_and_each_is_judged(tmp_path: Path):
    """A finished run resumed at iteration 40 of 100 beside a Mixtral fine-tune of 500000 iterations: read as one run
    the fine-tune's iterations 10-12 were hidden behind the other's and nothing was found. Now a finding names both
    files and the totals that differ, and the fine-tune's own findings are there, titled with its file."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(DATA / "synthetic_megatron_core016_full.log", mixed / "a.log")
    shutil.copy(DATA / "real/04_low_throughput_mixtral_h100_130tflops.log", mixed / "b.log")
    diagnosis = diagnose([mixed])
    first = diagnosis.findings[0]
    assert first.category == "mixed_runs" and first.severity == "warning", [f.title for f in diagnosis.findings]
    assert "2 different runs" in first.title and "a.log" in first.title and "b.log" in first.title
    assert "train_iters 100 vs 500000" in first.cause
    assert {Path(evidence.file).name for evidence in first.evidence} == {"a.log", "b.log"}
    assert [fix.kind for fix in first.fixes] == ["command", "command"]
    assert [Path(fix.flag.split()[-1]).name for fix in first.fixes] == ["a.log", "b.log"]
    judged = [f for f in diagnosis.findings if f.title.startswith("b.log: ")]
    assert {f.category for f in judged} == {"loss_spike", "low_throughput"}
    assert all(evidence.file.endswith("b.log") for f in judged for evidence in f.evidence)
    assert "a.log: no problem found in its log" in [note.text for note in diagnosis.notes]


def test_logs_whose_arguments_disagree_on_the_model_are_two_runs(tmp_path: Path):
    """Same totals, same world size, but 32 layers in one arguments block and 80 in the other: no resume changes
    the model, whatever the iterations."""
    text = ARGUMENTS_LOG.read_text()
    (tmp_path / "run_a.log").write_text(text)
    (tmp_path / "run_b.log").write_text(text.replace(
        "num_layers ...................................... 32", "num_layers ...................................... 80"))
    [first, *_] = diagnose([tmp_path / "run_a.log", tmp_path / "run_b.log"]).findings
    assert first.category == "mixed_runs" and "num_layers 32 vs 80" in first.cause
    # each file's own num_layers line in its arguments block
    assert [(Path(e.file).name, e.line) for e in first.evidence] == [("run_a.log", 15), ("run_b.log", 15)]
    assert first.evidence[1].text.endswith(" 80")


def test_the_ranks_and_the_resume_of_one_run_stay_one_run(tmp_path: Path):
    """Rank 0's file (the arguments block) and the last rank's (the iterations), and a resume from the checkpoint at
    iteration 20 on twice the GPUs with the schedule extended to 100 iterations: one run, no finding about runs.
    The same second file starting over from iteration 10 is no resume: two runs."""
    lines = ARGUMENTS_LOG.read_text().splitlines(keepends=True)
    (tmp_path / "rank0.log").write_text("".join(lines[:28]))
    (tmp_path / "rank7.log").write_text("".join(lines[28:]))
    resumed = "".join(lines).replace("world_size ...................................... 8",
                                     "world_size ...................................... 16")
    resumed = resumed.replace("train_iters ..................................... 50",
                              "train_iters ..................................... 100").replace("/      50 |",
                                                                                               "/     100 |")
    (tmp_path / "resumed.log").write_text(resumed.replace("iteration       30/", "iteration       40/")
                                          .replace("iteration       20/", "iteration       30/")
                                          .replace("iteration       10/", "iteration       25/"))
    one_run = [tmp_path / "rank0.log", tmp_path / "rank7.log", tmp_path / "resumed.log"]
    assert "mixed_runs" not in _categories(one_run)
    (tmp_path / "again.log").write_text(resumed)  # iterations 10-30 of 100 again: a new run, not a resume
    [first, *_] = diagnose([tmp_path / "rank0.log", tmp_path / "rank7.log", tmp_path / "again.log"]).findings
    assert first.category == "mixed_runs" and "rank0.log, rank7.log; again.log" in first.title
    assert "world size 8 vs 16" in first.cause and "train_iters 50 vs 100" in first.cause


def _shifted(text: str, hour: str) -> str:
    """The log with its clock moved to `hour` (`"05"`): the same run's lines, logged at another time."""
    return text.replace("2026-01-01 00:", f"2026-01-01 {hour}:")


def test_one_file_that_holds_two_runs_is_split_where_the_second_starts_over(tmp_path: Path):
    """A job script that trained twice into one log: the second run's arguments block after the first run's end, and
    its iteration count starting over at 10 after 30. Read as one run, its iterations were a replay of the first's
    (a restart note) and its NaN at iteration 20 was one run's. Now a finding says the file holds 2 runs from lines
    1 and 34, and each is judged on its own lines."""
    text = ARGUMENTS_LOG.read_text()
    second = _shifted(text, "05").replace(
        "lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 2.345 | number of skipped iterations:   0 | number of "
        "nan iterations:   0 |\n[rank7]:  [2026-01-01 05:30",
        "lm loss: nan | loss scale: 1.0 | grad norm: nan | number of skipped iterations:   0 | number of "
        "nan iterations:   1 |\n[rank7]:  [2026-01-01 05:30")
    assert second.count("lm loss: nan") == 1
    (tmp_path / "job.log").write_text(text + second)
    diagnosis = diagnose([tmp_path / "job.log"])
    [first] = [f for f in diagnosis.findings if f.category == "mixed_runs"]  # after the critical NaN, ranked first
    assert first.title.endswith("2 different runs, not one: job.log (lines 1-33); job.log (from line 34)")
    assert "job.log holds 2 runs one after the other, starting at lines 1 and 34" in first.cause
    assert "its iterations start over at 10 after 30" in first.cause
    assert [(e.line, e.text.split("]", 1)[0]) for e in first.evidence] == [(35, "[rank0"), (61, "[rank7")]
    assert [fix.flag for fix in first.fixes] == [
        f"megapilot diagnose <(sed -n 1,33p {tmp_path / 'job.log'})",
        f"megapilot diagnose <(sed -n '34,$p' {tmp_path / 'job.log'})"]
    [nan] = [f for f in diagnosis.findings if f.category == "nan_loss"]
    assert nan.title.startswith("job.log (from line 34): NaN loss from iteration 20")
    assert all(e.line >= 34 for e in nan.evidence)
    assert not any("restarted after iteration" in note.text for note in diagnosis.notes)


def test_a_resume_in_the_same_file_stays_one_run_and_a_fresh_start_that_says_so_does_not(tmp_path: Path):
    """A resubmitted job appending to the log: a new start-up that loads the checkpoint of iteration 20 and logs 30,
    40, 50 (its count continues), or no checkpoint line but the count picking up inside the first stretch (a replay
    from an earlier checkpoint): one run. A start-up that finds no checkpoint and logs 20 and 30 again started from
    scratch (with another log interval): two runs."""
    text = ARGUMENTS_LOG.read_text()
    lines = text.splitlines(keepends=True)
    startup, iterations = "".join(lines[:28]), "".join(lines[28:31])

    def again(checkpoint: str, renumber: dict[int, int]) -> str:
        later = _shifted(iterations, "05")
        for old, new in renumber.items():
            later = later.replace(f"iteration       {old}/", f"iteration       {new}/")
        return _shifted(startup, "05") + checkpoint + later

    loaded = " successfully loaded checkpoint from /ckpt/llama [ t 1/2, p 1/2 ] at iteration 20\n"
    (tmp_path / "resumed.log").write_text(text + again(loaded, {30: 50, 20: 40, 10: 30}))
    (tmp_path / "replayed.log").write_text(text + again("", {30: 40, 20: 30, 10: 20}))
    for name in ("resumed.log", "replayed.log"):
        assert "mixed_runs" not in _categories([tmp_path / name]), name
    not_found = " WARNING: could not find the metadata file /ckpt/llama/latest_checkpointed_iteration.txt\n"
    (tmp_path / "fresh.log").write_text(text + again(not_found, {30: 40, 20: 30, 10: 20}))
    [first, *_] = diagnose([tmp_path / "fresh.log"]).findings
    assert first.category == "mixed_runs" and "its iterations start over at 20 after 30" in first.cause


def test_a_start_up_after_iterations_that_logs_none_is_no_second_run(tmp_path: Path):
    """The second start-up crashed before its first iteration (or the log was cut there): nothing says it started
    over, the file is one run, and the start-up's error is still read."""
    text = ARGUMENTS_LOG.read_text()
    lines = text.splitlines(keepends=True)
    (tmp_path / "job.log").write_text(text + "".join(lines[:20]))  # cut inside the second arguments block
    assert "mixed_runs" not in _categories([tmp_path / "job.log"])


def test_two_runs_from_scratch_in_two_files_are_told_apart_by_when_they_logged(tmp_path: Path):
    """Same model, world size and schedule, both from scratch: their arguments and totals agree as rank copies'
    would. Rank copies log iteration 10 within seconds of each other; a second run logged it 3 hours later: two runs.
    Without timestamps nothing tells them apart: one run, as before."""
    text = ARGUMENTS_LOG.read_text()
    (tmp_path / "run_a.log").write_text(text)
    (tmp_path / "run_b.log").write_text(_shifted(text, "03"))
    (tmp_path / "rank_copy.log").write_text(text.replace(":00.123456]", ":02.654321]"))
    [first, *_] = diagnose([tmp_path / "run_a.log", tmp_path / "run_b.log"]).findings
    assert first.category == "mixed_runs" and "run_a.log; run_b.log" in first.title
    assert "iteration 10 logged 3 h apart (a step takes 60 s)" in first.cause
    assert [(Path(e.file).name, e.line) for e in first.evidence] == [("run_a.log", 29), ("run_b.log", 29)]
    assert "mixed_runs" not in _categories([tmp_path / "run_a.log", tmp_path / "rank_copy.log"])
    untimed = "".join(line.replace("[2026-01-01 00", "").replace(".123456] ", " ") for line in text.splitlines(True))
    (tmp_path / "untimed_a.log").write_text(untimed)
    (tmp_path / "untimed_b.log").write_text(untimed)
    assert "mixed_runs" not in _categories([tmp_path / "untimed_a.log", tmp_path / "untimed_b.log"])


def _iterations(numbers: range, *, total: int = 50, hour: str = "00", rank: int = 7) -> str:
    """Rank `rank`'s iteration lines for `numbers`, as the arguments log's: a step every 60 s from 00:00 of `hour`,
    128 samples per iteration."""
    template = ARGUMENTS_LOG.read_text().splitlines()[28]
    lines = []
    for number in numbers:
        line = template.replace("[rank7]", f"[rank{rank}]").replace("00:10:00", f"{hour}:{number // 60:02d}:"
                                                                                f"{number % 60:02d}")
        line = line.replace("iteration       10/      50", f"iteration {number:8d}/{total:8d}")
        lines.append(line.replace("consumed samples:         1280", f"consumed samples: {number * 128:12d}") + "\n")
    return "".join(lines)


def test_a_rank_log_without_start_up_lines_is_split_where_its_count_starts_over(tmp_path: Path):
    """Rank 0's log holds two runs, split at the second start-up; the last rank's log has no start-up lines, only its
    iterations, 10-30 and then 10-20 again 5 hours later. It was joined whole to the first run (with the second run's
    iterations read as a replay); its count starting over is a new run as rank 0's is, so it is split the same way and
    each part joins its run. A count that goes back inside the stretch (a replay from a checkpoint) and another
    rank's copies of the same iterations, logged at the same times, stay one run."""
    text = ARGUMENTS_LOG.read_text()
    (tmp_path / "job.log").write_text(text + _shifted(text, "05"))
    (tmp_path / "rank7.log").write_text(_iterations(range(10, 31, 10)) + _iterations(range(10, 21, 10), hour="05"))
    diagnosis = diagnose([tmp_path / "job.log", tmp_path / "rank7.log"])
    [first] = [f for f in diagnosis.findings if f.category == "mixed_runs"]
    assert first.title.endswith("2 different runs, not one: job.log (lines 1-33), rank7.log (lines 1-3); "
                                "job.log (from line 34), rank7.log (from line 4)"), first.title
    assert "rank7.log holds 2 runs one after the other, starting at lines 1 and 4: at line 4 its iterations start " \
           "over at 10 after 30" in first.cause, first.cause
    assert ("rank7.log", 4) in [(Path(e.file).name, e.line) for e in first.evidence]
    assert not any("restarted after iteration" in note.text for note in diagnosis.notes)
    [alone] = [f for f in diagnose([tmp_path / "rank7.log"]).findings if f.category == "mixed_runs"]
    assert alone.title.endswith("rank7.log (lines 1-3); rank7.log (from line 4)")

    (tmp_path / "replayed.log").write_text(_iterations(range(10, 31, 10)) + _iterations(range(20, 41, 10), hour="05"))
    (tmp_path / "copies.log").write_text(_iterations(range(10, 31, 10)) + _iterations(range(10, 31, 10), rank=15))
    (tmp_path / "untimed_copies.log").write_text(re.sub(r"\[2026-[^]]*\] ", "", (tmp_path / "copies.log").read_text()))
    for name in ("replayed.log", "copies.log", "untimed_copies.log"):
        assert "mixed_runs" not in _categories([tmp_path / name]), name



def test_a_run_from_scratch_with_another_log_interval_is_no_resume(tmp_path: Path):
    """A run logging every iteration (1-30 of 50), then a run of the same model and schedule logging every 10 (10,
    20, 30), with no checkpoint line either way. Its count at 10 lay inside the first stretch, so it read as a resume
    replaying from a checkpoint; but its first line is the first its interval logs from iteration 0, where the first
    run had gone on to 30 (a resume continues from the checkpoint: its count and its consumed samples pick up from
    there), and it logged iteration 10 five hours after the first run did. Two runs, in two files or in one. A run
    with the other interval that picks up after its first log interval (20, 30, 40) is still a resume."""
    text = ARGUMENTS_LOG.read_text()
    lines = text.splitlines(keepends=True)
    startup, end = "".join(lines[:28]), lines[31]
    every = startup + _iterations(range(1, 31)) + end
    tenth = _shifted(startup, "05") + _iterations(range(10, 31, 10), hour="05") + _shifted(end, "05")
    (tmp_path / "every.log").write_text(every)
    (tmp_path / "tenth.log").write_text(tenth)
    [first, *_] = diagnose([tmp_path / "every.log", tmp_path / "tenth.log"]).findings
    assert first.category == "mixed_runs" and "every.log; tenth.log" in first.title, first.title
    assert "log interval 1 vs 10" in first.cause and "iteration 10 logged 5 h apart" in first.cause, first.cause
    (tmp_path / "job.log").write_text(every + tenth)
    [first, *_] = diagnose([tmp_path / "job.log"]).findings
    assert first.category == "mixed_runs", first.title
    assert "at line 61 a new start-up, its iterations start over at 10 after 30" in first.cause, first.cause

    resumed = _shifted(startup, "05") + _iterations(range(20, 41, 10), hour="05") + _shifted(end, "05")
    (tmp_path / "resumed.log").write_text(resumed)
    (tmp_path / "resumed_job.log").write_text(every + resumed)
    assert "mixed_runs" not in _categories([tmp_path / "every.log", tmp_path / "resumed.log"])
    assert "mixed_runs" not in _categories([tmp_path / "resumed_job.log"])


def test_a_resume_from_a_checkpoint_inside_the_first_log_interval_is_a_resume(tmp_path: Path):
    """A run from scratch logs 10-60 (every 10, a checkpoint every 5); two hours later a job resumes from its
    checkpoint of iteration 5 and logs 10-40. Its first line, 10, is the first a run from scratch logs, so it read as
    a second run (`mixed_runs`, iteration 40 logged 2 h apart); its `successfully loaded checkpoint ... at iteration
    5` says it resumed, in two files and in one. A fine-tune loads a checkpoint and says iteration 0: a new run."""
    (tmp_path / "first.log").write_text(timed_log(range(10, 61, 10), "00"))
    (tmp_path / "resumed.log").write_text(timed_log(range(10, 41, 10), "02", loaded=5))
    assert "mixed_runs" not in _categories([tmp_path / "first.log", tmp_path / "resumed.log"])
    (tmp_path / "job.log").write_text(timed_log(range(10, 61, 10), "00")
                                      + timed_log(range(10, 41, 10), "02", loaded=5))
    diagnosis = diagnose([tmp_path / "job.log"])
    assert "mixed_runs" not in [f.category for f in diagnosis.findings]
    assert any("restarted after iteration 60 and resumed at iteration 10" in note.text for note in diagnosis.notes)

    finetune = timed_log(range(10, 41, 10), "02", loaded=5).replace("] at iteration 5", "] at iteration 0")
    (tmp_path / "finetune.log").write_text(finetune)
    [first, *_] = diagnose([tmp_path / "first.log", tmp_path / "finetune.log"]).findings
    assert first.category == "mixed_runs" and "iteration 40 logged 2 h apart" in first.cause, first.cause
    (tmp_path / "finetune_job.log").write_text(timed_log(range(10, 61, 10), "00") + finetune)
    assert _categories([tmp_path / "finetune_job.log"])[0] == "mixed_runs"
