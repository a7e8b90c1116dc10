"""Shared CLI helpers: JSON output, the rich console, and model/GPU resolution from flags."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def _default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def emit_json(payload: Any) -> None:
    """Print machine output: one JSON document on stdout, nothing else."""
    sys.stdout.write(json.dumps(payload, default=_default, indent=2) + "\n")
