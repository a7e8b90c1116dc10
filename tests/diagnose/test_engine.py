"""The diagnosis engine: flags feed the parser, findings come ranked, notes say what was assumed."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose.engine import Note, NoteKind, diagnose, diagnose_log, parse_options_for
from megapilot.diagnose.flags import read_flags, run_config
from megapilot.errors import MegapilotError
from megapilot.logs import parse_text

FLAGS = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 2048 --global-batch-size 64 "
         "--micro-batch-size 1 --bf16 --vocab-size 32000")
# Megatron-LM iteration lines without a tokens/s field: the engine must compute it from the flags.
ITERATION = (" [2026-01-01 00:00:{s:02d}] iteration {it:8d}/     100 | consumed samples: {samples} | "
             "elapsed time per iteration (ms): 1000.0 | learning rate: 1.0E-04 | global batch size:    64 | "
             "lm loss: 5.0E+00 | loss scale: 1.0 | grad norm: 1.0 | number of skipped iterations:   0 | "
             "number of nan iterations:   0 |")
OOM = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
WATCHDOG = ("[rank0]:[E ProcessGroupNCCL.cpp:754] [Rank 0] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=9, OpType=ALLGATHER, NumelIn=1, NumelOut=8, Timeout(ms)=600000) ran for 600100 "
            "milliseconds before timing out.")


def _healthy_log(tmp_path: Path) -> Path:
    path = tmp_path / "train.log"
    path.write_text("\n".join(ITERATION.format(s=it, it=it, samples=64 * it) for it in range(1, 6)) + "\n")
    return path


def test_parse_options_carry_seq_gbs_and_world_from_the_flags():
    options = parse_options_for(run_config(read_flags(flags=FLAGS), gpus=8))
    assert (options.seq_length, options.global_batch_size, options.world_size) == (2048, 64, 8)


def test_parse_options_without_flags_or_model_shape_know_only_the_world():
    assert parse_options_for(None).world_size is None and parse_options_for(None).seq_length is None
    partial = parse_options_for(run_config(read_flags(flags="--micro-batch-size 2"), gpus=4))
    assert partial.world_size == 4 and partial.seq_length is None


def test_without_flags_the_fixes_are_said_to_be_generic_and_a_clean_log_says_so(tmp_path: Path):
    result = diagnose([_healthy_log(tmp_path)])
    assert result.findings == [] and result.config is None
    assert result.notes == [Note(NoteKind.FIXES, "no --script/--flags given: fixes are generic"),
                            Note(NoteKind.VERDICT, "no problem found in the log")]
    assert result.to_dict()["notes"] == ["no --script/--flags given: fixes are generic", "no problem found in the log"]


def test_each_note_has_its_kind_and_the_json_keeps_only_the_texts():
    oom = "megatron-core==0.14.0\n" + OOM + "\n"
    result = diagnose_log(parse_text(oom), run_config(read_flags(flags=FLAGS), gpus=8))
    kinds = {note.kind for note in result.notes}
    assert {NoteKind.ASSUMPTION, NoteKind.FIXES, NoteKind.LOG} <= kinds and NoteKind.VERDICT not in kinds
    [release] = [note for note in result.notes if "flag names of Megatron-LM core_v0.14.0" in note.text]
    assert release.kind is NoteKind.FIXES
    assert result.to_dict()["notes"] == [note.text for note in result.notes]


def test_flags_let_the_parser_compute_tokens_per_gpu(tmp_path: Path):
    result = diagnose([_healthy_log(tmp_path)], flags=FLAGS, gpu=get_gpu("h100"), gpus=8)
    # 64 samples x 2048 tokens / (1.0 s x 8 GPUs)
    assert result.log.iterations[-1].tokens_per_s_per_gpu == pytest.approx(16384.0)
    assert result.log.iterations[-1].tokens_source == "computed"
    assert result.config is not None and result.config.world_size == 8


def test_findings_come_ranked_root_cause_first():
    findings = diagnose_log(parse_text("\n".join([WATCHDOG, OOM])), None).findings
    assert [f.category for f in findings][:2] == ["oom", "nccl_timeout"]


def test_json_schema_is_stable(tmp_path: Path):
    data = diagnose([_healthy_log(tmp_path)]).to_dict()
    assert list(data) == ["findings", "dialect", "framework", "files", "story", "summary", "notes", "megatron_version"]
    assert data["dialect"] == "megatron-lm" and data["files"] == [str(tmp_path / "train.log")]
    assert data["summary"]["iterations_logged"] == 5 and data["summary"]["last_iteration"] == 5


def test_missing_log_file_is_a_user_error(tmp_path: Path):
    with pytest.raises(MegapilotError) as info:
        diagnose([tmp_path / "absent.log"])
    assert info.value.field == "FILE"


# SYNTHETIC: what a failed job leaves when no rank printed an iteration line (a rank's stderr, dmesg, SLURM).
STDERR_ONLY = """[rank2]: Traceback (most recent call last):
[rank2]:   File "/opt/megatron/training/training.py", line 1210, in train_step
[rank2]:     loss = forward_backward_func(...)
[rank2]: KeyError: 'tokens'
"""
DMESG = "[Tue Dec  1 08:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n"
SLURM_ERR = "srun: error: gpu-03: task 2: Exited with exit code 1\n"


def test_any_text_is_diagnosed_with_a_note_that_training_never_progressed(tmp_path: Path):
    (tmp_path / "rank2.err").write_text(STDERR_ONLY)
    result = diagnose([tmp_path / "rank2.err"])
    (finding,) = result.findings
    assert finding.category == "process_crash" and finding.title.startswith("First failure: rank 2 crashed: KeyError")
    said = Note(NoteKind.LOG, "no training progress found (no iteration line): only error lines were read")
    assert said in result.notes


def test_a_job_directory_of_stderr_dmesg_and_slurm_files_is_one_diagnosis(cli, tmp_path: Path):
    (tmp_path / "rank2.err").write_text(STDERR_ONLY)
    (tmp_path / "dmesg.txt").write_text(DMESG)
    (tmp_path / "slurm-4242.out").write_text(SLURM_ERR)
    result = cli("diagnose", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    payload = result.json()
    assert [Path(name).name for name in payload["files"]] == ["dmesg.txt", "rank2.err", "slurm-4242.out"]
    assert payload["findings"][0]["category"] == "gpu_hw_fault"  # the fault explains the crash, not the reverse
    assert payload["story"][0].startswith("first failure: GPU fault: ") and "dmesg.txt:1" in payload["story"][0]
    text = cli("diagnose", str(tmp_path))
    assert text.exit_code == 0 and "what happened (root cause first):" in text.stdout
    assert "rank2.err:4" in text.stdout


def test_logs_parse_of_a_traceback_alone_lists_its_error_and_exits_0(cli, tmp_path: Path):
    (tmp_path / "rank2.err").write_text(STDERR_ONLY)
    result = cli("logs", "parse", str(tmp_path / "rank2.err"), "--json")
    assert result.exit_code == 0
    assert [e["signature"] for e in result.json()["errors"]] == ["exception:KeyError"]


def test_logs_parse_of_a_run_directory_names_each_node_file_and_keeps_rank_prefixes(cli):
    run = Path(__file__).resolve().parents[1] / "data" / "logs" / "synthetic_crash_during_save"
    result = cli("logs", "parse", str(run))
    assert result.exit_code == 0
    assert "out-node0/training.log:5" in result.stdout and "out-node1/training.log:7" in result.stdout
    assert "[rank0]" in result.stdout  # log text is never read as console markup (rich would swallow the tag)


def test_flags_of_another_run_diagnose_a_log_on_stdin_as_the_same_log_in_a_file(monkeypatch: pytest.MonkeyPatch):
    """Flags that do not match the log make the engine read the log again (sized by its own arguments): standard
    input is read once and its copy read the second time, not found used up."""
    import io
    import sys

    log = Path(__file__).parents[1] / "data" / "logs" / "synthetic_megatron_arguments.log"
    flags = FLAGS.replace("--num-layers 4", "--num-layers 24")
    from_file = diagnose([log], flags=flags)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(log.read_bytes())))
    from_stdin = diagnose(["-"], flags=flags)
    assert [f.category for f in from_stdin.findings] == [f.category for f in from_file.findings]
    assert from_stdin.findings[0].category == "log_mismatch"
    assert from_stdin.log.summary is not None and from_file.log.summary is not None
    assert from_stdin.log.summary.to_dict() == from_file.log.summary.to_dict()
    assert from_stdin.log.summary.iterations_logged == 3
