"""A log of another run than the script: one finding per differing field, with the line that shows it."""

from __future__ import annotations

import gzip
import io
import sys
from pathlib import Path

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose import diagnose, read_flags, run_config
from megapilot.diagnose.mismatch import log_mismatches, mismatch_finding
from megapilot.diagnose.optimize import optimize
from megapilot.logs import parse_logs

FLAGS = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
         "--ffn-hidden-size 14336 --swiglu --seq-length 4096 --global-batch-size 128 --micro-batch-size 1 "
         "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --use-distributed-optimizer --bf16 "
         "--vocab-size 128256 --nproc-per-node 8")
# What Megatron-LM prints for the run FLAGS describes (world 8 = TP 2 x PP 2 x DP 2).
MATCHING_ARGUMENTS = {
    "context_parallel_size": "1", "data_parallel_size": "2", "expert_model_parallel_size": "1",
    "global_batch_size": "128", "hidden_size": "4096", "micro_batch_size": "1", "num_layers": "32",
    "pipeline_model_parallel_size": "2", "seq_length": "4096", "tensor_model_parallel_size": "2",
    "virtual_pipeline_model_parallel_size": "None", "world_size": "8",
}
ITERATION = ("[rank7]:  [2026-01-01 00:{minute:02d}:00.123456] iteration {it:>8}/      50 | consumed samples: "
             "{samples:>12} | elapsed time per iteration (ms): 9070.1 | learning rate: 1.500000E-04 | "
             "global batch size: {gbs:>5} | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 2.345 | "
             "number of skipped iterations:   0 | number of nan iterations:   0 |")


def _log_text(arguments: dict[str, str] | None, gbs: int = 128) -> str:
    lines = ["using world size: 8, data-parallel size: 2, context-parallel size: 1"]
    if arguments is not None:
        lines.append("[rank0]: ------------------------ arguments ------------------------")
        lines += [f"[rank0]:   {name} {'.' * (48 - len(name))} {value}" for name, value in sorted(arguments.items())]
        lines.append("[rank0]: -------------------- end of arguments ---------------------")
    lines += [ITERATION.format(minute=it, it=it, samples=it * gbs, gbs=gbs) for it in range(1, 9)]
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.log"
    path.write_text(text)
    return path


def _config(flags: str = FLAGS, gpu: str | None = "h100"):
    return run_config(read_flags(flags=flags), gpu=get_gpu(gpu) if gpu else None)


def test_the_log_of_the_run_the_script_describes_matches(tmp_path: Path) -> None:
    log = parse_logs([_write(tmp_path, _log_text(MATCHING_ARGUMENTS))])
    assert log.arguments is not None
    assert log_mismatches(log, _config()) == [] and mismatch_finding([]) is None


@pytest.mark.parametrize(("argument", "logged", "field", "script_value"), [
    ("world_size", "16", "world size", 8),
    ("tensor_model_parallel_size", "4", "TP", 2),
    ("pipeline_model_parallel_size", "1", "PP", 2),
    ("virtual_pipeline_model_parallel_size", "4", "VPP", 1),
    ("context_parallel_size", "2", "CP", 1),
    ("expert_model_parallel_size", "8", "EP", 1),
    ("global_batch_size", "256", "global batch size", 128),
    ("micro_batch_size", "2", "micro-batch size", 1),
    ("seq_length", "8192", "sequence length", 4096),
    ("num_layers", "80", "layers", 32),
    ("hidden_size", "8192", "hidden size", 4096),
])
def test_each_differing_field_is_named_with_its_own_log_line(tmp_path: Path, argument: str, logged: str, field: str,
                                                            script_value: int) -> None:
    path = _write(tmp_path, _log_text(MATCHING_ARGUMENTS | {argument: logged}))
    [mismatch] = log_mismatches(parse_logs([path]), _config())
    assert (mismatch.field, mismatch.script_value, mismatch.log_value) == (field, script_value, int(logged))
    lines = path.read_text().splitlines()
    assert mismatch.evidence.line >= 1 and lines[mismatch.evidence.line - 1] == mismatch.evidence.text
    assert f" {argument} ." in mismatch.evidence.text and mismatch.evidence.text.endswith(f" {logged}")


def _tp_evidence_is_its_own_line(log_source: str, text: str) -> None:
    [mismatch] = log_mismatches(parse_logs([log_source]), _config())
    lines = text.splitlines()
    assert mismatch.field == "TP" and mismatch.evidence.text.endswith(" tensor_model_parallel_size " + "." * 22 + " 4")
    assert lines[mismatch.evidence.line - 1] == mismatch.evidence.text  # the field's own line, not `end of arguments`


def test_a_gzip_logs_evidence_is_the_fields_own_line(tmp_path: Path) -> None:
    text = _log_text(MATCHING_ARGUMENTS | {"tensor_model_parallel_size": "4"})
    path = tmp_path / "train.log.gz"
    path.write_bytes(gzip.compress(text.encode()))
    _tp_evidence_is_its_own_line(str(path), text)


def test_stdins_evidence_is_the_fields_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _log_text(MATCHING_ARGUMENTS | {"tensor_model_parallel_size": "4"})
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    _tp_evidence_is_its_own_line("-", text)


def test_the_argument_lines_stay_out_of_the_json(tmp_path: Path) -> None:
    arguments = parse_logs([_write(tmp_path, _log_text(MATCHING_ARGUMENTS))]).arguments
    assert arguments is not None and arguments.value_lines["world_size"][0] > 1
    assert "value_lines" not in arguments.to_dict() and arguments.to_dict()["values"] == MATCHING_ARGUMENTS


def test_without_an_arguments_block_the_iteration_lines_batch_is_compared(tmp_path: Path) -> None:
    path = _write(tmp_path, _log_text(None, gbs=64))
    [mismatch] = log_mismatches(parse_logs([path]), _config())
    assert (mismatch.field, mismatch.log_value, mismatch.script_value) == ("global batch size", 64, 128)
    assert "global batch size:    64" in mismatch.evidence.text
    assert log_mismatches(parse_logs([_write(tmp_path, _log_text(None, gbs=128))]), _config()) == []
    ramped = _config(FLAGS + " --rampup-batch-size 32 32 1000")  # a ramp logs smaller batches first
    assert log_mismatches(parse_logs([path]), ramped) == []


def test_an_assumed_world_size_is_not_held_against_the_log(tmp_path: Path) -> None:
    config = _config(FLAGS.replace(" --nproc-per-node 8", ""))
    assert config.world_size_assumed and config.world_size == 4
    log = parse_logs([_write(tmp_path, _log_text(MATCHING_ARGUMENTS))])
    assert log_mismatches(log, config) == []


def test_diagnose_reports_the_mismatch_and_never_says_no_problem(tmp_path: Path) -> None:
    other_run = _write(tmp_path, _log_text(MATCHING_ARGUMENTS | {"world_size": "128", "data_parallel_size": "32"}))
    result = diagnose([other_run], flags=FLAGS, gpu=get_gpu("h100"))
    assert result.findings[0].category == "log_mismatch" and result.findings[0].severity == "error"
    assert "world size 128 in the log, 8 in the script" in result.findings[0].title
    assert "no problem found in the log" not in [note.text for note in result.notes]
    same_run = diagnose([_write(tmp_path, _log_text(MATCHING_ARGUMENTS))], flags=FLAGS, gpu=get_gpu("h100"))
    assert all(f.category != "log_mismatch" for f in same_run.findings)


def test_optimize_does_not_calibrate_against_a_log_of_another_run(tmp_path: Path) -> None:
    config = _config()
    other = parse_logs([_write(tmp_path, _log_text(MATCHING_ARGUMENTS | {"seq_length": "8192"}))])
    report = optimize(config, log=other)
    assert report.calibration_scale is None and report.measured_step_time_s is None
    assert report.log_mismatch is not None and "sequence length 8192 in the log" in report.log_mismatch.title
    assert report.to_dict()["log_mismatch"]["category"] == "log_mismatch"

    same = parse_logs([_write(tmp_path, _log_text(MATCHING_ARGUMENTS))])
    calibrated = optimize(config, log=same)
    assert calibrated.log_mismatch is None and calibrated.measured_step_time_s == pytest.approx(9.0701)
    assert calibrated.calibration_scale is not None
