"""The tokenizer stage: make sure the tokenizer the jobs need is there before any job starts.

CVS downloads a tokenizer only for DeepSeek and Mixtral on the Megatron-LM image and skips the stage
everywhere else; a missing token file then silently skips every test. Here:
- the embedded trainer on mock data or with the byte tokenizer needs none (SKIPPED, said so);
- `train_params.tokenizer_model` naming a local file or folder: PASS when it exists, FAIL when not;
- a Hugging Face id: the token is read from `paths.hf_token_file` (its value is never printed or
  written) and the tokenizer files are fetched into `paths.data_cache_dir/<id>` with huggingface_hub
  when it is installed; without it, RECORD: the job downloads the tokenizer itself with HF_TOKEN.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from megapilot.suite.results import MetricRow, Verdict

if TYPE_CHECKING:
    from megapilot.suite.config import LoadedSuite

TOKENIZER_FILES = ["tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "*.tiktoken"]


def prepare_tokenizer(suite: LoadedSuite) -> MetricRow:
    name = "tokenizer"
    block = suite.config.megapilot
    tokenizer = str(suite.config.train_params.tokenizer_model or "").strip()
    if suite.backend == "megapilot" and (block.data_path is None or block.tokenizer_type in (None, "ByteTokenizer",
                                                                                             "NullTokenizer")):
        return MetricRow(name=name, verdict=Verdict.SKIPPED,
                         reason="the embedded trainer's mock/byte/null data needs no tokenizer download")
    if not tokenizer:
        return MetricRow(name=name, verdict=Verdict.SKIPPED, reason="train_params.tokenizer_model is empty")
    if tokenizer.startswith(("/", "./", "~")):
        path = Path(tokenizer).expanduser()
        if path.exists():
            return MetricRow(name=name, verdict=Verdict.PASS, reason=f"local tokenizer {path}")
        return MetricRow(name=name, verdict=Verdict.FAIL,
                         reason=f"train_params.tokenizer_model {path} does not exist on this machine")
    return _download(suite, tokenizer)


def _download(suite: LoadedSuite, repo_id: str) -> MetricRow:
    name = "tokenizer"
    if not suite.capabilities.runs_here:
        return MetricRow(name=name, verdict=Verdict.RECORD,
                         reason=f"{repo_id}: fetched by the jobs on the nodes with HF_TOKEN (the {suite.executor} "
                                "executor's jobs run elsewhere)")
    try:
        from huggingface_hub import snapshot_download  # optional and heavy: only this download path needs it
    except ImportError:
        return MetricRow(name=name, verdict=Verdict.RECORD,
                         reason=f"{repo_id}: huggingface_hub is not installed here; the job downloads it with HF_TOKEN")
    token_file = suite.hf_token_file
    token = Path(token_file).read_text(encoding="utf-8").strip() if token_file and Path(token_file).is_file() else None
    cache = Path(str(suite.config.paths.data_cache_dir or Path.home() / ".cache" / "megapilot")) / repo_id
    try:
        snapshot_download(repo_id=repo_id, allow_patterns=TOKENIZER_FILES, local_dir=str(cache), token=token)
    except Exception as exc:  # noqa: BLE001 - any hub/network failure is this stage's FAIL, with its class
        return MetricRow(name=name, verdict=Verdict.FAIL,
                         reason=f"{repo_id}: download failed ({type(exc).__name__}); check paths.hf_token_file "
                                "and network access")
    return MetricRow(name=name, verdict=Verdict.PASS, reason=f"{repo_id} fetched into {cache}")


__all__ = ["prepare_tokenizer"]
