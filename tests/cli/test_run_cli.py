"""`megapilot run` through the real entry point, with small real programs as the training job."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.signals import interruptible

PRINTER = Path(__file__).parents[1] / "execute" / "programs" / "iteration_printer.py"
RESULT_KEYS = {"combo", "executor", "job_id", "state", "exit_code", "reason", "iterations_reached", "train_iters",
               "step_time_s", "started_at", "ended_at", "duration_s", "job_dir", "logs"}


def launch_script(tmp_path: Path, *flags: str) -> Path:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nexec " + " ".join([sys.executable, str(PRINTER), *flags]) + "\n")
    return script


def run_json(cli, *args: str):
    result = cli("run", *args, "--json")
    return result, (result.json() if result.stdout.strip() else None)


def test_completed_run_exits_zero_with_the_result_schema(cli, tmp_path):
    result, payload = run_json(cli, str(launch_script(tmp_path, "--iters", "4")), "--run-dir", str(tmp_path / "runs"),
                               "--combo", "ok")
    assert result.exit_code == 0
    assert set(payload) == RESULT_KEYS | {"prediction_note"}  # the printer's flags describe no model to predict
    assert "do not say the whole model" in payload["prediction_note"]
    assert payload["state"] == "COMPLETED" and payload["iterations_reached"] == payload["train_iters"] == 4
    assert payload["logs"] == [str(tmp_path / "runs" / "ok" / "out-node0" / "training.log")]
    assert json.loads((tmp_path / "runs" / "ok" / "job.json").read_text())["status"]["state"] == "COMPLETED"


def test_human_output_is_a_table_with_state_and_iterations(cli, tmp_path):
    result = cli("run", str(launch_script(tmp_path, "--iters", "3")), "--run-dir", str(tmp_path), "--combo", "h")
    assert result.exit_code == 0
    assert "COMPLETED" in result.stdout and "3 / 3" in result.stdout and "training.log" in result.stdout
    assert "no prediction: its flags do not say the whole model" in result.stdout  # said, not left out


def test_run_that_stops_early_exits_one_with_the_reason(cli, tmp_path):
    script = launch_script(tmp_path, "--iters", "5", "--exit-after", "2")
    result, payload = run_json(cli, str(script), "--run-dir", str(tmp_path), "--combo", "early")
    assert result.exit_code == 1
    assert payload["state"] == "FAILED" and "before the final iteration" in payload["reason"]


def test_hang_timeout_flag_ends_a_silent_run_as_hung(cli, tmp_path):
    script = launch_script(tmp_path, "--iters", "50", "--stall-after", "2")
    result, payload = run_json(cli, str(script), "--run-dir", str(tmp_path), "--combo", "hang",
                               "--hang-timeout-s", "0.8")
    assert result.exit_code == 1 and payload["state"] == "HUNG" and payload["iterations_reached"] == 2


def test_train_iters_flag_sets_the_final_iteration(cli, tmp_path):
    result, payload = run_json(cli, str(launch_script(tmp_path, "--iters", "3")), "--run-dir", str(tmp_path),
                               "--combo", "short", "--train-iters", "10")
    assert result.exit_code == 1 and payload["train_iters"] == 10


@pytest.mark.parametrize("args, field", [
    (("missing.sh",), "script"),
    ((), "script"),
    (("--plan", "missing.json"), "plan"),
    (("x.sh", "--plan", "p.json"), "script"),
    (("x.sh", "--executor", "pbs"), "executor"),
    (("x.sh", "--hang-factor", "0.5"), "--hang-factor"),
    (("x.sh", "--combo", ""), "--combo"),  # an empty name (an unset shell variable) is refused, not replaced
    (("x.sh", "--run-dir", "x.sh"), "--run-dir"),  # a file where the run's directory goes
])
def test_user_errors_exit_two_on_one_line(cli, tmp_path, monkeypatch, args, field):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.sh").write_text("true\n")
    result = cli("run", *args)
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert f"{field}:" in result.stderr


def test_plan_that_is_not_json_or_not_a_plan_is_a_user_error(cli, tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "b.json").write_text('{"version": 1}')
    first, second = cli("run", "--plan", str(tmp_path / "a.json")), cli("run", "--plan", str(tmp_path / "b.json"))
    assert first.exit_code == second.exit_code == 2
    assert "plan: " in first.stderr and "is not JSON" in first.stderr
    assert "plan.model" in second.stderr and "fix:" in second.stderr


@pytest.mark.parametrize("name, content, says", [
    ("plan.json", '{\n  "version": 1,\n  "model": {}\n}\n', "megapilot run --plan"),
    ("exp.yaml", "work_group: AMD\nmodules:\n  pre_trainer: {}\n", "--launcher primus"),
    ("blob.sh", "\x7fELF\x00\x00", "binary"),
])
def test_what_bash_cannot_run_is_refused_before_a_run_starts(cli, tmp_path, monkeypatch, name, content, says):
    """Bash ran a saved plan given in the script's place line by line: 'version:: command not found', exit 127, a
    failed run on record."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(content)
    result = cli("run", name)
    assert result.exit_code == 2 and says in result.stderr and "script:" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_reusing_a_combo_is_refused(cli, tmp_path):
    script = str(launch_script(tmp_path, "--iters", "1"))
    assert cli("run", script, "--run-dir", str(tmp_path), "--combo", "c", "--json").exit_code == 0
    again = cli("run", script, "--run-dir", str(tmp_path), "--combo", "c")
    assert again.exit_code == 2 and again.stderr.startswith("error: --combo:") and again.stderr.count("\n") == 1


def test_a_run_directory_it_cannot_use_is_one_error_line_without_the_plans_notes(cli, tmp_path):
    (tmp_path / "file").write_text("")
    result = cli("run", "--plan", str(_saved_tiny_plan(tmp_path)), "--run-dir", str(tmp_path / "file"), "--no-history",
                 "--device", "cpu")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: --run-dir: cannot create") and result.stderr.count("\n") == 1


def test_a_full_disk_is_a_run_dir_error_and_leaves_nothing_running(cli, tmp_path, monkeypatch):
    from megapilot.execute import local
    from megapilot.files import DiskFullError

    def full_disk(directory, record):
        raise DiskFullError(directory / "job.json", 2048)

    monkeypatch.setattr(local, "write_job_record", full_disk)
    script = launch_script(tmp_path, "--iters", "100", "--interval-s", "0.1")
    result = cli("run", str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "full")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: --run-dir: cannot write the run's files: no space left on the device")
    assert "fix: free space on that file system, or pass a --run-dir on another one" in result.stderr
    marker = str((tmp_path / "runs" / "full").resolve())
    left = [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get("MEGAPILOT_JOB_DIR") == marker]
    assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE]


def test_plan_is_rendered_for_the_trainer_and_multi_node_refused_locally(cli, tmp_path):
    from megapilot.catalog.gpus import get_gpu
    from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, SavedPlan, TrainingSpec

    model = ModelSpec(name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                      vocab_size=1024, max_position_embeddings=128)
    cluster = ClusterSpec(gpu=get_gpu("h100"), num_nodes=2, gpus_per_node=2)
    plan = SavedPlan(model=model, cluster=cluster, training=TrainingSpec(seq_length=64, global_batch_size=4),
                     parallel=ParallelConfig.for_world(4, tp=2, mbs=1))
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    result = cli("run", "--plan", str(tmp_path / "plan.json"), "--run-dir", str(tmp_path))
    assert result.exit_code == 2 and "nodes:" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_interrupting_megapilot_stops_the_run_and_prints_it_cancelled(tmp_path, signum):
    # long enough (200 s) that a loaded host cannot finish the run before the signal lands
    script = launch_script(tmp_path, "--iters", "2000", "--interval-s", "0.1", "--spawn-children", "1")
    command = [sys.executable, "-m", "megapilot", "run", str(script), "--run-dir", str(tmp_path), "--combo", "i",
               "--json"]
    cli_process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=interruptible)
    log = tmp_path / "i" / "out-node0" / "training.log"
    deadline = time.monotonic() + 90  # a host busy with other tests can take a minute to start the run
    while time.monotonic() < deadline and "iteration        2/" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.1)
    assert cli_process.poll() is None, "the run ended before it could be interrupted"
    cli_process.send_signal(signum)
    out, err = cli_process.communicate(timeout=90)

    assert cli_process.returncode == 128 + signum, err  # the shell's code for "stopped by signal N"
    payload = json.loads(out)
    assert payload["state"] == "CANCELLED"
    how = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
    assert payload["reason"].startswith(f"interrupted by {how} ")  # not a bare 'cancelled'
    assert payload["reason"].endswith("; the run was stopped")
    said = re.search(r" at iteration (\d+) of 2000;", payload["reason"])  # the last one read before the signal
    assert said is not None or " before an iteration line was read;" in payload["reason"]
    assert said is None or int(said.group(1)) <= payload["iterations_reached"]
    record = json.loads((tmp_path / "i" / "job.json").read_text())
    assert record["status"]["reason"] == payload["reason"]  # the record says the same, not a bare 'cancelled'
    for entry in record["processes"]:
        assert not psutil.pid_exists(entry["pid"]) or psutil.Process(entry["pid"]).status() == psutil.STATUS_ZOMBIE


# ---- run --plan: device and data ---------------------------------------------------------------

def _saved_tiny_plan(tmp_path: Path, **layout) -> Path:
    from megapilot.catalog.gpus import get_gpu
    from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, SavedPlan, TrainingSpec

    model = ModelSpec(name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                      vocab_size=1024, max_position_embeddings=128)
    plan = SavedPlan(model=model, cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=1, gpus_per_node=2),
                     training=TrainingSpec(seq_length=64, global_batch_size=4, train_iters=7),
                     parallel=ParallelConfig.for_world(2, mbs=1, **layout))
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    return path


def _plan_job(tmp_path: Path, plan: Path, **data):
    from megapilot.cli.run_cmd import _job_from_flags, _PlanData

    job, notes, script_flags = _job_from_flags(None, plan, "local", tmp_path, "c", None, 10.0, 900.0, None, None,
                                               _PlanData(**data))
    assert script_flags is None  # a plan has no launch script to read
    return job.script_text, notes


def test_plan_renders_for_cpu_when_no_gpu_is_present(tmp_path, monkeypatch):
    import megapilot.cli.run_cmd as run_cmd

    plan = _saved_tiny_plan(tmp_path, tp=2, sequence_parallel=True, recompute="selective")
    monkeypatch.setattr(run_cmd, "gpu_present", lambda: False)
    script, notes = _plan_job(tmp_path, plan)
    assert "--distributed-backend gloo" in script and "--sequence-parallel" not in script
    assert "--bf16" not in script and "--mock-data" in script
    assert any("sequence parallelism left out" in note for note in notes)

    monkeypatch.setattr(run_cmd, "gpu_present", lambda: True)
    script, _ = _plan_job(tmp_path, plan)
    assert "--distributed-backend" not in script and "--sequence-parallel" in script and "--bf16" in script
    script, _ = _plan_job(tmp_path, plan, device="cpu")  # forced
    assert "--distributed-backend gloo" in script


def test_plan_trains_on_a_data_path_with_the_byte_tokenizer(tmp_path, monkeypatch):
    import megapilot.cli.run_cmd as run_cmd
    from megapilot.diagnose.shell_words import script_words
    from megapilot.trainer.config import build_config

    monkeypatch.setattr(run_cmd, "gpu_present", lambda: False)
    (tmp_path / "corpus.bin").write_bytes(b"")
    (tmp_path / "corpus.idx").write_bytes(b"")
    script, notes = _plan_job(tmp_path, _saved_tiny_plan(tmp_path), data_path=tmp_path / "corpus")
    assert f"--data-path {tmp_path / 'corpus'}" in script and "--mock-data" not in script
    assert "--tokenizer-type" not in script  # the trainer's byte tokenizer is its default for --data-path
    assert any("byte tokenizer" in note for note in notes)
    words = script_words(script).variables["MEGATRON_ARGS"]
    assert build_config(words, gpu_available=False).tokenizer_type == "ByteTokenizer"


def test_gpu_presence_is_read_from_vendor_tools_without_torch(tmp_path, monkeypatch):
    from megapilot.cli import run_cmd

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(run_cmd.Path, "exists", lambda self: False)
    assert run_cmd.gpu_present() is False
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert run_cmd.gpu_present() is True
    assert "torch" not in subprocess.run([sys.executable, "-c", "import sys, megapilot.cli.run_cmd as r; "
                                          "r.gpu_present(); print(' '.join(sys.modules))"],
                                         capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("args, field", [
    (("--plan", "p.json", "--device", "tpu"), "device"),
    (("--plan", "p.json", "--tokenizer-type", "ByteTokenizer"), "tokenizer_type"),
    (("--plan", "p.json", "--data-path", "d", "--tokenizer-type", "HuggingFaceTokenizer"), "tokenizer_type"),
    (("x.sh", "--data-path", "d"), "plan"),
])
def test_plan_data_options_are_checked(cli, tmp_path, monkeypatch, args, field):
    monkeypatch.chdir(tmp_path)
    _saved_tiny_plan(tmp_path).rename(tmp_path / "p.json")
    (tmp_path / "x.sh").write_text("true\n")
    result = cli("run", *args)
    assert result.exit_code == 2 and result.stderr.strip().count("\n") == 0
    assert f"{field}:" in result.stderr


# ---- run SCRIPT: predicted from the script's own flags -------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_launch_script_is_predicted_as_the_plan_it_was_written_from(tmp_path, device):
    """A script `megapilot script` wrote for a plan gets the plan's own prediction: on this machine's CPU for a gloo
    script, on the GPU its header names otherwise."""
    from megapilot.cli.common import load_plan_file
    from megapilot.cli.run_cmd import _plan_prediction, _PlanData, _render_plan, _script_prediction, _ScriptFlags

    plan = _saved_tiny_plan(tmp_path, tp=2)
    data = _PlanData(device=device)
    script = tmp_path / "train.sh"
    script.write_text(_render_plan(load_plan_file(plan), data).script)
    predicted, why_not = _script_prediction(_ScriptFlags.read(script))
    expected = _plan_prediction(plan, data)
    assert why_not is None and predicted is not None
    assert predicted.device == expected.device and predicted.device.startswith("CPU" if device == "cpu" else "H100")
    for field in ("step_time_ms", "tokens_per_s_per_gpu", "memory_gib"):
        assert getattr(predicted, field) == pytest.approx(getattr(expected, field)), field


def test_a_script_with_an_elastic_torchrun_is_predicted_on_its_max_nodes(tmp_path):
    """`torchrun --nnodes 1:4` is elastic, not a bad number: the run is priced as the full run of 4 nodes."""
    from megapilot.cli.common import load_plan_file
    from megapilot.cli.run_cmd import _PlanData, _render_plan, _script_prediction, _ScriptFlags
    from megapilot.spec import ParallelConfig

    plan = load_plan_file(_saved_tiny_plan(tmp_path))
    plan = plan.model_copy(update={"cluster": plan.cluster.model_copy(update={"num_nodes": 4}),
                                   "parallel": ParallelConfig.for_world(8, mbs=1),
                                   "training": plan.training.model_copy(update={"global_batch_size": 8})})
    text = _render_plan(plan, _PlanData(device="gpu")).script
    assert "--nnodes 4" in text
    fixed, elastic = tmp_path / "fixed.sh", tmp_path / "elastic.sh"
    fixed.write_text(text)
    elastic.write_text(text.replace("--nnodes 4", "--nnodes 1:4"))
    read = _ScriptFlags.read(elastic)
    assert read.config is not None and any("--nnodes 1:4 is elastic" in note for note in read.config.notes)
    (predicted, why_not), (expected, _) = _script_prediction(read), _script_prediction(_ScriptFlags.read(fixed))
    assert why_not is None and predicted is not None and expected is not None
    assert predicted.step_time_ms == pytest.approx(expected.step_time_ms)


def test_a_script_without_a_known_gpu_says_why_it_has_no_prediction(tmp_path):
    from megapilot.cli.common import load_plan_file
    from megapilot.cli.run_cmd import _PlanData, _render_plan, _script_prediction, _ScriptFlags

    text = _render_plan(load_plan_file(_saved_tiny_plan(tmp_path)), _PlanData(device="gpu")).script
    script = tmp_path / "train.sh"
    script.write_text("\n".join(line for line in text.splitlines() if " launch: " not in line))  # no header
    predicted, why_not = _script_prediction(_ScriptFlags.read(script))
    assert predicted is None and "names no GPU megapilot knows" in (why_not or "")


def test_a_scripts_ranks_per_node_are_recorded_as_it_states_them(cli, tmp_path):
    script = tmp_path / "train.sh"  # the torchrun line states the ranks; the printer stands in for training
    script.write_text(f"#!/bin/bash\nif false; then torchrun --nproc-per-node 2 pretrain_gpt.py --num-layers 2; fi\n"
                      f"exec {sys.executable} {PRINTER} --iters 3\n")
    result, _ = run_json(cli, str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "two")
    assert result.exit_code == 0
    assert json.loads((tmp_path / "runs" / "two" / "job.json").read_text())["gpus_per_node"] == 2


def test_a_script_whose_torchrun_counts_its_own_ranks_runs_as_written(cli, tmp_path):
    """torchrun's `--nproc-per-node gpu` (one rank per GPU it finds) is no number to record, not a bad script."""
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\nif false; then torchrun --nproc-per-node gpu pretrain_gpt.py --num-layers 2; fi\n"
                      f"exec {sys.executable} {PRINTER} --iters 3\n")
    result, payload = run_json(cli, str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "auto")
    assert result.exit_code == 0 and payload["state"] == "COMPLETED"
    # the ranks torchrun counts are no reason to refuse: the reason there is none is the model the flags leave out
    assert payload["prediction_note"].startswith("its flags do not say the whole model")
    # a count no executor knows: recorded as none, not as the default 1 (nor as a guess)
    assert json.loads((tmp_path / "runs" / "auto" / "job.json").read_text())["gpus_per_node"] is None


def _priced_script_counting_its_ranks(tmp_path: Path) -> Path:
    """A script `megapilot script` wrote for an H100 plan, its torchrun made to start a rank per GPU; the printer
    stands in for training."""
    from megapilot.cli.common import load_plan_file
    from megapilot.cli.run_cmd import _PlanData, _render_plan

    text = _render_plan(load_plan_file(_saved_tiny_plan(tmp_path)), _PlanData(device="gpu")).script
    launch = next(line for line in text.splitlines() if "--nproc-per-node" in line)
    header = next(line for line in text.splitlines() if " launch: " in line)
    assert "--nproc-per-node 2" in launch
    script = tmp_path / "train.sh"
    assert "--global-batch-size 4" in text  # 8 ranks at DP 8 take a batch of 8
    body = text.split("\n", 1)[1].replace("--nproc-per-node 2", "--nproc-per-node gpu").replace(
        "--global-batch-size 4", "--global-batch-size 8")
    script.write_text(f"#!/bin/bash\n{header}\nif false; then\n{body}\nfi\nexec {sys.executable} {PRINTER} --iters 3\n")
    return script


def test_a_priced_script_whose_torchrun_counts_a_rank_per_gpu_says_what_it_assumed(cli, tmp_path):
    """The prediction prices a rank per GPU of the GPU type's node (8 H100s): run says so, as diagnose does, and
    job.json records no count it was not given."""
    script = _priced_script_counting_its_ranks(tmp_path)
    result, payload = run_json(cli, str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "gpu")
    assert result.exit_code == 0 and payload["predicted"], payload
    [assumed] = [note for note in payload["prediction_assumptions"]
                 if note.startswith("torchrun --nproc-per-node gpu starts a rank per GPU")]
    assert "assumed 8 GPUs per node" in assumed
    assert json.loads((tmp_path / "runs" / "gpu" / "job.json").read_text())["gpus_per_node"] is None
    shown = cli("run", str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "gpu-text")
    assert shown.exit_code == 0, shown.stderr
    assert f"note: {assumed}" in " ".join(shown.stderr.split())


def test_a_scripts_flags_are_read_once_for_its_ranks_and_its_prediction(cli, tmp_path, monkeypatch):
    """The ranks recorded and the run predicted come from one reading of the script, not two."""
    from megapilot.diagnose import flags

    reads: list[Path] = []
    read_script = flags._script_flags
    monkeypatch.setattr(flags, "_script_flags", lambda path: reads.append(path) or read_script(path))
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\nif false; then torchrun --nproc-per-node 2 pretrain_gpt.py --num-layers 2; fi\n"
                      f"exec {sys.executable} {PRINTER} --iters 3\n")
    result, payload = run_json(cli, str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "once")
    assert result.exit_code == 0 and "do not say the whole model" in payload["prediction_note"]
    assert json.loads((tmp_path / "runs" / "once" / "job.json").read_text())["gpus_per_node"] == 2
    assert reads == [script]


TIMED_LOG = "".join(
    f" [2026-01-01 00:00:0{i}.000000] iteration {i:8d}/{3:8d} | consumed samples: {4 * i:12d} | elapsed time per "
    f"iteration (ms): 500.0 | lm loss: {'nan' if i == 2 else '5.000000E+00'} | number of nan iterations: "
    f"{int(i == 2):3d} |\n(min, max) time across ranks (ms):\n"
    "    forward-backward ...............................: (480.00, 490.00)\n"
    "    optimizer ......................................: (5.00, 6.00)\n" for i in (1, 2, 3))


def test_a_predicted_runs_log_is_read_once_for_its_departure_and_its_numerics(cli, tmp_path, monkeypatch):
    """After the run, one pass over its log gives both the timers (where it departs from the prediction) and the
    NaN count (the numerics warning)."""
    import megapilot.logs
    from megapilot.cli.common import load_plan_file
    from megapilot.cli.run_cmd import _PlanData, _render_plan

    reads: list[list[str]] = []
    parse_logs = megapilot.logs.parse_logs
    monkeypatch.setattr(megapilot.logs, "parse_logs", lambda paths, **kw: reads.append(list(map(str, paths)))
                        or parse_logs(paths, **kw))
    rendered = _render_plan(load_plan_file(_saved_tiny_plan(tmp_path)), _PlanData(device="cpu")).script
    launch = rendered.splitlines()[-1]  # the tiny model's flags stay for its prediction; a printed log stands in
    log = tmp_path / "timed.log"
    log.write_text(TIMED_LOG)
    script = tmp_path / "train.sh"
    script.write_text(rendered.replace(launch, f"if false; then {launch}; fi\ncat {log}"))
    result, payload = run_json(cli, str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "timed")
    assert result.exit_code == 0 and payload["state"] == "COMPLETED"
    assert "the measured forward-backward time is" in payload["prediction_departure"]
    assert "1 iteration(s) had a NaN/Inf loss" in payload["warnings"][0]
    assert reads == [payload["logs"]]


# Megatron-LM's own iteration lines (the fixed field order the bulk pass reads without the line parser), with timers.
CANONICAL_TIMED_LOG = "".join(
    f" [2026-01-01 00:00:0{i}.000000] iteration {i:8d}/{3:8d} | consumed samples: {4 * i:12d} | elapsed time per "
    f"iteration (ms): 500.0 | learning rate: 1.000000E-04 | global batch size:     4 | lm loss: "
    f"{'nan' if i == 2 else '5.000000E+00'} | loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 "
    f"| number of nan iterations: {int(i == 2):3d} |\n(min, max) time across ranks (ms):\n"
    "    forward-backward ...............................: (480.00, 490.00)\n"
    "    optimizer ......................................: (5.00, 6.00)\n" for i in (1, 2, 3))


@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_a_predicted_runs_log_is_read_by_the_bulk_pass_with_its_timers(cli, tmp_path, monkeypatch, engine):
    """The one reading after the run is the bulk summary pass, its timer lines kept: never the per-line reader
    (~100x slower on a long multi-rank log), whichever engine reads."""
    import megapilot.logs.collect
    from megapilot.cli.common import load_plan_file
    from megapilot.cli.run_cmd import _PlanData, _render_plan

    def no_line_path(*args, **kwargs):
        raise AssertionError("the log was read line by line")

    monkeypatch.setattr(megapilot.logs.collect, "_feed", no_line_path)
    monkeypatch.setenv("MEGAPILOT_LOG_ENGINE", engine)
    rendered = _render_plan(load_plan_file(_saved_tiny_plan(tmp_path)), _PlanData(device="cpu")).script
    launch = rendered.splitlines()[-1]
    log = tmp_path / "timed.log"
    log.write_text(CANONICAL_TIMED_LOG)
    script = tmp_path / "train.sh"
    script.write_text(rendered.replace(launch, f"if false; then {launch}; fi\ncat {log}"))
    result, payload = run_json(cli, str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "bulk")
    assert result.exit_code == 0 and payload["state"] == "COMPLETED", result.stderr
    assert "the measured forward-backward time is" in payload["prediction_departure"]
    assert "1 iteration(s) had a NaN/Inf loss" in payload["warnings"][0]


def test_a_run_that_finished_with_nan_steps_exits_zero_and_says_so(cli, tmp_path):
    script = launch_script(tmp_path, "--iters", "4", "--nan-at", "2")
    result, payload = run_json(cli, str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "nan")
    assert result.exit_code == 0 and payload["state"] == "COMPLETED"  # it reached its final iteration
    assert "1 iteration(s) had a NaN/Inf loss" in payload["warnings"][0]
    human = cli("run", str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "nan-text")
    assert human.exit_code == 0 and "warning: 1 iteration(s) had a NaN/Inf loss" in human.stderr


def test_a_run_whose_id_another_clusters_run_holds_is_not_said_to_be_recorded(tmp_path, capsys):
    # the history keeps the other cluster's run and refuses this row: the run must not print "recorded as ..."
    from datetime import datetime

    from megapilot.cli.run_cmd import _load_plan, _Recorder
    from megapilot.execute.base import JobResult, JobState
    from megapilot.spec.prediction import Prediction
    from megapilot.store.history import open_history
    from megapilot.store.measured import from_plan_run

    plan_path = _saved_tiny_plan(tmp_path)
    db = str(tmp_path / "history.sqlite")
    started = datetime(2026, 12, 6, 10, 0, 0)
    prediction = Prediction(step_time_ms=100.0, tokens_per_s_per_gpu=1000.0, device="CPU", family="dense",
                            uncalibrated_step_time_ms=100.0, uncalibrated_components_ms={"compute": 100.0})
    run_id = f"run/tour@{started:%Y%m%d-%H%M%S}"
    with open_history(db) as history:
        other = from_plan_run(run_id, "other-lab", _load_plan(plan_path), prediction, 0.12, completed=True,
                              recorded_at="earlier")
        assert other is not None
        history.record_measured([other])
    result = JobResult(combo="tour", executor="local", job_id="1", state=JobState.COMPLETED, exit_code=0, reason=None,
                       iterations_reached=7, train_iters=7, step_time_s=0.11, started_at=started, ended_at=started,
                       duration_s=1.0, job_dir=tmp_path, logs=[])
    assert _Recorder(db, "local", plan_path).record(result, prediction) is None
    assert "was not recorded" in capsys.readouterr().err
    with open_history(db, read_only=True) as history:
        assert [row.cluster for row in history.measured()] == ["other-lab"]  # the other run left where it was


def test_slurm_without_a_controller_is_one_error_naming_the_executor_and_no_run_folder(cli, tmp_path, monkeypatch):
    (tmp_path / "empty.conf").write_text("")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "empty.conf"))  # real sbatch, which then reaches no controller
    result = cli("run", str(launch_script(tmp_path, "--iters", "1")), "--run-dir", str(tmp_path / "runs"),
                 "--executor", "slurm")
    assert result.exit_code == 2 and result.stderr.startswith("error: --executor: sbatch cannot reach the SLURM ")
    assert "sinfo" in result.stderr and not (tmp_path / "runs").exists()


def test_a_signal_between_the_submit_and_the_first_poll_still_stops_the_run_and_reports_it(tmp_path, monkeypatch):
    """Ctrl-C while `run` was still saying its notes (the job already started) used to escape the follower: the
    job was stopped only at exit and no result was printed."""
    from megapilot.cli import run_cmd
    from megapilot.execute.base import JobSpec, JobState

    script = launch_script(tmp_path, "--iters", "2000", "--interval-s", "0.1")

    def ctrl_c(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_cmd.err_console, "print", ctrl_c)
    job = JobSpec(combo="early", run_dir=tmp_path, script=script)
    try:
        result, interrupted = run_cmd._run_and_follow(job, show_progress=False, notes=["a note"])
    except KeyboardInterrupt:  # failed here, not as an interrupt of the whole test session
        pytest.fail("the signal escaped run's follower: the run was left to the exit handler, its result unsaid")
    assert interrupted and result.state == JobState.CANCELLED
    assert result.reason == "interrupted by Ctrl-C (SIGINT) before an iteration line was read; the run was stopped"
    record = json.loads((tmp_path / "early" / "job.json").read_text())
    assert record["status"]["state"] == "CANCELLED"
    for entry in record["processes"]:
        assert not psutil.pid_exists(entry["pid"]) or psutil.Process(entry["pid"]).status() == psutil.STATUS_ZOMBIE
