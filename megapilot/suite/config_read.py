"""Reading a suite config as CVS does: the file (JSON, or YAML by suffix) and the cluster file, placeholder
substitution, the `<changeme>` values left, and the words a validation error is reported in."""

from __future__ import annotations

import os
import re
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from megapilot.errors import MegapilotError
from megapilot.suite.cluster import CvsCluster, load_cluster, strip_comments, substitute_user
from megapilot.suite.parsing import ParseLimitError, json_hint, parse_json, parse_yaml

if TYPE_CHECKING:
    from megapilot.suite.config import SuiteCheck


CHANGEME = "<changeme>"
_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.\-]+)\}")
_ENV_VARIABLE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")


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
    if not text.strip():
        check.add("config", f"{path} is empty", fix)
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
        check.add("config", f"{path} is not valid {_format_name(path)} ({' '.join(str(exc).split())}){json_hint(exc)}",
                  fix)
        return None
    if not isinstance(raw, dict):
        check.add("config", f"{path} holds {_kind_of(raw)}, not a mapping of settings", fix)
        return None
    for key in duplicates:
        check.add("config", f"key {key!r} appears more than once; only the last one would count",
                  "keep one entry per key")
    return strip_comments(raw)  # type: ignore[return-value]  # a mapping stays a mapping


def _kind_of(value: Any) -> str:
    """A parsed document's top level in the words of JSON and YAML, not Python's (NoneType, int)."""
    if value is None:
        return "null (nothing)"
    if isinstance(value, bool):
        return "a true/false"
    if isinstance(value, (int, float)):
        return "a number"
    return "a string" if isinstance(value, str) else f"a {type(value).__name__}"


def _format_name(path: Path) -> str:
    return "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON"


def _parse_text(text: str, path: Path, duplicates: list[str]) -> Any:
    if _format_name(path) == "YAML":
        return parse_yaml(text, duplicates=duplicates)
    return parse_json(text, duplicates=duplicates)


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
    """`~` and `$VAR`/`${VAR}` expanded as a shell on this machine would (quoted into the jobs' commands, no shell
    expands them later), then a relative path anchored at the config's folder. A variable that is not set stays as
    written, unanchored: unset_path_variables names it."""
    anchored = dict(paths)
    for key, value in paths.items():
        if not isinstance(value, str) or not value or CHANGEME in value:
            continue
        value = os.path.expanduser(os.path.expandvars(value))
        if not value.startswith(("/", "~", "{")) and not _ENV_VARIABLE.search(value):
            value = str((config_dir / value).absolute())
        anchored[key] = value
    return anchored


def unset_path_variables(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(dotted path, `$VAR`) of each environment variable a `paths` value names that is not set here (after
    resolve_placeholders has expanded the set ones)."""
    paths = raw.get("paths")
    if not isinstance(paths, dict):
        return []
    return [(f"paths.{key}", match.group(0)) for key, value in paths.items() if isinstance(value, str)
            for match in _ENV_VARIABLE.finditer(value)]


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


def _fix_of(error: ErrorDetails, path: str, known: Sequence[str] = ()) -> str:
    """What to do about one validation error: a missing field is added, not respelled; an unknown key is renamed to
    the known one it is a slip of (`known`: the keys of its section), else removed."""
    if not path:
        return ""
    if error.get("type") == "extra_forbidden":
        return unknown_key(path.rsplit(".", 1)[-1], known)[1]
    if error.get("type") == BOOL_FOR_NUMBER:
        return "write the number: true/false is not read as 1/0 here"
    if error.get("type") == "missing":
        return f"add `{path.rsplit('.', 1)[-1]}` under `{path.rsplit('.', 1)[0]}`" if "." in path \
            else f"add `{path}` (`megapilot suite init` writes a complete config to start from)"
    message = str(error.get("msg", ""))
    if error.get("type") in _BOUND_ERRORS and message.startswith("Input should be "):
        return "give a value that is " + message.removeprefix("Input should be ")  # the bound, not a respelling
    if _CHOICES in message:
        return "use one of: " + message.split(_CHOICES, 1)[1]
    if VALIDATOR_FIX in message:
        return message.split(VALIDATOR_FIX, 1)[1]
    return "fix the value's type or spelling"


# pydantic's errors for a value out of its bounds: the fix is the bound itself.
_BOUND_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"})
_CHOICES = "; use one of: "  # how a validator lists the values it takes (the fix, not the problem)
VALIDATOR_FIX = "; fix: "  # how a validator that weighs one field against another says what to change


def _message(error: ErrorDetails, known: Sequence[str] = ()) -> str:
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ").split(_CHOICES, 1)[0]
    message = message.split(VALIDATOR_FIX, 1)[0]
    if error.get("type") == "extra_forbidden":
        return unknown_key(str(error["loc"][-1]) if error.get("loc") else "", known)[0]
    if "input" in error and error.get("type") != "missing" and "got " not in message \
            and _short_repr(error["input"]) not in message:  # a value the message names already is not said twice
        return f"{message} (got {_short_repr(error['input'])})"
    return message


def _short_repr(value: Any) -> str:
    """The offending value, cut short: a message names it, it does not reprint a huge one."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- unknown keys: a slip of a known key, or a key of another tool ----------------------------------------
BOOL_FOR_NUMBER = "bool_for_number"  # the error type of a true/false given where a number is required
_MAX_LISTED_KEYS = 12  # a fix lists a section's keys only while the list stays readable


def unknown_key(key: str, known: Sequence[str], aliases: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(message, fix) for a key its section does not have: the known key it is a slip of, else the keys there are."""
    near = near_key(key, known, aliases)
    if near is not None:
        return f"unknown key (did you mean {near}?)", f"rename it to {near}"
    listed = sorted(known)
    if listed and len(listed) <= _MAX_LISTED_KEYS:
        return "unknown key", "remove it, or use one of: " + ", ".join(listed)
    return "unknown key", "remove it (`megapilot suite init` writes a config with every key and its comment)"


def near_key(key: str, known: Iterable[str], aliases: Mapping[str, str] | None = None) -> str | None:
    """The known key `key` is a slip of: another name for it (`aliases`), the same key in another case or with
    `-` for `_`, or one within an edit or two (one for a short key, where two edits make any other word); None
    when it is nobody's, a key of another tool that is rightly kept (CVS files carry such keys)."""
    typed = _key_form(key)
    forms = {_key_form(name): name for name in known}
    named = {_key_form(alias): target for alias, target in (aliases or {}).items()}
    if typed in forms:
        return forms[typed]
    if typed in named:
        return named[typed]
    scored = sorted((edit_distance(typed, form), name) for form, name in forms.items())
    for distance, name in scored[:1]:
        if 0 < distance <= (1 if len(name) <= 6 else 2):
            return name
    return None


def _key_form(key: str) -> str:
    return key.strip().lower().replace("-", "_")


def edit_distance(a: str, b: str) -> int:
    """Edits (insert, delete, replace, or swap two neighbours: `paralellism`) that turn `a` into `b`."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def section_keys(model: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The keys of the section of `model` at `loc` (a validation error's location without its last part): what an
    unknown key there may have meant. Empty where `loc` leads to no section of fields."""
    node: Any = model
    for part in loc:
        fields = getattr(node, "model_fields", None)
        if not isinstance(part, str) or fields is None or part not in fields:
            return []
        node = _section_model(fields[part].annotation)
    return list(getattr(node, "model_fields", {}))


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, through Optional, unions and Annotated (`ContainerSpec | None` -> ContainerSpec)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType, Annotated):
        for arg in get_args(annotation):
            found = _section_model(arg)
            if found is not None:
                return found
    return None
