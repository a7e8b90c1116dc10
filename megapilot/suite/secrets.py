"""Secrets of a suite: which values they are, and copies of its input files with them masked.

A secret is the value of a variable whose name says it is one (TOKEN, SECRET, PASSWORD, API_KEY, ACCESS_KEY,
a name ending in KEY, ...), of any variable named in the config's `megapilot.secrets`, and the HF token
(read from paths.hf_token_file at run time). Secrets reach a job through its environment (or, on remote
nodes, a 0600 environment file the node deletes once read) and are written nowhere: the run directory
keeps the config and cluster file with every secret value masked, and is created readable by its owner
alone when the suite holds any secret.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megapilot.files import atomic_write_text

if TYPE_CHECKING:
    from megapilot.suite.config import LoadedSuite

MASK = "***"
# Short values ("1", "yes") are not masked inside other text: a secret is long, and masking "1" everywhere
# would garble the copy. Under a secret's own key any value is masked.
MIN_MASKED_LENGTH = 6
# TOKEN as a word of its own: TOKENIZER_MODEL, TOKENIZERS_PARALLELISM and MAX_TOKENS hold no credential.
_SECRET_NAME = re.compile(r"TOKEN(?![A-Z])|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|API_?KEY|PRIVATE_KEY"
                          r"|ACCESS_KEY|(^|_)KEY$", re.IGNORECASE)
# Where a secret is kept (hf_token_file, SSH_PRIVATE_KEY_PATH), not the secret: such values stay readable.
_LOCATION_NAME = re.compile(r"_(FILE|PATH|DIR)$", re.IGNORECASE)


def is_secret_name(name: str, named: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether a variable or key of this name holds a credential (by its name, or listed in `named`)."""
    return name in named or (bool(_SECRET_NAME.search(name)) and not _LOCATION_NAME.search(name))


def secret_names(suite: LoadedSuite) -> frozenset[str]:
    return frozenset(suite.config.megapilot.secrets)


def secret_values(suite: LoadedSuite) -> list[str]:
    """Every secret value the suite holds (environment values under secret names, and the HF token)."""
    named = secret_names(suite)
    env: dict[str, str] = dict(suite.cluster.env_vars) if suite.cluster else {}
    if suite.config.container is not None:
        env.update({k: str(v) for k, v in suite.config.container.env.items()})
    values = [value for name, value in env.items() if is_secret_name(name, named) and value]
    token_file = Path(suite.hf_token_file)
    if token_file.is_file():
        try:
            token = token_file.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            token = ""
        if token:
            values.append(token)
    return sorted(set(values), key=len, reverse=True)


def holds_secrets(suite: LoadedSuite) -> bool:
    return bool(secret_values(suite))


def mask_text(text: str, values: list[str]) -> str:
    """`text` with every secret value in it replaced by the mask."""
    for value in values:
        if len(value) >= MIN_MASKED_LENGTH:
            text = text.replace(value, MASK)
    return text


def write_masked_copy(source: Path, target: Path, suite: LoadedSuite) -> Path:
    """Copy an input file (JSON or YAML) with the value under every secret-named key masked, and any secret
    value left in other text too; the copy is the owner's alone when it held a secret."""
    text = Path(source).read_text(encoding="utf-8", errors="replace")
    named = secret_names(suite)
    values = secret_values(suite)
    masked = _masked_document(text, Path(source).suffix.lower(), named)
    masked = mask_text(masked, values)
    atomic_write_text(target, masked, mode=0o600 if masked != text else 0o644)
    os.utime(target, (Path(source).stat().st_atime, Path(source).stat().st_mtime))
    return target


def _masked_document(text: str, suffix: str, named: frozenset[str]) -> str:
    try:
        if suffix in (".yaml", ".yml"):
            import yaml  # start-up: 18 ms to import, paid only when a config is YAML

            data = yaml.safe_load(text)
            masked = _mask_keys(data, named)
            return text if masked == data else yaml.safe_dump(masked, sort_keys=False)
        data = json.loads(text)
    except Exception:  # noqa: BLE001 - not a document (it was read as one to run); the values are masked below
        return text
    masked = _mask_keys(data, named)
    return text if masked == data else json.dumps(masked, indent=2) + "\n"


def _mask_keys(node: Any, named: frozenset[str]) -> Any:
    if isinstance(node, dict):
        return {k: (MASK if isinstance(k, str) and is_secret_name(k, named) and v not in ("", None)
                    else _mask_keys(v, named)) for k, v in node.items()}
    if isinstance(node, list):
        return [_mask_keys(item, named) for item in node]
    return node


__all__ = ["MASK", "holds_secrets", "is_secret_name", "mask_text", "secret_names", "secret_values",
           "write_masked_copy"]
