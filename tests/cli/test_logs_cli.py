"""`megapilot logs parse`, `diagnose`, `optimize` through the real entry point."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
CORE016 = str(DATA / "synthetic_megatron_core016_full.log")


def test_logs_parse_json_schema(cli):
    result = cli("logs", "parse", CORE016, "--json")
    assert result.exit_code == 0
    data = result.json()
    assert set(data) >= {"dialect", "iterations", "memory", "checkpoints", "errors", "summary"}
    assert data["dialect"] == "megatron-lm" and len(data["iterations"]) == 6
    # steady: 42, 43, 44, 46 (41 is warm-up, 45 holds the checkpoint save)
    assert data["summary"]["steady_iterations"] == 4
    assert data["summary"]["step_time_p50_ms"] == pytest.approx(9070.05)
    assert data["checkpoints"][1]["duration_s"] == 30.0


def test_logs_parse_csv_has_one_row_per_iteration(cli):
    result = cli("logs", "parse", CORE016, "--csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["iteration"] for r in rows] == ["41", "42", "43", "44", "45", "46"]
    assert rows[1]["tflops_per_gpu"] == "744.0"


def test_logs_parse_table_for_humans(cli):
    result = cli("logs", "parse", CORE016)
    assert result.exit_code == 0 and "step time mean" in result.stdout and "megatron-lm" in result.stdout


def test_logs_parse_reads_stdin(cli, monkeypatch):
    raw = (DATA / "real/04_low_throughput_mixtral_h100_130tflops.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    data = cli("logs", "parse", "-", "--json", "--summary-only").json()
    assert data["iterations"] == [] and data["summary"]["iterations_counted"] == 3


def test_diagnose_reads_a_log_on_stdin_once_when_the_flags_are_of_another_run(cli, monkeypatch):
    """The flags' run differs from the log's: the log is read a second time, from a copy of standard input."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        (DATA / "synthetic_megatron_arguments.log").read_bytes())))
    result = cli("diagnose", "-", "--flags", "--tensor-model-parallel-size 4 --num-layers 24 --hidden-size 1024 "
                 "--num-attention-heads 16 --seq-length 2048 --global-batch-size 64 --micro-batch-size 1", "--json")
    assert result.exit_code == 0, result.stderr
    payload = result.json()
    assert payload["findings"][0]["category"] == "log_mismatch" and payload["summary"]["iterations_logged"] == 3


@pytest.mark.parametrize("command", [("diagnose",), ("logs", "parse")])
def test_binary_data_skipped_on_stdin_is_said_of_stdin(cli, monkeypatch, command):
    """Every message about standard input names it `<stdin>`, the note on a crash's NUL padding included."""
    crash = (DATA / "synthetic_crash_nul_padded.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(crash)))
    result = cli(*command, "-")
    assert result.exit_code == 0, result.stderr
    [note] = [line for line in (result.stdout + result.stderr).splitlines() if "binary data" in line]
    assert note.startswith("note: <stdin>: skipped 22 KB of binary data on lines 21, 27")
    assert "-:" not in result.stdout + result.stderr


def test_text_on_stdin_that_is_no_training_log_is_named_stdin(cli, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello world, nothing a job printed\n")))
    result = cli("diagnose", "-")
    assert result.exit_code == 1
    assert " ".join(result.stderr.split()).startswith("error: FILE: <stdin>: this is not a training log")


def test_logs_parse_of_stdin_is_titled_stdin(cli, monkeypatch):
    crash = (DATA / "synthetic_crash_nul_padded.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(crash)))
    result = cli("logs", "parse", "-")
    assert result.stdout.lstrip().startswith("<stdin> — dialect megatron-lm")


@pytest.mark.parametrize("word", ["gpu", "auto"])
def test_diagnose_and_optimize_price_a_script_whose_torchrun_starts_a_rank_per_gpu(cli, tmp_path: Path, word: str):
    """`torchrun --nproc-per-node gpu` is no bad number: the run is priced on the GPU's node (8 H100s a node)."""
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\ntorchrun --nproc-per-node {word} --nnodes 2 pretrain_gpt.py "
                      "--tensor-model-parallel-size 2 --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
                      "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 "
                      "--bf16 --vocab-size 32000\n")
    optimized = cli("optimize", "--script", str(script), "--gpu", "h100", "--json")
    assert optimized.exit_code == 0, optimized.stderr
    report = optimized.json()
    assert report["current"]["predicted_tokens_per_s_per_gpu"] and "DP8" in report["current"]["layout"].split()
    assert any(f"--nproc-per-node {word} starts a rank per GPU" in note and "2 x 8 = 16 GPUs" in note
               for note in report["notes"])
    diagnosed = cli("diagnose", str(DATA / "synthetic_slowdown.log"), "--script", str(script), "--gpu", "h100",
                    "--json")
    assert diagnosed.exit_code == 0, diagnosed.stderr
    assert any("2 x 8 = 16 GPUs" in note for note in diagnosed.json()["notes"])


ELASTIC_SCRIPT = ("#!/bin/bash\ntorchrun --nproc-per-node 8 --nnodes {nnodes} pretrain_gpt.py "
                  "--tensor-model-parallel-size 2 --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
                  "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 "
                  "--bf16 --vocab-size 32000\n")


def test_diagnose_prices_an_elastic_torchrun_on_its_max_nodes(cli, tmp_path: Path):
    """`--nnodes 1:4` is torchrun's elastic range, not a bad number: a full run has its 4 nodes."""
    script = tmp_path / "train.sh"
    script.write_text(ELASTIC_SCRIPT.format(nnodes="1:4"))
    result = cli("diagnose", str(DATA / "synthetic_slowdown.log"), "--script", str(script), "--gpu", "h100", "--json")
    assert result.exit_code == 0, result.stderr
    assert any(note.startswith("torchrun --nnodes 1:4 is elastic") and "priced on 4 nodes" in note
               for note in result.json()["notes"])


def test_diagnose_refuses_a_nnodes_torchrun_does_not_take_naming_both_forms(cli, tmp_path: Path):
    script = tmp_path / "train.sh"
    script.write_text(ELASTIC_SCRIPT.format(nnodes="4:1"))
    result = cli("diagnose", str(DATA / "synthetic_slowdown.log"), "--script", str(script), "--gpu", "h100")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "--nnodes" in result.stderr and "MIN:MAX" in result.stderr


@pytest.mark.parametrize("command", [("diagnose",), ("diagnose", "--json"), ("logs", "parse"),
                                     ("logs", "parse", "--json", "--summary-only")])
def test_binary_on_stdin_is_refused_as_the_same_bytes_in_a_file_are(cli, monkeypatch, tmp_path: Path, command):
    import random

    noise = random.Random(4).randbytes(40_000)
    (tmp_path / "noise.bin").write_bytes(noise)
    as_file = cli(*command, str(tmp_path / "noise.bin"))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(noise)))
    as_stdin = cli(*command, "-")
    assert as_stdin.exit_code == as_file.exit_code == 2 and as_stdin.stdout == ""
    assert as_stdin.stderr == as_file.stderr.replace(str(tmp_path / "noise.bin"), "<stdin>")
    assert as_stdin.stderr.startswith("error: FILE: <stdin> is not a text file — fix: ")


def test_logs_parse_follow_stops_at_idle_timeout(cli, tmp_path: Path):
    log = tmp_path / "growing.log"
    log.write_text((DATA / "synthetic_bridge.log").read_text())
    data = cli("logs", "parse", str(log), "--follow", "--idle-timeout", "0.3", "--json").json()
    assert data["dialect"] == "megatron-bridge" and len(data["iterations"]) == 3


def test_logs_parse_follow_of_one_file_prints_each_iteration_as_it_comes(cli, tmp_path: Path):
    log = tmp_path / "growing.log"
    log.write_text((DATA / "synthetic_bridge.log").read_text())
    result = cli("logs", "parse", str(log), "--follow", "--idle-timeout", "0.3")
    assert result.exit_code == 0, result.stderr
    live = [line for line in result.stdout.splitlines() if line.startswith("growing.log  iteration")]
    assert len(live) == 3 and "iterations logged / counted / steady" in result.stdout


def test_missing_file_is_one_line_exit_2(cli):
    result = cli("logs", "parse", "/no/such.log")
    assert result.exit_code == 2 and "FILE" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_diagnose_json_schema_and_ranking(cli, tmp_path):
    # real/15's OOM lines under Megatron-LM's `training ...` (its own `Training ...` is Megatron-Bridge's, whose
    # fixes are recipe overrides without predicted memory)
    log = tmp_path / "training.log"
    log.write_text((DATA / "real/15_oom_nccl_cuda_failure_bridge_llama3_fp8.log").read_text()
                   .replace("\nTraining ...\n", "\ntraining ...\n"))
    result = cli("diagnose", str(log), "--json",
                 "--gpu", "h100", "--gpus", "8", "--flags",
                 "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 8192 "
                 "--global-batch-size 128 --micro-batch-size 2 --bf16 --swiglu")
    assert result.exit_code == 0
    (finding,) = result.json()["findings"]
    assert set(finding) >= {"category", "severity", "title", "evidence", "cause", "fixes"}
    assert finding["category"] == "oom" and finding["evidence"][0]["line"] == 10
    fix = finding["fixes"][0]
    assert set(fix) >= {"action", "flag", "value", "reason"} and fix["action"] in ("add", "set", "remove")
    assert fix["predicted_memory_gib"] is not None


def test_diagnose_human_output_and_bad_gpu(cli):
    result = cli("diagnose", str(DATA / "real/30_nccl_bus_error_shm_ncclgroupend.log"))
    assert result.exit_code == 0 and "shm_insufficient" in result.stdout and "--shm-size" in result.stdout
    bad = cli("diagnose", str(DATA / "real/30_nccl_bus_error_shm_ncclgroupend.log"), "--gpu", "h9000")
    assert bad.exit_code == 2 and "Traceback" not in bad.stderr


def test_a_clean_log_hides_the_notes_about_fixes_by_their_kind_whatever_their_wording(cli, tmp_path, monkeypatch):
    import megapilot.diagnose
    from megapilot.diagnose.engine import Note, NoteKind

    log = tmp_path / "train.log"
    log.write_text(" [2026-01-01 00:00:01] iteration        1/     100 | elapsed time per iteration (ms): 1000.0 | "
                   "lm loss: 5.0E+00 | number of skipped iterations:   0 | number of nan iterations:   0 |\n")
    real = megapilot.diagnose.diagnose

    def worded_anew(*args, **kwargs):  # notes about fixes need no set wording to be left out
        result = real(*args, **kwargs)
        result.notes = [Note(NoteKind.FIXES, "the proposals are written for release X"),
                        Note(NoteKind.ASSUMPTION, "vocab size assumed"), Note(NoteKind.VERDICT, "all good")]
        return result

    monkeypatch.setattr(megapilot.diagnose, "diagnose", worded_anew)
    result = cli("diagnose", str(log))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["No problem found in the log.", "note: vocab size assumed"]
    assert cli("diagnose", str(log), "--json").json()["notes"] == [
        "the proposals are written for release X", "vocab size assumed", "all good"]


def test_optimize_json_and_user_errors(cli):
    flags = ("--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --seq-length 4096 "
             "--global-batch-size 64 --micro-batch-size 1 --tensor-model-parallel-size 2 --bf16")
    result = cli("optimize", "--flags", flags, "--gpu", "h100", "--gpus", "8", "--json")
    assert result.exit_code == 0
    data = result.json()
    assert set(data) >= {"current", "best", "changes", "calibration_scale"}
    assert any(c["label"] == "FP8 GEMMs" for c in data["changes"])
    assert cli("optimize", "--flags", flags).exit_code == 2
    assert cli("optimize", "--gpu", "h100").exit_code == 2
    no_steps = cli("optimize", "--flags", flags, "--gpu", "h100", "--log",
                   str(DATA / "real/30_nccl_bus_error_shm_ncclgroupend.log"))
    assert no_steps.exit_code == 2 and "--log" in no_steps.stderr


def test_optimize_from_script_calibrated_by_the_logged_step_time(cli, tmp_path: Path):
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/bash\nTP=2\n"
        "torchrun --nproc_per_node 8 pretrain_gpt.py \\\n"
        "  --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \\\n"
        "  --group-query-attention --num-query-groups 8 --seq-length 4096 --global-batch-size 128 \\\n"
        "  --micro-batch-size 1 --tensor-model-parallel-size $TP --sequence-parallel --bf16 --swiglu \\\n"
        "  --use-distributed-optimizer --vocab-size 128256\n")
    result = cli("optimize", "--script", str(script), "--gpu", "h100", "--json",
                 "--log", str(DATA / "synthetic_megatron_core016_full.log"))
    assert result.exit_code == 0, result.stderr
    data = result.json()
    assert data["current"]["measured_step_time_s"] == pytest.approx(9.07, abs=0.01)  # p50 of the steady steps
    assert data["calibration_scale"] is not None and data["calibration_scale"] > 0
    gains = [c["gain_pct"] for c in data["changes"] if c["gain_pct"] is not None and c["fits"]]
    assert gains == sorted(gains, reverse=True)


def test_optimize_reads_the_run_from_a_logs_arguments_block_when_given_no_script(cli, monkeypatch):
    """Megatron prints every argument at start-up: a log that holds that block describes its run, so `optimize --log`
    alone prices it (from a file or standard input), says where its flags came from, and is calibrated by the same
    log's steps; a log without the block is refused naming both ways to give the run."""
    log = DATA / "synthetic_megatron_arguments.log"
    result = cli("optimize", "--log", str(log), "--gpu", "h100", "--json")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    assert data["current"]["layout"].startswith("TP2 PP2 ")  # the block's tensor/pipeline sizes, not defaults
    assert data["calibration_scale"] is not None
    assert f"the run's flags are the log's own arguments block ({log}:27)" in data["notes"]  # named as a script is
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(log.read_bytes())))
    piped = cli("optimize", "--log", "-", "--gpu", "h100", "--json")
    assert piped.exit_code == 0, piped.stderr
    assert (piped.json()["current"], piped.json()["calibration_scale"]) == (data["current"], data["calibration_scale"])
    no_gpu = cli("optimize", "--log", str(log))
    assert no_gpu.exit_code == 2 and "the log does not name it" in no_gpu.stderr
    no_block = cli("optimize", "--log", str(DATA / "real/04_low_throughput_mixtral_h100_130tflops.log"))
    assert no_block.exit_code == 2 and "a --log that printed Megatron's arguments block" in no_block.stderr


def test_optimize_takes_the_gpu_from_a_rendered_script_header(cli):
    script = Path(__file__).parents[1] / "launch/golden/llama3.1-8b_1node.torchrun.sh"
    result = cli("optimize", "--script", str(script), "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["current"]["predicted_tokens_per_s_per_gpu"] > 0


def test_optimize_without_any_gpu_names_the_flag(cli):
    result = cli("optimize", "--flags", "--num-layers 4 --hidden-size 128 --num-attention-heads 4 "
                 "--seq-length 128 --global-batch-size 8 --micro-batch-size 1")
    assert result.exit_code == 2 and "--gpu" in result.stderr and "Traceback" not in result.stderr


def test_summary_only_table_does_not_claim_zero_memory_reports(cli):
    log = str(DATA / "real/08_iteration_mcore2025_memory_report_pai.log")
    full = " ".join(cli("logs", "parse", log).stdout.split())
    assert "not kept" not in full
    summary = " ".join(cli("logs", "parse", log, "--summary-only").stdout.split())
    assert "memory reports / checkpoints / errors │ not kept /" in summary


ARGUMENTS_LOG = str(DATA / "synthetic_megatron_arguments.log")  # SYNTHETIC: arguments block, no tokens/s printed


def _expected_tokens_per_s_per_gpu(seq_length: int) -> list[float]:
    gbs, world = 128, 8  # the fixture's arguments block
    return [gbs * seq_length / (ms / 1000.0 * world) for ms in (9070.1, 9070.1, 9100.4)]


def test_logs_parse_takes_the_run_shape_from_the_arguments_block(cli):
    data = cli("logs", "parse", ARGUMENTS_LOG, "--json").json()
    assert data["arguments"]["world_size"] == 8 and data["arguments"]["seq_length"] == 4096
    rates = [it["tokens_per_s_per_gpu"] for it in data["iterations"]]
    assert rates == pytest.approx(_expected_tokens_per_s_per_gpu(4096))
    assert {it["tokens_source"] for it in data["iterations"]} == {"computed"}
    # the first logged iteration is warm-up; the mean is the run's tokens over its time: GBS x seq / (mean step x world)
    assert data["summary"]["tokens_per_s_per_gpu_mean"] == pytest.approx(128 * 4096 / ((9070.1 + 9100.4) / 2000 * 8))
    human = cli("logs", "parse", ARGUMENTS_LOG)
    assert human.exit_code == 0 and "pass --seq-length" not in human.stdout


def test_logs_parse_explicit_seq_length_wins_over_the_arguments_block(cli):
    data = cli("logs", "parse", ARGUMENTS_LOG, "--seq-length", "2048", "--json").json()
    rates = [it["tokens_per_s_per_gpu"] for it in data["iterations"]]
    assert rates == pytest.approx(_expected_tokens_per_s_per_gpu(2048))


def test_logs_parse_reports_the_megatron_release_it_recognises(cli, tmp_path: Path) -> None:
    from tests.diagnose.test_megatron_version import _ITERATION, _arguments_block

    log = tmp_path / "train.log"
    log.write_text(_arguments_block("core_v0.14.0") + f" [2026-01-01 00:10:00] {_ITERATION}\n")
    parsed = cli("logs", "parse", str(log), "--json")
    assert parsed.exit_code == 0, parsed.stderr
    assert parsed.json()["megatron_version"]["release"] == "core_v0.14.0"
    shown = cli("logs", "parse", str(log))
    assert "Megatron-LM core_v0.14.0:" in shown.stdout and "arguments block" in shown.stdout


def test_logs_parse_follows_the_files_of_a_run_as_a_real_process_writes_them(cli, tmp_path: Path):
    from tests.logs.test_follow import WRITER

    paths = [tmp_path / "out-node0" / "training.log", tmp_path / "out-node1" / "training.log"]
    for path in paths:
        path.parent.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)\n" + WRITER, *map(str, paths)])
    try:  # the files do not exist yet when following starts: they are waited for
        result = cli("logs", "parse", *map(str, paths), "--follow", "--idle-timeout", "1.5")
    finally:
        writer.wait(timeout=60)
    assert result.exit_code == 0, result.stderr
    for node, step in ((0, "100.0"), (1, "101.0")):
        for iteration in range(1, 6):
            assert f"out-node{node}/training.log  iteration {iteration}/10 | step {step} ms" in result.stdout
    assert "iterations logged / counted / steady" in result.stdout and "10 / " in result.stdout


def test_logs_parse_follow_of_a_glob_sends_the_live_lines_to_stderr_under_json(cli, tmp_path: Path):
    for node in range(2):
        (tmp_path / f"node{node}.log").write_text((DATA / "synthetic_bridge.log").read_text())
    result = cli("logs", "parse", str(tmp_path / "node*.log"), "--follow", "--idle-timeout", "0.3", "--json")
    assert result.exit_code == 0
    assert [Path(name).name for name in result.json()["files"]] == ["node0.log", "node1.log"]
    assert "node0.log  iteration" in result.stderr and "node1.log  iteration" in result.stderr


def test_logs_parse_cannot_follow_stdin(cli):
    result = cli("logs", "parse", "-", "--follow", "--timeout", "0.1")
    assert result.exit_code == 2 and "standard input cannot be followed" in result.stderr


def test_evidence_is_printed_as_the_log_wrote_it_no_emoji_codes(cli, tmp_path):
    # NCCL prefixes its lines `host:pid:tid`; rich would read `:1234:` as an emoji code
    log = tmp_path / "nccl.err"
    log.write_text("node-3:1234:5678 [2] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.1.2.3<43219> "
                   "failed : Software caused connection abort\n")
    result = cli("diagnose", str(log))
    assert result.exit_code == 0
    assert "node-3:1234:5678 [2]" in result.stdout


@pytest.mark.parametrize("tokenizer", ["meta-llama/Llama-3.1-70B", "/models/tokenizer"])
def test_optimize_on_megapilots_own_script_predicts_what_the_plan_did(cli, tmp_path: Path, tokenizer: str):
    """plan -> script -> optimize: the script's HuggingFaceTokenizer states no --vocab-size; the vocabulary comes
    from the model the tokenizer (a hub id) or the header names, so the prediction is the plan's and its top pick
    is not beaten by itself read with another vocabulary."""
    plan_file, script = tmp_path / "plan.json", tmp_path / "train.sh"
    planned = cli("plan", "--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "64", "--seq-len", "8192",
                  "--gbs", "1024", "--save", str(plan_file))
    assert planned.exit_code == 0, planned.stderr
    written = cli("script", "--plan", str(plan_file), "-o", str(script), "--megatron-path", "/opt/Megatron-LM",
                  "--data-path", "/data/corpus_text_document", "--tokenizer-model", tokenizer)
    assert written.exit_code == 0, written.stderr
    assert "--tokenizer-type HuggingFaceTokenizer" in script.read_text() and "--vocab-size" not in script.read_text()
    result = cli("optimize", "--script", str(script), "--json")
    assert result.exit_code == 0, result.stderr
    data, estimate = result.json(), json.loads(plan_file.read_text())["estimate"]
    assert data["current"]["predicted_tokens_per_s_per_gpu"] == pytest.approx(estimate["tokens_per_s_per_gpu"],
                                                                              abs=0.01)
    assert data["current"]["predicted_memory_gib"] == pytest.approx(estimate["memory_gib"]["total"], abs=0.01)
    assert data["best"]["layout"] == data["current"]["layout"]
    assert not any(change["source"] == "planner" for change in data["changes"])
    assert not any("assumed 32000" in note for note in data["notes"])


def test_a_command_fix_prints_as_a_command_to_run_not_a_flag_to_add(cli):
    result = cli("diagnose", str(DATA / "real/20_hang_fused_kernel_compile_stuck.log"))
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "run: rm -rf megatron/fused_kernels/build" in text and "add rm -rf" not in text


def test_advice_prints_as_advice_not_a_flag_to_add(cli):
    result = cli("diagnose", str(DATA / "real/04_low_throughput_mixtral_h100_130tflops.log"), "--gpu", "h100")
    text = " ".join(result.stdout.split())
    assert "profile one step" in text and "add profile one step" not in text


def test_a_file_that_is_no_training_log_is_one_error_line_naming_file_with_a_fix(cli, tmp_path: Path):
    services = tmp_path / "services"
    services.write_text("ftp             21/tcp\nssh             22/tcp\nsmtp            25/tcp      mail\n")
    result = cli("diagnose", str(services))
    assert result.exit_code == 1  # read fine, nothing to diagnose (tests/logs/test_binary.py)
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: FILE: services: this is not a training log") and " — fix: " in line


def test_a_launch_script_given_as_the_log_is_named_one_with_where_it_goes(cli, tmp_path: Path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ntorchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                      "--tensor-model-parallel-size 2\n")
    result = cli("diagnose", str(script))
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert "is a launch script, not a training log" in line and f"--script {script}" in line
    echoed = tmp_path / "job.out"  # a log that echoed its command line and printed nothing else is still a log
    echoed.write_text(script.read_text().split("\n", 1)[1])
    assert "this is not a training log" in cli("diagnose", str(echoed)).stderr


@pytest.mark.parametrize(("extra", "field"), [(("--summary-only", "--csv"), "--csv"), (("--timeout", "5"), "--timeout"),
                                              (("--idle-timeout", "5"), "--idle-timeout")])
def test_options_that_would_do_nothing_are_refused_by_name(cli, extra, field):
    result = cli("logs", "parse", str(DATA / "synthetic_bridge.log"), *extra)
    assert result.exit_code == 2 and f"error: {field}:" in result.stderr and "fix:" in result.stderr


def test_logs_parse_names_the_framework_where_the_dialect_does_not(cli):
    bridge = cli("logs", "parse", str(DATA / "real/15_oom_nccl_cuda_failure_bridge_llama3_fp8.log"))
    assert bridge.exit_code == 0 and "dialect unknown, framework megatron-bridge, 20 lines" in " ".join(
        bridge.stdout.split())
    titan = cli("logs", "parse", str(DATA / "real/35_hip_oom_primus_torchtitan_mi350_step_then_crash.log"))
    assert "dialect primus-torchtitan, 15 lines" in " ".join(titan.stdout.split())  # the dialect says it


def test_logs_parse_asks_for_the_run_shape_only_where_steady_steps_lack_tokens(cli):
    # one torchtitan step that prints its own tps: no steady step to average, and the shape would add nothing
    one_step = cli("logs", "parse", str(DATA / "real/35_hip_oom_primus_torchtitan_mi350_step_then_crash.log"))
    assert one_step.exit_code == 0 and "pass --seq-length" not in one_step.stdout
    steady = cli("logs", "parse", str(DATA / "real/04_low_throughput_mixtral_h100_130tflops.log"))
    assert "pass --seq-length and --world-size" in " ".join(steady.stdout.split())


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak memory Linux reports")
def test_optimize_reads_a_long_log_in_flat_memory(tmp_path: Path):
    """A long run's log calibrates optimize as it feeds diagnose: its summary, arguments and a bounded share of its
    records, not a record per line (100k iteration lines held as records take three times the command's own
    memory)."""
    line = (" iteration {i:>8}/  200000 | consumed samples: {s:>12} | elapsed time per iteration (ms): 1000.0 | "
            "throughput per GPU (TFLOP/s/GPU): 400.0 | learning rate: 3.000000E-04 | global batch size:   128 | "
            "lm loss: 5.000000E+00 | loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | "
            "number of nan iterations:   0 |\n")
    log = tmp_path / "training.log"
    log.write_text("".join(line.format(i=i, s=i * 128) for i in range(1, 100_001)))
    flags = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
             "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 128 --bf16 --vocab-size 32000")
    # the command's own peak (VmHWM starts afresh at exec; getrusage's maxrss would carry this process's over)
    measured = ("import runpy, sys\n"
                "sys.argv = ['megapilot', *sys.argv[1:]]\n"
                "try:\n    runpy.run_module('megapilot', run_name='__main__')\n"
                "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
                "peak = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
                "print(peak.split()[1], file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", measured, "optimize", "--log", str(log), "--flags", flags,
                             "--gpu", "h100", "--gpus", "8", "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["current"]["measured_step_time_s"] == pytest.approx(1.0)
    peak_mib = int(result.stderr.strip().splitlines()[-1]) / 1024  # kB
    assert peak_mib < 120, peak_mib
