"""`--model org/name`: the config.json from a Hugging Face cache the test builds, or from a hub server the test runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.hub import cached_config, hub_cache_dir, looks_like_hub_id
from megapilot.catalog.models import close_presets
from megapilot.errors import MegapilotError

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
REPO = "meta-llama/Llama-3.1-8B"


@pytest.fixture(autouse=True)
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache of the test's own and no way to the real hub."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf-home" / "hub"


def _cache_snapshot(cache: Path, repo_id: str, config: Path, revision: str, *, ref: bool = True) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<revision>/config.json}."""
    org, name = repo_id.split("/")
    repo_dir = cache / f"models--{org}--{name}"
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(config.read_text())
    if ref:
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / "main").write_text(revision)
    return snapshot / "config.json"


def test_hub_id_is_read_from_the_cache_under_hf_home(hub_env: Path):
    _cache_snapshot(hub_env, REPO, CONFIGS / "Llama-3.1-8B.json", "a" * 40)
    spec = get_model(REPO)
    preset = get_model("llama3.1-8b")
    assert spec.name == "Llama-3.1-8B"  # the repository's name, not the snapshot hash
    assert (spec.num_layers, spec.hidden_size, spec.kv_heads, spec.vocab_size) == (
        preset.num_layers, preset.hidden_size, preset.kv_heads, preset.vocab_size)


def test_refs_main_picks_the_snapshot_and_hf_hub_cache_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "explicit-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert hub_cache_dir() == cache
    _cache_snapshot(cache, REPO, CONFIGS / "Llama-3.1-70B.json", "b" * 40, ref=False)  # an older snapshot
    main = _cache_snapshot(cache, REPO, CONFIGS / "Llama-3.1-8B.json", "c" * 40)
    assert cached_config(REPO) == main
    assert get_model(REPO).num_layers == 32


def test_a_snapshot_without_refs_main_is_still_found(hub_env: Path):
    _cache_snapshot(hub_env, "Qwen/Qwen3-30B-A3B", CONFIGS / "Qwen3-30B-A3B.json", "d" * 40, ref=False)
    assert get_model("Qwen/Qwen3-30B-A3B").moe is not None


def test_neither_cache_nor_download_is_one_error_naming_both_ways(hub_env: Path):
    with pytest.raises(MegapilotError) as err:
        get_model("meta-llama/Llama-3.2-1B")  # no preset was read from its config
    message = str(err.value)
    assert err.value.field == "model"
    assert str(hub_env) in message and "HF_HUB_OFFLINE" in message  # where it looked, why it did not download
    assert "huggingface-cli download meta-llama/Llama-3.2-1B" in message and "config.json" in message


def test_offline_a_hub_id_a_preset_was_read_from_gives_that_preset_under_its_name(hub_env: Path):
    """No cache, no hub: deepseek-ai/DeepSeek-V3 is the deepseek-v3 preset (read from that config.json); a cached
    config still wins, named after the repository."""
    assert get_model("deepseek-ai/DeepSeek-V3") == get_model("deepseek-v3")
    assert get_model("Qwen/qwen3-30b-a3b").name == "qwen3-30b-a3b"  # the hub's ids are case-insensitive
    _cache_snapshot(hub_env, REPO, CONFIGS / "Llama-3.1-8B.json", "e" * 40)
    assert get_model(REPO).name == "Llama-3.1-8B"


def test_offline_a_hub_id_whose_model_card_a_preset_cites_gives_that_preset(hub_env: Path):
    """Nemotron-H's presets cite the repository's model card (their shape is Megatron-Bridge's provider's): its hub
    id stood in for nothing offline, though the repository is the same. A repository that merely begins like a
    cited one is not it."""
    assert get_model("nvidia/Nemotron-H-56B-Base-8K") == get_model("nemotron-h-56b")
    assert get_model("nvidia/Nemotron-H-8B-Base-8K") == get_model("nemotron-h-8b")
    with pytest.raises(MegapilotError):
        get_model("nvidia/Nemotron-H-56B-Base")


def test_cli_names_the_hub_id_error_on_one_line(cli):
    result = cli("estimate", "--model", "nvidia/not-cached", "--gpu", "h100", "--gpus", "8", "--gbs", "8",
                 "--seq-len", "1024")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "model:" in result.stderr and "Hugging Face cache" in result.stderr


@pytest.mark.parametrize(("text", "is_hub_id"), [
    ("meta-llama/Llama-3.1-70B", True), ("deepseek-ai/DeepSeek-V3", True), ("Qwen/Qwen2.5-7B", True),
    ("models/mine.yaml", False), ("./llama/config.json", False), ("/abs/path", False), ("a/b/c", False),
    ("llama3.1-8b", False),
])
def test_what_counts_as_a_hub_id(text: str, is_hub_id: bool):
    assert looks_like_hub_id(text) is is_hub_id


def test_a_local_directory_of_the_same_name_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    local = tmp_path / "org" / "model"
    local.mkdir(parents=True)
    (local / "config.json").write_text((CONFIGS / "Llama-3.1-8B.json").read_text())
    monkeypatch.chdir(tmp_path)
    assert get_model("org/model").num_layers == 32  # no cache entry, no download: the path was used


@pytest.mark.parametrize(("typed", "expected_first"), [
    ("gpt3", "gpt3-175b"), ("llama3.1", "llama3.1-8b"), ("lama3.1-70b", "llama3.1-70b"), ("deepsek-v3", None),
])
def test_close_presets_for_prefixes_and_typos(typed: str, expected_first: str | None):
    suggestions = close_presets(typed)
    assert suggestions, typed
    assert len(suggestions) <= 4
    if expected_first is not None:
        assert suggestions[0] == expected_first
    with pytest.raises(MegapilotError, match="did you mean"):
        get_model(typed)


# ---- the download path, against a hub server run by the test ------------------------------------


class _Hub(BaseHTTPRequestHandler):
    """Serves `/<org>/<name>/resolve/main/config.json` as the hub does, and records the Authorization header."""

    config: ClassVar[bytes] = b""
    seen_authorization: ClassVar[list[str]] = []

    def _answer(self, with_body: bool) -> None:
        self.seen_authorization.append(self.headers.get("Authorization", ""))
        if "Gated" in self.path or not self.path.endswith("/resolve/main/config.json"):
            self.send_response(401 if "Gated" in self.path else 404)  # a gated model without access: 401
            self.send_header("X-Error-Code", "GatedRepo" if "Gated" in self.path else "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.config)))
        self.send_header("ETag", '"0123456789abcdef"')
        self.send_header("X-Repo-Commit", "e" * 40)
        self.end_headers()
        if with_body:
            self.wfile.write(self.config)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hub_endpoint() -> Iterator[str]:
    """One server for the module: huggingface_hub reads HF_ENDPOINT once, when it is first imported."""
    pytest.importorskip("huggingface_hub")
    _Hub.config = (CONFIGS / "Llama-3.1-8B.json").read_bytes()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hub_server(hub_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> type[_Hub]:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", hub_endpoint)
    _Hub.seen_authorization = []
    return _Hub


def test_a_hub_id_not_cached_is_downloaded_with_the_token_from_the_environment(hub_server, hub_env: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    spec = get_model("someorg/Some-8B")
    assert spec.name == "Some-8B" and spec.num_layers == 32
    assert "Bearer hf_secret_token_value" in hub_server.seen_authorization
    assert cached_config("someorg/Some-8B") is not None  # now in the cache, read from there next time


def test_a_failed_download_names_both_ways_and_never_the_token(hub_server, cli, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    result = cli("models", "gatedorg/Gated-70B")
    assert "Bearer hf_secret_token_value" in hub_server.seen_authorization  # it was sent, and only there
    assert result.exit_code == 2
    assert "Hugging Face cache" in result.stderr and "huggingface-cli download gatedorg/Gated-70B" in result.stderr
    assert "hf_secret_token_value" not in result.stderr + result.stdout
