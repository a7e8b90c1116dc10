"""suite.tokenizer: the tokenizer stage passes, fails or says why it did nothing, before any job starts."""

from __future__ import annotations

from megapilot.suite.config import load_suite
from megapilot.suite.results import Verdict
from megapilot.suite.tokenizer import prepare_tokenizer
from tests.suite.cvs_files import SINGLE_8B, filled_in, raw_cvs, write_suite


def _suite(tmp_path, tokenizer: str, **megapilot):
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["train_params"]["tokenizer_model"] = tokenizer
    if megapilot:
        raw["megapilot"] = megapilot
    return load_suite(write_suite(tmp_path, raw, SINGLE_8B))


def test_a_local_tokenizer_passes_when_it_exists_and_fails_naming_it_when_not(tmp_path):
    (tmp_path / "tok").mkdir()
    assert prepare_tokenizer(_suite(tmp_path, str(tmp_path / "tok"))).verdict is Verdict.PASS
    row = prepare_tokenizer(_suite(tmp_path, str(tmp_path / "gone")))
    assert row.verdict is Verdict.FAIL and f"train_params.tokenizer_model {tmp_path}/gone does not exist" in row.reason


def test_no_tokenizer_named_is_skipped_with_the_field(tmp_path):
    row = prepare_tokenizer(_suite(tmp_path, ""))
    assert row.verdict is Verdict.SKIPPED and "tokenizer_model is empty" in row.reason


def test_the_embedded_trainer_on_mock_data_needs_none(tmp_path):
    row = prepare_tokenizer(_suite(tmp_path, "meta-llama/Llama-3.1-8B", backend="megapilot"))
    assert row.verdict is Verdict.SKIPPED and "needs no tokenizer" in row.reason


def test_a_hub_tokenizer_for_jobs_that_run_elsewhere_is_left_to_the_jobs(tmp_path):
    row = prepare_tokenizer(_suite(tmp_path, "meta-llama/Llama-3.1-8B", executor="slurm"))
    assert row.verdict is Verdict.RECORD
    assert row.reason.startswith("meta-llama/Llama-3.1-8B: fetched by the jobs on the nodes with HF_TOKEN (the slurm")
