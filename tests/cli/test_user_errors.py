"""Mistakes a demanding user makes on every command: each ends in ONE stderr line naming the field and the fix,
exit code 2, no traceback (in-process through `main()`, and a few through the installed `megapilot` binary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LOG = Path(__file__).parents[1] / "data" / "logs" / "synthetic_megatron_core016_full.log"
TINY = ("--model", "tiny", "--gpu", "h100", "--gpus", "8", "--seq-len", "128", "--gbs", "16")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Bad inputs on disk: a directory, a binary file, an empty log, a log without iterations, broken plans."""
    from megapilot.catalog import get_gpu, get_model
    from megapilot.spec import ClusterSpec, ParallelConfig, SavedPlan, TrainingSpec

    root = tmp_path_factory.mktemp("mistakes")
    (root / "adir").mkdir()
    (root / "binary.dat").write_bytes(b"\xff\xfe\x00\x81 not text \x00")
    (root / "empty.log").write_bytes(b"")
    (root / "noiter.log").write_text("starting up\nloading things\n")
    (root / "bad.json").write_text("{not json")
    (root / "fake.jsonl.gz").write_bytes(b"\xff\xfe not gzip")
    (root / "list.json").write_text("[1, 2]")
    plan = SavedPlan(model=get_model("tiny"), cluster=ClusterSpec.from_gpu_count(get_gpu("h100"), 8),
                     training=TrainingSpec(seq_length=128, global_batch_size=16),
                     parallel=ParallelConfig(dp=8))
    (root / "plan.json").write_text(plan.model_dump_json())
    other = json.loads(plan.model_dump_json()) | {"version": 99}
    (root / "v99.json").write_text(json.dumps(other))
    (root / "train.sh").write_text("#!/bin/bash\ntorchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4\n")
    return {"dir": str(root / "adir"), "bin": str(root / "binary.dat"), "empty": str(root / "empty.log"),
            "noiter": str(root / "noiter.log"), "badjson": str(root / "bad.json"), "list": str(root / "list.json"),
            "plan": str(root / "plan.json"), "v99": str(root / "v99.json"), "script": str(root / "train.sh"),
            "missing": str(root / "missing" / "x"), "log": str(LOG), "root": str(root)}


# (argv with {placeholders}, the field the one line must name)
MISTAKES = [
    # catalog
    (("models", "no-such-model"), "model"),
    (("models", "{dir}"), "model"),
    (("models", "{bin}"), "model"),
    (("models", "{badjson}"), "model"),
    (("models", "{missing}"), "model"),
    # estimate
    (("estimate", "--model", "tiny", "--gpu", "no-such-gpu", "--gpus", "8", "--gbs", "16", "--seq-len", "128"), "gpu"),
    (("estimate", "--model", "tiny", "--gpu", "h100", "--gpus", "0", "--gbs", "16", "--seq-len", "128"), "gpus"),
    (("estimate", "--model", "gpt-oss-20b", "--gpu", "h100", "--gpus", "16", "--cp", "2", "--ep", "8", "--gbs", "128",
      "--seq-len", "4096", "--cp-comm-type", "p2p"), "cp_comm_type"),  # sinks have no backend on the p2p CP ring
    (("estimate", "--model", "nemotron-h-56b", "--gpu", "h100", "--gpus", "16", "--tp", "16", "--gbs", "128",
      "--seq-len", "8192"), "tp"),  # 8 Mamba-2 groups over TP 16
    (("estimate", "--model", "tiny", "--gpu", "h100", "--gpus", "8", "--gbs", str(10**12), "--seq-len", "128"),
     "gbs"),  # a global batch far beyond any published one: a slip of digits
    (("estimate", "--model", "tiny", "--gpu", "h100", "--gpus", str(10**7), "--gbs", "16", "--seq-len", "128"),
     "gpus"),  # more GPUs than any cluster by far
    (("estimate", *TINY, "--tokens", "1e40"), "tokens"),  # a budget far beyond any published run
    (("estimate", *TINY, "--train-iters", str(10**21)), "train_iters"),
    (("estimate", "--batch", "{dir}"), "batch"),
    (("estimate", "--batch", "{bin}"), "batch"),
    # plan
    (("plan", "--model", "no-such-model", "--gpu", "h100", "--gpus", "8"), "model"),
    (("plan", *TINY, "--tp", "0"), "--tp"),
    (("plan", *TINY, "--pp", "-2"), "--pp"),
    (("plan", *TINY, "--mbs", "0"), "--mbs"),
    (("plan", *TINY, "--gpus-per-node", "0"), "--gpus-per-node"),
    (("plan", "--model", "tiny", "--gpu", "h100", "--gpus", "8", "--gbs", "0"), "--gbs"),
    (("plan", *TINY, "--precision", "fp9"), "--precision"),
    (("plan", "--model", "tiny", "--gpu", "h100", "--gpus", "8", "--seq-len", "128", "--gbs", str(10**12)), "--gbs"),
    (("plan", "--model", "tiny", "--gpu", "h100", "--gpus", str(10**7), "--seq-len", "128", "--gbs", "16"), "gpus"),
    (("plan", *TINY, "--save", "{missing}/plan.json"), "--save"),
    (("plan", *TINY, "--save", "{dir}"), "--save"),
    (("plan", *TINY, "--profile", "{dir}"), "--profile"),
    (("plan", *TINY, "--profile", "{bin}"), "--profile"),
    # profile
    (("profile", "show", "--profile", "{bin}"), "--profile"),
    (("profile", "set", "--gpus", "0", "--profile", "{root}/p.toml"), "--gpus"),
    # a count plan would refuse (spec.hardware.MAX_GPUS) is refused when saved, not when the profile is next used
    (("profile", "set", "--gpus", "100000000", "--profile", "{root}/p.toml"), "--gpus"),
    (("diagnose", "{log}", "--gpus", "100000000"), "--gpus"),
    (("optimize", "--log", "{log}", "--gpus", "100000000"), "--gpus"),
    (("profile", "set", "--gpu", "no-such-gpu", "--profile", "{root}/p.toml"), "gpu"),
    # script
    (("script", "--plan", "{missing}", "--mock-data"), "--plan"),
    (("script", "--plan", "{dir}", "--mock-data"), "--plan"),
    (("script", "--plan", "{bin}", "--mock-data"), "--plan"),
    (("script", "--plan", "{badjson}", "--mock-data"), "--plan"),
    (("script", "--plan", "{list}", "--mock-data"), "--plan"),
    (("script", "--plan", "{v99}", "--mock-data"), "--plan"),
    (("script", "--plan", "{plan}", "--tp", "2", "--mock-data"), "--plan"),
    (("script", "--plan", "{plan}", "--model", "tiny", "--mock-data"), "--plan"),
    (("script", "--plan", "{plan}", "--mock-data", "--data-path", "/data/corpus"), "--data-path"),
    (("script", "--plan", "{plan}", "--mock-data", "--train-iters", "0"), "--train-iters"),
    (("script", "--plan", "{plan}", "--mock-data", "--nodes", "0"), "--nodes"),
    (("script", "--plan", "{plan}", "--mock-data", "--launcher", "pbs"), "launcher"),
    (("script", "--plan", "{plan}", "--mock-data", "--entrypoint", "megapilot", "-o", "{dir}"), "--output"),
    (("script", "--plan", "{plan}", "--mock-data", "--entrypoint", "megapilot", "-o", "{missing}/t.sh"),
     "--output"),
    (("script", *TINY, "--tp", "0", "--mock-data"), "tp"),
    (("script", "--plan", "{plan}", "--mock-data", "--train-iters", str(10**23)), "--train-iters"),
    # run
    (("run", "{missing}.sh"), "script"),
    (("run", "{dir}"), "script"),
    (("run", "--plan", "{dir}"), "--plan"),
    (("run", "--plan", "{bin}"), "--plan"),
    (("run", "--plan", "{badjson}"), "--plan"),
    (("run", "--plan", "{v99}"), "--plan"),
    (("run", "--plan", "{plan}", "--train-iters", "0"), "--train-iters"),
    (("run", "--plan", "{plan}", "--timeout-s", "-1"), "--timeout-s"),
    (("run", "--plan", "{plan}", "--hang-factor", "0"), "--hang-factor"),
    (("run", "{script}", "--device", "cpu"), "plan"),
    (("run", "{script}", "--combo", "../escape"), "--combo"),
    (("run", "{script}", "--timeout-s", "nan"), "--timeout-s"),
    # logs parse
    (("logs", "parse", "{missing}.log"), "FILE"),
    (("logs", "parse", "{dir}"), "FILE"),
    (("logs", "parse", "{dir}", "--follow", "--timeout", "1"), "FILE"),
    (("logs", "parse", "{missing}.log", "--follow", "--timeout", "0.2"), "FILE"),
    (("logs", "parse", "{empty}"), "FILE"),
    (("logs", "parse", "{bin}"), "FILE"),
    (("logs", "parse", "{log}", "--json", "--csv"), "--csv"),
    (("logs", "parse", "{log}", "--seq-length", "0"), "--seq-length"),
    (("logs", "parse", "{log}", "--follow", "--timeout", "-1"), "--timeout"),
    # diagnose
    (("diagnose", "{empty}"), "FILE"),
    (("diagnose", "{bin}"), "FILE"),
    (("diagnose", "{dir}"), "FILE"),
    (("diagnose", "{log}", "--gpu", "no-such-gpu"), "--gpu"),
    (("diagnose", "{log}", "--gpus", "0"), "--gpus"),
    (("diagnose", "{log}", "--script", "{bin}"), "--script"),
    (("diagnose", "{log}", "--script", "{missing}.sh"), "--script"),
    (("diagnose", "{log}", "--script", "{log}"), "--script"),  # a log is no launch script
    (("diagnose", "{log}", "--flags", "--save '/unbalanced"), "--flags"),
    (("diagnose", "{log}", "--flags", "--tensor-model-parallel-size abc"), "--tensor-model-parallel-size"),
    (("diagnose", "{log}", "--script", "{script}", "--flags", "--seq-length foo"), "--seq-length"),
    # optimize
    (("optimize",), "--script"),
    (("optimize", "--script", "{bin}", "--gpu", "h100"), "--script"),
    (("optimize", "--script", "{script}", "--gpu", "h100", "--gpus", "-8"), "--gpus"),
    (("optimize", "--script", "{script}", "--gpu", "h100", "--log", "{dir}"), "--log"),
    (("optimize", "--script", "{script}", "--gpu", "h100", "--log", "{empty}"), "--log"),
    (("optimize", "--script", "{script}", "--gpu", "h100", "--log", "{missing}.log"), "--log"),
    (("optimize", "--script", "{script}", "--gpu", "no-such-gpu"), "--gpu"),
    (("optimize", "--script", "{script}", "--gpu", "h100"), "--flags"),  # the model's shape is not all there
    (("optimize", "--script", "{log}", "--gpu", "h100"), "--script"),
    (("optimize", "--script", "{script}", "--gpu", "h100", "--flags", "--tensor-model-parallel-size 0"),
     "--tensor-model-parallel-size"),
    (("optimize", "--script", "{script}", "--gpu", "h100", "--flags", "--pipeline-model-parallel-size 2.5"),
     "--pipeline-model-parallel-size"),
    (("optimize", "--script", "{script}", "--gpu", "h100", "--flags", "--tensor-model-parallel-size -8"),
     "--tensor-model-parallel-size"),
    # data prepare
    (("data", "prepare", "{dir}", "--output-prefix", "{root}/out"), "INPUT"),
    (("data", "prepare", "{missing}.jsonl", "--output-prefix", "{root}/out"), "INPUT"),
    (("data", "prepare", "{root}/fake.jsonl.gz", "--output-prefix", "{root}/out"), "INPUT"),
]


def _fill(args: tuple[str, ...], files: dict[str, str]) -> list[str]:
    return [arg.format(**files) for arg in args]


@pytest.mark.parametrize("args, field", MISTAKES, ids=[" ".join(a)[:70] for a, _ in MISTAKES])
def test_a_user_mistake_is_one_line_naming_the_field_and_the_fix(cli, files, monkeypatch, tmp_path, args, field):
    monkeypatch.setenv("MEGAPILOT_PROFILE", str(tmp_path / "profile.toml"))  # no user's saved defaults
    monkeypatch.chdir(tmp_path)
    result = cli(*_fill(args, files))
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {field}: "), lines[0]
    assert " — fix: " in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("args", [
    ("plan", *TINY, "--tp", "0"),
    ("script", "--plan", "{bin}", "--mock-data"),
    ("run", "--plan", "{dir}"),
    ("logs", "parse", "{dir}", "--follow", "--timeout", "1"),
    ("estimate", "--batch", "{bin}"),
], ids=["plan-tp0", "script-binary-plan", "run-plan-dir", "follow-dir", "estimate-binary-batch"])
def test_the_installed_command_exits_2_without_traceback(files, tmp_path, args):
    binary = Path(sys.executable).with_name("megapilot")
    env = {**os.environ, "MEGAPILOT_PROFILE": str(tmp_path / "profile.toml")}
    env.pop("MEGAPILOT_DEBUG", None)
    proc = subprocess.run([str(binary), *_fill(args, files)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and " — fix: " in proc.stderr


def test_a_log_with_records_but_no_iteration_is_parsed_with_a_note(cli, tmp_path):
    log = tmp_path / "crash.log"
    log.write_text("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    result = cli("logs", "parse", str(log))
    assert result.exit_code == 0
    assert "no iteration line found" in result.stderr
    assert "None" not in result.stdout


def test_a_healthy_log_says_no_problem_once(cli):
    result = cli("diagnose", str(LOG))
    assert result.exit_code == 0
    assert result.stdout.lower().count("no problem found") == 1


def test_a_tiny_cpu_rate_is_not_rounded_to_zero():
    from megapilot.cli.logs_cmd import _fmt_rate

    assert _fmt_rate(0.00123) == "0.00123" and _fmt_rate(744.04) == "744" and _fmt_rate(None) == "—"


def test_an_empty_stdin_is_named_as_such(tmp_path):
    binary = Path(sys.executable).with_name("megapilot")
    proc = subprocess.run([str(binary), "logs", "parse", "-"], input="", capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: FILE: standard input is empty — fix:")
