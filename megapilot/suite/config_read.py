"""Reading a suite config as CVS does: the file (JSON, or YAML by suffix) and the cluster file, placeholder
substitution, the `<changeme>` values left, and the words a validation error is reported in."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_core import ErrorDetails

from megapilot.errors import MegapilotError
from megapilot.suite.cluster import CvsCluster, load_cluster, strip_comments, substitute_user
from megapilot.suite.parsing import ParseLimitError, parse_json, parse_yaml

if TYPE_CHECKING:
    from megapilot.suite.config import SuiteCheck


CHANGEME = "<changeme>"
_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.\-]+)\}")


# ---- reading ------------------------------------------------------------------------------------
def _read_cluster(cluster_path: str | Path | None, check: SuiteCheck) -> CvsCluster | None:
    if cluster_path is None:
        return None
    try:
        return load_cluster(cluster_path)
    except MegapilotError as exc:
        check.add("cluster", exc.problem, exc.fix or "")
        return None


def _read_config(path: Path, check: SuiteCheck) -> dict[str, Any] | None:
    fix = "pass a CVS Megatron config (JSON) or the same in YAML"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        check.add("config", f"cannot read {path} ({getattr(exc, 'strerror', None) or exc})", fix)
        return None
    duplicates: list[str] = []
    try:
        raw = _parse_text(text, path, duplicates)
    except ParseLimitError as exc:
        if exc.path:  # a value at a path: named like any other bad value
            check.add(exc.path, str(exc), "write a finite number")
        else:
            check.add("config", f"{path} cannot be read safely ({exc})", fix)
        return None
    except ValueError as exc:
        check.add("config", f"{path} is not valid {_format_name(path)} ({' '.join(str(exc).split())})", fix)
        return None
    if not isinstance(raw, dict):
        check.add("config", f"{path} holds a {type(raw).__name__}, not a mapping of settings", fix)
        return None
    for key in duplicates:
        check.add("config", f"key {key!r} appears more than once; only the last one would count",
                  "keep one entry per key")
    return strip_comments(raw)  # type: ignore[return-value]  # a mapping stays a mapping


def _format_name(path: Path) -> str:
    return "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON"


def _parse_text(text: str, path: Path, duplicates: list[str]) -> Any:
    if _format_name(path) == "YAML":
        return parse_yaml(text)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    return parse_json(text, object_pairs_hook=pairs)


# ---- substitution -------------------------------------------------------------------------------
def resolve_placeholders(raw: dict[str, Any], user: str, config_dir: Path) -> dict[str, Any]:
    """CVS's three passes: `{user-id}` everywhere; `{x}` inside `paths` from its siblings; `{paths.x}`
    everywhere. Relative `paths` values are then anchored at the config's folder."""
    raw = substitute_user(raw, user)  # type: ignore[assignment]  # a mapping stays a mapping
    paths = raw.get("paths")
    if isinstance(paths, dict):
        raw["paths"] = _anchor_relative(_resolve_within_paths(paths), config_dir)
        flat = {f"paths.{k}": v for k, v in raw["paths"].items() if isinstance(v, (str, int, float))}
        raw = _substitute(raw, {k: str(v) for k, v in flat.items()})
    return raw


def _resolve_within_paths(paths: dict[str, Any]) -> dict[str, Any]:
    for _ in range(len(paths) + 1):  # each pass resolves one more level of reference
        mapping = {k: v for k, v in paths.items() if isinstance(v, str)}
        resolved = {k: _substitute(v, mapping) for k, v in paths.items()}
        if resolved == paths:
            break
        paths = resolved
    return paths


def _substitute(node: Any, mapping: dict[str, str]) -> Any:
    if isinstance(node, str):
        return _PLACEHOLDER.sub(lambda m: mapping.get(m.group(1), m.group(0)), node)
    if isinstance(node, list):
        return [_substitute(item, mapping) for item in node]
    if isinstance(node, dict):
        return {k: _substitute(v, mapping) for k, v in node.items()}
    return node


def _anchor_relative(paths: dict[str, Any], config_dir: Path) -> dict[str, Any]:
    anchored = dict(paths)
    for key, value in paths.items():
        if isinstance(value, str) and value and CHANGEME not in value and not value.startswith(("/", "~", "{")):
            anchored[key] = str((config_dir / value).absolute())
    return anchored


def _exempt_unused_checkpoint(raw: dict[str, Any]) -> None:
    """As CVS: with checkpoint testing off, its shared directory and volume may stay unfilled."""
    checkpoint = raw.get("checkpoint")
    if isinstance(checkpoint, dict) and _as_flag(checkpoint.get("enforce", False)):
        return
    if isinstance(checkpoint, dict):
        checkpoint.pop("checkpoint_dir", None)
    args = _dig(raw, "container", "runtime", "args")
    if isinstance(args, dict) and isinstance(args.get("volumes"), list):
        args["volumes"] = [v for v in args["volumes"] if not (isinstance(v, str) and CHANGEME in v)]


def _as_flag(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _dig(node: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def changeme_paths(node: Any, path: str = "") -> list[str]:
    """Dotted paths (list items as `[i]`) of every string still holding `<changeme>`."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in changeme_paths(v, f"{path}.{k}" if path else str(k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in changeme_paths(v, f"{path}[{i}]")]
    if isinstance(node, str) and CHANGEME in node.lower():
        return [path]
    return []


def _dotted(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _fix_of(error: ErrorDetails, path: str) -> str:
    """What to do about one validation error: a missing field is added, not respelled."""
    if not path:
        return ""
    if error.get("type") == "missing":
        return f"add `{path.rsplit('.', 1)[-1]}` under `{path.rsplit('.', 1)[0]}`" if "." in path \
            else f"add `{path}` (`megapilot suite init` writes a complete config to start from)"
    message = str(error.get("msg", ""))
    if error.get("type") in _BOUND_ERRORS and message.startswith("Input should be "):
        return "give a value that is " + message.removeprefix("Input should be ")  # the bound, not a respelling
    if _CHOICES in message:
        return "use one of: " + message.split(_CHOICES, 1)[1]
    return "fix the value's type or spelling"


# pydantic's errors for a value out of its bounds: the fix is the bound itself.
_BOUND_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"})
_CHOICES = "; use one of: "  # how a validator lists the values it takes (the fix, not the problem)


def _message(error: ErrorDetails) -> str:
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ").split(_CHOICES, 1)[0]
    if error.get("type") == "extra_forbidden":
        return "not a known setting here"
    if "input" in error and error.get("type") != "missing" and "got " not in message \
            and _short_repr(error["input"]) not in message:  # a value the message names already is not said twice
        return f"{message} (got {_short_repr(error['input'])})"
    return message


def _short_repr(value: Any) -> str:
    """The offending value, cut short: a message names it, it does not reprint a huge one."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
