"""A Hugging Face hub id (`meta-llama/Llama-3.1-70B`) as `--model`: its `config.json`, from the cache or the hub.

Users name models the way the hub does. The config is read, in order, from:

1. the local Hugging Face cache, in the layout `huggingface_hub` writes
   (`<cache>/models--<org>--<name>/snapshots/<revision>/config.json`, with `refs/main` naming the
   revision), where `<cache>` is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`;
2. the hub itself, through `huggingface_hub` (the `hub` extra, imported only here and only then),
   unless `HF_HUB_OFFLINE` is set. Its token comes from where `huggingface_hub` looks (`HF_TOKEN`,
   then the token file `huggingface-cli login` writes); it is never printed: a failure's reason is
   shown with any token value masked.

When neither works, a preset read from that repository's config.json stands in (catalog/models.py); for any
other repository one error names both ways.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

from megapilot.errors import MegapilotError

# `org/name` as the hub spells repository ids: letters, digits, `-`, `_`, `.`; no leading `.` or `-`.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_FILE_SUFFIXES = (".json", ".yaml", ".yml")
_TRUE = ("1", "true", "yes", "on")
CONFIG_FILE = "config.json"
DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_S = 5.0


def looks_like_hub_id(text: str) -> bool:
    """`org/name`, and not a path to a spec file (`models/my.yaml`) that merely has one slash."""
    return bool(_HUB_ID.match(text)) and not text.lower().endswith(_FILE_SUFFIXES)


def hub_cache_dir() -> Path:
    """Where `huggingface_hub` keeps its downloads, by the same environment variables it reads."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def cached_config(repo_id: str, cache: Path | None = None) -> Path | None:
    """The cached `config.json` of `repo_id`: the `refs/main` snapshot, else the newest snapshot holding one."""
    org, name = repo_id.split("/", 1)
    repo_dir = (cache or hub_cache_dir()) / f"models--{org}--{name}"
    main_ref = repo_dir / "refs" / "main"
    if main_ref.is_file():
        pinned = repo_dir / "snapshots" / main_ref.read_text(encoding="utf-8").strip() / CONFIG_FILE
        if pinned.is_file():
            return pinned
    snapshots = [path for path in (repo_dir / "snapshots").glob(f"*/{CONFIG_FILE}") if path.is_file()]
    return max(snapshots, key=lambda path: path.stat().st_mtime) if snapshots else None


def resolve_hub_config(repo_id: str) -> Path:
    """The local path of `repo_id`'s `config.json`, from the cache or downloaded; MegapilotError naming both ways."""
    cache = hub_cache_dir()
    found = cached_config(repo_id, cache)
    if found is not None:
        return found
    try:
        return _download_config(repo_id)
    except _DownloadFailed as failed:
        raise MegapilotError(
            f"{repo_id!r} is neither a preset, a local path, nor in the Hugging Face cache ({cache}), and its "
            f"config.json could not be downloaded: {failed}",
            field="model",
            fix=f"download it where the network allows (`huggingface-cli download {repo_id} config.json`, with "
                "HF_TOKEN set for a gated model) or pass the path of its config.json",
        ) from None


class _DownloadFailed(Exception):
    """Why the hub did not give the file (the reason, token masked)."""


def _download_config(repo_id: str) -> Path:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        raise _DownloadFailed("HF_HUB_OFFLINE is set")
    try:
        # optional and heavy: huggingface_hub (hub extra) only to download a config
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import logging as hub_logging
    except ImportError:
        raise _DownloadFailed("huggingface_hub is not installed (pip install 'megapilot[hub]')") from None
    # Read now, not when huggingface_hub was first imported (it fixes its own copy then).
    endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    unreachable = _unreachable(endpoint)
    if unreachable:  # huggingface_hub would retry for half a minute, printing each retry
        raise _DownloadFailed(unreachable)
    hub_logging.set_verbosity_error()  # its retry and progress chatter is not this command's output
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=CONFIG_FILE, endpoint=endpoint))
    except Exception as exc:  # noqa: BLE001 - every hub failure (network, 401/403 gated, 404, disk) is one answer
        raise _DownloadFailed(_reason(exc)) from None


def _unreachable(endpoint: str) -> str | None:
    """Why the hub's host cannot be reached within a few seconds, or None when it can."""
    url = urlparse(endpoint)
    host, port = url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return f"cannot reach {host}:{port} ({exc.strerror or exc})"
    return None


def _reason(exc: Exception) -> str:
    """The first line of a hub error, with any token value masked (the error could echo a header)."""
    lines = str(exc).strip().splitlines()
    reason = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    return reason.replace(token, "***") if token else reason
