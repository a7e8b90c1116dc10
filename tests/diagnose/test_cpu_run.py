"""A CPU run (the README tour's: gloo backend, the byte tokenizer) gets no GPU advice, whatever --gpu says, and its
vocabulary is the one its log printed; optimize proposes no change the model predicts slower."""

from __future__ import annotations

import json
from pathlib import Path

from megapilot.diagnose import diagnose
from megapilot.diagnose.flags import read_flags, run_config

# A real run of the README tour on this project's embedded trainer (2 CPU ranks, 10 iterations; train.sh as
# `megapilot script --cpu` wrote it, its paths moved to /tmp/tour): see tests/data/logs/INDEX.md.
TOUR = Path(__file__).resolve().parents[1] / "data" / "logs" / "cpu_tour"
GPU_WORDS = ("fp8", "nvidia-smi", "tp-comm-overlap", "mfu")


def test_the_tour_cpu_run_gets_no_gpu_advice_even_with_a_gpu_named(cli):
    result = cli("diagnose", str(TOUR / "training.log"), "--script", str(TOUR / "train.sh"), "--gpu", "h100",
                 "--json")
    assert result.exit_code == 0
    data = result.json()
    assert "low_throughput" not in [finding["category"] for finding in data["findings"]]
    text = json.dumps(data["findings"]).lower()
    assert not any(word in text for word in GPU_WORDS)
    assert any("trained on CPU" in note for note in data["notes"])
    assert not any("assumed 32000" in note for note in data["notes"])


def test_the_vocabulary_comes_from_the_log_when_the_script_is_silent():
    config = diagnose([TOUR / "training.log"], script=TOUR / "train.sh").config
    assert config is not None and config.model is not None and config.model.vocab_size == 258  # ByteTokenizer


def test_a_script_of_the_embedded_trainer_that_names_no_tokenizer_runs_its_bytes(tmp_path):
    # `megapilot run train.sh` prices the run from the script alone: the trainer's tokenizer, not 32,000 assumed
    flags = read_flags(script=TOUR / "train.sh")
    assert flags.embedded_trainer and flags.get("--tokenizer-type") is None
    config = run_config(flags)
    assert config.model is not None and config.model.vocab_size == 258
    assert not any("assumed 32000" in note for note in config.notes)
    # the same flags launched into Megatron-LM's pretrain_gpt.py say nothing of the tokenizer
    megatron = tmp_path / "megatron.sh"
    megatron.write_text((TOUR / "train.sh").read_text().replace("-m megapilot.trainer",
                                                                "/opt/Megatron-LM/pretrain_gpt.py"))
    assert run_config(read_flags(script=megatron)).model.vocab_size == 32000
    # with --mock-data the trainer's NullTokenizer needs --vocab-size, which then is the vocabulary (+ its EOD)
    mock = tmp_path / "mock.sh"
    mock.write_text((TOUR / "train.sh").read_text().replace("--data-path /tmp/tour/docs",
                                                            "--mock-data --vocab-size 1000"))
    assert run_config(read_flags(script=mock)).model.vocab_size == 1001


def test_optimize_on_the_cpu_run_proposes_nothing_for_the_gpu(cli):
    result = cli("optimize", "--script", str(TOUR / "train.sh"), "--log", str(TOUR / "training.log"), "--gpu",
                 "h100", "--json")
    assert result.exit_code == 0
    data = result.json()
    assert data["changes"] == [] and any("trained on CPU" in note for note in data["notes"])
    # the vocabulary the run used, as diagnose reads it: not the 32,000 assumed where the script is silent
    assert not any("assumed 32000" in note for note in data["notes"])
    assert "tokenizer/vocabulary from the log's arguments block" in data["notes"]


def test_no_negative_gain_change_is_ever_listed(cli):
    result = cli("optimize", "--flags", "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
                 "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 512 --bf16 "
                 "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --vocab-size 128256",
                 "--gpu", "h100", "--gpus", "64", "--json")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    assert all(change["gain_pct"] is None or change["gain_pct"] >= 0 for change in data["changes"])
    assert data["changes"]  # a GPU run still gets its changes
