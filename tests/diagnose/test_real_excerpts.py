"""Each failure class of log intelligence II on REAL text users pasted into public threads (tests/data/logs/real,
INDEX.md there names the source of each file): the library and `megapilot diagnose` name the cause, quote the line
that shows it, exit 0, and offer fixes that fit the framework that wrote the log."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from megapilot.diagnose import diagnose
from megapilot.diagnose.engine import NoteKind, diagnose_log
from megapilot.logs import parse_text

REAL = Path(__file__).resolve().parents[1] / "data" / "logs" / "real"


@dataclass(frozen=True)
class Case:
    """A real excerpt, the category its first finding must have, and a piece of the evidence line it must quote."""

    file: str
    category: str
    evidence: str
    framework: str = "unknown"


CASES = [
    # (1) files without any iteration line
    # only its `Training ...` line says Megatron-Bridge (Megatron-LM prints `training ...`)
    Case("15_oom_nccl_cuda_failure_bridge_llama3_fp8.log", "oom", "NCCL WARN Cuda failure 2 'out of memory'",
         framework="megatron-bridge"),
    Case("40_rerun_state_machine_nan_grad_norm_ci.log", "nan_loss", "found NaN in local grad norm for bucket #0"),
    Case("41_nvrm_xid_dmesg_pt_main_thread.log", "gpu_hw_fault", "NVRM: Xid (PCI:0000:00:05): 43"),
    Case("42_nvrm_fallen_off_the_bus_without_xid.log", "gpu_hw_fault", "NVRM: fallen off the bus"),
    Case("43_amdgpu_ras_hardware_error_mi300x.log", "gpu_hw_fault", "uncorrectable hardware error"),
    Case("44_torchrun_child_failed_error_summary.log", "process_crash", "exitcode  : 1 (pid: 78970)"),
    # (2) checkpoint saves whose error line does not say "checkpoint"
    Case("45_ckpt_stream_writer_failed_deepspeed_save.log", "checkpoint_save_failure",
         "PytorchStreamWriter failed writing file data/5", framework="deepspeed"),
    Case("46_ckpt_async_write_item_signature_rocm_megatron.log", "checkpoint_save_failure",
         "_write_item() missing 1 required positional argument"),
    Case("47_ckpt_segfault_crc32_writerecord_bridge_gb200.log", "checkpoint_save_failure", "crc32_16bytes"),
    Case("48_ckpt_crash_right_after_async_save_nemo.log", "checkpoint_save_failure", "mz_zip_writer_add_mem_ex_v2",
         framework="nemo"),  # only its logger prefix, `[NeMo I ...]`, says NeMo
    # (3) a progressive slowdown in the Megatron-LLM dialect, (4) a GPT-NeoX loss jump after the first update
    Case("50_megatron_llm_progressive_slowdown.log", "slowdown", "elapsed time per iteration (ms): 150526.9",
         framework="megatron-lm"),
    Case("51_gpt_neox_loss_jump_after_first_update_bf16.log", "loss_spike", "steps: 2 loss: 11.4175",
         framework="gpt-neox"),
    # a SLURM time limit reached after training had finished: a hang at exit
    Case("52_slurm_time_limit_after_training_done_bridge_qwen3.log", "process_crash",
         "CANCELLED AT 2025-12-03T14:53:02 DUE TO TIME LIMIT"),
    # (6) a torchtitan HIP OOM (Primus's torchtitan backend on MI350)
    Case("49_hip_oom_primus_torchtitan_root_cause.log", "oom", "HIP out of memory. Tried to allocate 11.74 GiB",
         framework="torchtitan"),
]


@pytest.mark.parametrize("case", CASES, ids=[case.file.split("_", 1)[0] for case in CASES])
def test_library_names_the_cause_and_quotes_the_line(case: Case):
    result = diagnose([REAL / case.file])
    first = result.findings[0]
    assert first.category == case.category, [f.title for f in result.findings]
    assert any(case.evidence in e.text for e in first.evidence), [e.text for e in first.evidence]
    assert result.log.framework == case.framework


@pytest.mark.parametrize("case", CASES, ids=[case.file.split("_", 1)[0] for case in CASES])
def test_cli_names_the_cause_and_exits_0(cli, case: Case):
    result = cli("diagnose", str(REAL / case.file), "--json")
    assert result.exit_code == 0, result.stderr
    first = result.json()["findings"][0]
    assert first["category"] == case.category
    assert any(case.evidence in e["text"] for e in first["evidence"])
    text = cli("diagnose", str(REAL / case.file))
    assert text.exit_code == 0 and "No problem found" not in text.stdout


def test_the_installed_command_reads_a_job_directory_of_real_failure_text(tmp_path: Path):
    """A real subprocess over a directory holding dmesg and a crashed save: the GPU fault explains the rest."""
    (tmp_path / "dmesg.txt").write_text((REAL / "41_nvrm_xid_dmesg_pt_main_thread.log").read_text())
    (tmp_path / "rank93.err").write_text((REAL / "47_ckpt_segfault_crc32_writerecord_bridge_gb200.log").read_text())
    done = subprocess.run([sys.executable, "-m", "megapilot", "diagnose", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "what happened (root cause first):" in done.stdout and "dmesg.txt:4" in done.stdout
    assert "rank93.err:2" in done.stdout and "Traceback" not in done.stderr


# ---- what each class's finding says and offers ---------------------------------------------------------

def test_rerun_state_machine_report_names_rank_and_iteration_and_a_gpu_check():
    (finding,) = diagnose([REAL / "40_rerun_state_machine_nan_grad_norm_ci.log"]).findings
    assert "on rank 3 at iteration 3" in finding.title
    assert any(fix.kind == "command" and "nvidia-smi" in fix.flag for fix in finding.fixes)


def test_a_gpu_that_fell_off_the_bus_without_an_xid_is_a_hardware_fault_with_node_fixes():
    (finding,) = diagnose([REAL / "42_nvrm_fallen_off_the_bus_without_xid.log"]).findings
    assert finding.evidence[0].line == 3
    assert any("drain the node" in fix.flag for fix in finding.fixes)


def test_torchrun_summary_alone_names_the_root_cause_rank_and_says_its_cause_left_no_line():
    result = diagnose([REAL / "44_torchrun_child_failed_error_summary.log"])
    assert "rank 0" in result.findings[0].title
    # the launcher only reports the exit: the rank's own stderr (not in this file) holds the cause
    assert result.story[0].startswith("earliest error (itself a consequence: its cause left no line): rank 0 "
                                      "exited with code 1, as the launcher reported")
    (finding,) = result.findings
    assert "exited with code 1: the rank ended itself" in finding.cause and "n136-117-136.byted.org" in finding.cause
    assert [f.flag for f in finding.fixes] == ["grep -n -A30 Traceback <the stderr or log of rank 0 on "
                                               "n136-117-136.byted.org>"]


def test_zip_writer_failure_in_a_deepspeed_save_is_a_failed_save_not_a_crash():
    result = diagnose([REAL / "45_ckpt_stream_writer_failed_deepspeed_save.log"])
    (finding,) = result.findings
    assert finding.severity == "critical" and "zip writer" in finding.cause
    assert any(fix.flag.startswith("df -h") for fix in finding.fixes)
    # the writer's own words, quoted whole, not another failure's message it did not print
    assert "(it says 'failed writing file data/5: file write failed')" in finding.cause
    assert "unexpected pos" not in finding.cause and "enforce fail" not in finding.cause
    [framework] = [note.text for note in result.notes if note.kind is NoteKind.FRAMEWORK]
    assert framework.startswith("this log is DeepSpeed's, not Megatron-LM's (its traceback runs in DeepSpeed's code)")


def test_async_writer_signature_error_points_at_the_torch_and_megatron_versions():
    (finding,) = diagnose([REAL / "46_ckpt_async_write_item_signature_rocm_megatron.log"]).findings
    assert "ranks 4, 5" in finding.title
    assert finding.fixes[0].flag.startswith("pip list") and "version mismatch" in finding.cause


@pytest.mark.parametrize("name", ["47_ckpt_segfault_crc32_writerecord_bridge_gb200.log",
                                  "48_ckpt_crash_right_after_async_save_nemo.log"])
def test_a_segfault_inside_the_checkpoint_writer_is_the_failed_save_and_the_crash_follows(name: str):
    result = diagnose([REAL / name])
    assert [f.category for f in result.findings] == ["checkpoint_save_failure", "process_crash"]
    assert result.story[1].startswith("then: died of SIGSEGV")


def test_megatron_llm_slowdown_from_17_to_150_seconds_is_a_trend_with_megatron_flags():
    (finding,) = diagnose([REAL / "50_megatron_llm_progressive_slowdown.log"]).findings
    assert finding.title.startswith("Step time rose") and "Theil-Sen" in finding.cause
    # the trend's fitted ends are said to be fitted; the times quoted as logged are the log's own
    assert "15,290 → 152,427 ms on the fitted trend" in finding.title
    assert finding.title.endswith("logged 20191.9 ms at iteration 4, 150526.9 ms at 224")
    assert [f.flag for f in finding.fixes][:2] == ["--manual-gc", "--log-straggler"]


def test_gpt_neox_jump_after_the_first_update_gets_neox_config_settings():
    (finding,) = diagnose([REAL / "51_gpt_neox_loss_jump_after_first_update_bf16.log"]).findings
    assert "1.930 at iteration 1 → 11.418 at iteration 2" in finding.title and finding.severity == "critical"
    assert {f.kind for f in finding.fixes} == {"config"} and "gradient_clipping" in {f.flag for f in finding.fixes}


def test_a_deepspeed_record_is_said_to_be_deepspeeds_first_with_what_megapilot_reads_of_it(cli):
    result = cli("diagnose", str(REAL / "51_gpt_neox_loss_jump_after_first_update_bf16.log"))
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert text.startswith(
        "note: this log is GPT-NeoX's on DeepSpeed, not Megatron-LM's (its `steps: N loss: ...` lines are "
        "DeepSpeed's, its `iteration N/ M | ... | lm_loss: ...` lines are GPT-NeoX's): megapilot reads each step's "
        "loss and time and the error lines; it cannot read the run's config (GPT-NeoX's YAML config; --script/--flags "
        "are for Megatron-LM launches), so no memory or throughput is predicted, and the fixes are settings of that "
        "config 1. CRITICAL loss_spike")
    assert "fixes are generic" not in text  # they are GPT-NeoX's own settings
    assert text.count("this log is GPT-NeoX's") == 1


@pytest.mark.parametrize(("name", "first"), [
    ("49_hip_oom_primus_torchtitan_root_cause.log",
     "note: this log is torchtitan's, not Megatron-LM's (its traceback runs in torchtitan's code): megapilot reads its "
     "error lines and tracebacks; it cannot read the run's config (torchtitan's TOML job config, or its --section.key "
     "overrides; --script/--flags are for Megatron-LM launches), so no memory or throughput is predicted, and the "
     "fixes are settings of that config what happened"),
    ("35_hip_oom_primus_torchtitan_mi350_step_then_crash.log",
     "note: this log is torchtitan's, not Megatron-LM's (its `step: N loss: ...` lines are torchtitan's): megapilot "
     "reads each step's loss, memory, tokens/s and MFU and the error lines; it cannot read the run's config "
     "(torchtitan's TOML job config, or its --section.key overrides; --script/--flags are for Megatron-LM launches), "
     "so no memory or throughput is predicted, and the fixes are settings of that config 1. WARNING oom"),
    ("48_ckpt_crash_right_after_async_save_nemo.log",
     "note: this log is NeMo's, not Megatron-LM's (its `[NeMo I ...]` logger lines or its traceback frames are "
     "NeMo's): megapilot reads its error lines and tracebacks; it cannot read the run's config (NeMo's recipe or YAML "
     "config, or their `model.x=y` overrides; --script/--flags are for Megatron-LM launches), so no memory or "
     "throughput is predicted, and the fixes are settings of that config what happened"),
])
def test_a_torchtitan_or_nemo_log_is_said_to_be_its_frameworks_first_not_to_have_generic_fixes(cli, name, first):
    result = cli("diagnose", str(REAL / name))
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert text.startswith(first)
    assert "fixes are generic" not in text  # they are the framework's own settings
    assert any(fix.kind == "config" for finding in diagnose([REAL / name]).findings for fix in finding.fixes)


@pytest.mark.parametrize("gpu", ["h100", None])
def test_mixtral_at_129_tflops_is_low_throughput_with_and_without_the_gpu(cli, gpu: str | None):
    args = ["diagnose", str(REAL / "04_low_throughput_mixtral_h100_130tflops.log"), "--json"]
    result = cli(*args, *(["--gpu", gpu] if gpu else []))
    assert result.exit_code == 0
    (finding,) = [f for f in result.json()["findings"] if f["category"] == "low_throughput"]
    assert "13.0%" in finding["title"] and "H100" in finding["title"].upper()
    assert finding["severity"] == ("warning" if gpu else "info")
    assert finding["evidence"][-1]["text"].startswith("[2024-03-30 20:03:00] iteration       12/")


def test_torchtitan_hip_oom_of_the_primus_thread_gets_torchtitan_and_rocm_advice():
    result = diagnose([REAL / "35_hip_oom_primus_torchtitan_mi350_step_then_crash.log",
                       REAL / "49_hip_oom_primus_torchtitan_root_cause.log"])
    oom = next(f for f in result.findings if f.category == "oom")
    flags = [f.flag for f in oom.fixes]
    assert result.log.framework == "torchtitan" and "11.74 GiB" in oom.title
    assert "--activation_checkpoint.mode" in flags and "PYTORCH_HIP_ALLOC_CONF" in flags
    assert not any(flag.startswith("--recompute") or flag == "PYTORCH_CUDA_ALLOC_CONF" for flag in flags)


def test_xid_codes_are_named_and_an_application_only_fault_says_so():
    (finding,) = diagnose([REAL / "41_nvrm_xid_dmesg_pt_main_thread.log"]).findings
    assert "Xid 43 (GPU stopped processing), Xid 31 (GPU memory page fault), Xid 94 (contained ECC error)" in \
        finding.cause
    assert "usually come from the application" not in finding.cause  # Xid 94 is the hardware's
    lines = (REAL / "41_nvrm_xid_dmesg_pt_main_thread.log").read_text().splitlines()
    (only_43,) = diagnose_log(parse_text(lines[3] + "\n"), None).findings
    assert "usually come from the application" in only_43.cause


def test_a_time_limit_reached_after_training_finished_is_a_hang_at_exit_not_a_short_limit():
    (finding,) = diagnose([REAL / "52_slurm_time_limit_after_training_done_bridge_qwen3.log"]).findings
    assert finding.title == "Job hung after training finished until the SLURM time limit"
    assert "8 min later" in finding.cause and "A longer time limit only waits longer" in finding.cause
    assert "[after training is done]" in finding.evidence[0].text
    assert not any(fix.flag == "#SBATCH --time" for fix in finding.fixes)
    # the same cancellation with no finished training before it is a run that needed more time
    lines = (REAL / "52_slurm_time_limit_after_training_done_bridge_qwen3.log").read_text().splitlines()
    (short,) = diagnose_log(parse_text("\n".join(lines[3:]) + "\n"), None).findings
    assert short.title == "SLURM cancelled the job (time limit)"
    assert any(fix.flag == "#SBATCH --time" for fix in short.fixes)


def test_the_bridge_oom_gets_recipe_overrides_and_says_its_training_line_told_bridge():
    result = diagnose([REAL / "15_oom_nccl_cuda_failure_bridge_llama3_fp8.log"])
    (oom,) = result.findings
    flags = [fix.flag for fix in oom.fixes]
    assert "model.recompute_granularity" in flags and not any(flag.startswith("--") for flag in flags)
    (note,) = [note.text for note in result.notes if note.kind is NoteKind.FRAMEWORK]
    assert "its `Training ...` line is Megatron-Bridge's; Megatron-LM prints `training ...`" in note
