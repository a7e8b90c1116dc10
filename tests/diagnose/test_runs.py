"""Logs given as one run that are of several runs: told as a finding, each run judged on its own; the ranks and the
resumes of one run stay one run."""

from __future__ import annotations

import shutil
from pathlib import Path

from megapilot.diagnose import diagnose

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
