"""The dry run of the tiny-local template: stages in order, the trainer's argv per combo, nothing run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from megapilot.suite.config import load_suite
from megapilot.suite.dry_run import dry_run_plan
from megapilot.suite.templates import template_path, threshold_paths


def test_tiny_local_dry_run_lists_stages_and_launches(tmp_path):
    shutil.copy(template_path("tiny-local"), tmp_path / "suite.json")
    for path in threshold_paths("tiny-local"):
        shutil.copy(path, tmp_path / path.name)
    suite = load_suite(tmp_path / "suite.json")
    plan = dry_run_plan(suite, out_dir=tmp_path / "out", only_combo="MBS=2,GBS=8,PRECISION=BF16")
    assert [(s.name, s.combo) for s in plan.stages] == [
        ("prepare", None), ("preflight", None), ("collectives", None), ("tokenizer", None), ("smoke", None),
        ("checkpoint", None),
        ("train", "MBS=2,GBS=8,PRECISION=BF16"), ("metrics", "MBS=2,GBS=8,PRECISION=BF16"),
        ("loss_curve", "MBS=2,GBS=8,PRECISION=BF16"), ("results", None), ("teardown", None)]
    [combo] = plan.combos
    assert combo.skipped is None and combo.backend == "megapilot" and combo.gpus_per_node == 2
    args = combo.megatron_args
    assert args[args.index("--micro-batch-size") + 1] == "2"
    assert args[args.index("--distributed-backend") + 1] == "gloo"  # a CPU suite: the CPU render
    assert "megapilot.trainer" in combo.command
    only_train = dry_run_plan(suite, out_dir=tmp_path / "out", only_stage="smoke")
    assert [s.name for s in only_train.stages] == ["prepare", "smoke", "results", "teardown"]
    # what the dry run shows is written: the smoke job's script and the combo's, under the folder it names
    assert plan.folder == str(tmp_path / "out" / "dry-run")
    assert only_train.scripts[0] == str(tmp_path / "out" / "dry-run" / "smoke" / "launch.sh")
    assert combo.script == str(tmp_path / "out" / "dry-run" / "MBS2_GBS8_BF16" / "launch.sh")
    written = (tmp_path / "out" / "dry-run" / "MBS2_GBS8_BF16" / "launch.sh").read_text()
    assert "megapilot.trainer" in written and "--micro-batch-size 2" in written


def test_a_dry_run_makes_no_run_folder_only_the_dry_run_folder_it_names(tmp_path):
    shutil.copy(template_path("tiny-local"), tmp_path / "suite.json")
    for path in threshold_paths("tiny-local"):
        shutil.copy(path, tmp_path / path.name)
    suite = load_suite(tmp_path / "suite.json")
    out = tmp_path / "out"
    dry_run_plan(suite, out_dir=out)
    assert [p.name for p in out.iterdir()] == ["dry-run"]  # no timestamped run folder


def test_the_dry_run_writes_the_checkpoint_stages_save_and_resume_jobs(tmp_path):
    shutil.copy(template_path("tiny-local"), tmp_path / "suite.json")
    for path in threshold_paths("tiny-local"):
        shutil.copy(path, tmp_path / path.name)
    suite = load_suite(tmp_path / "suite.json")
    folder = tmp_path / "out" / "dry-run"
    plan = dry_run_plan(suite, out_dir=tmp_path / "out")
    save, resume = plan.checkpoint
    assert (save.key, resume.key) == ("checkpoint-save", "checkpoint-resume")
    assert save.script == str(folder / "checkpoint-save" / "launch.sh")
    assert resume.script == str(folder / "checkpoint-resume" / "launch.sh")
    # listed in the order the run submits them: smoke, the two checkpoint jobs, then the combos
    assert plan.scripts[:3] == [str(folder / "smoke" / "launch.sh"), save.script, resume.script]
    for job in (save, resume):
        assert subprocess.run(["bash", "-n", job.script], capture_output=True).returncode == 0
    settings = suite.config.checkpoint
    save_text, resume_text = Path(save.script).read_text(), Path(resume.script).read_text()
    saved_to = str(folder / "checkpoints" / "saved")
    assert f"--save {saved_to}" in save_text and f"--save-interval {settings.save_interval}" in save_text
    assert f"--train-iters {settings.save_iters}" in save_text and "--ckpt-step" not in save_text
    assert f"--load {saved_to}" in resume_text and f"--train-iters {settings.resume_iters}" in resume_text
    assert f"--save {saved_to}-resumed" in resume_text and "--ckpt-step 10" in resume_text  # the last interval save
    # not written where the stage would not run them
    only_combos = dry_run_plan(suite, out_dir=tmp_path / "other", only_stage="train")
    assert only_combos.checkpoint == [] and not (tmp_path / "other" / "dry-run" / "checkpoint-save").exists()


def test_the_smoke_job_is_shown_like_every_other_job_and_a_smoke_that_would_not_run_says_why(tmp_path):
    shutil.copy(template_path("tiny-local"), tmp_path / "suite.json")
    for path in threshold_paths("tiny-local"):
        shutil.copy(path, tmp_path / path.name)
    suite = load_suite(tmp_path / "suite.json")
    plan = dry_run_plan(suite, out_dir=tmp_path / "out")
    smoke = plan.smoke
    assert smoke is not None and (smoke.key, smoke.skipped, smoke.gpus_per_node) == ("smoke", None, 2)
    args = smoke.megatron_args
    smoke_settings = suite.config.smoke
    assert args[args.index("--train-iters") + 1] == str(smoke_settings.iters)
    assert "megapilot.trainer" in smoke.command and smoke.script == plan.scripts[0]
    assert "--train-iters " + str(smoke_settings.iters) in Path(smoke.script).read_text()
    assert dry_run_plan(suite, out_dir=tmp_path / "out", only_stage="train").smoke is None  # not selected
    off = suite.model_copy(update={"config": suite.config.model_copy(update={
        "smoke": smoke_settings.model_copy(update={"enabled": False})})})
    skipped = dry_run_plan(off, out_dir=tmp_path / "off").smoke
    assert skipped is not None and skipped.skipped == "smoke.enabled is false" and skipped.script is None

