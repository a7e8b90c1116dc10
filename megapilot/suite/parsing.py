"""Reading a suite's JSON or YAML with bounds, so no file can crash or stall megapilot.

A config is a few KiB; a hostile or broken one can be deep (100,000 nested brackets: a RecursionError in any
parser), huge, or a YAML alias bomb (nine anchors of nine aliases each: a billion strings once expanded, which
every walk over the tree would expand). Each is refused here, fast, with one line saying which bound it broke:
at most MAX_BYTES of text, MAX_DEPTH levels of nesting, MAX_NODES values once aliases are expanded. Numbers
that are not finite (NaN, Infinity, .inf) are refused too: no gate, timeout or factor can be one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

MAX_BYTES = 4 << 20
MAX_DEPTH = 64
MAX_NODES = 200_000
_BRACKETS = re.compile(r"[\[\]{}]")


class ParseLimitError(ValueError):
    """The text breaks a bound (size, depth, expanded size) or holds a non-finite number (at `path`)."""

    def __init__(self, message: str, path: str = ""):
        self.path = path
        super().__init__(message)


def parse_json(text: str, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None, *,
               duplicates: list[str] | None = None) -> Any:
    """JSON within the bounds; NaN and Infinity refused. With `duplicates`, each key an object gives twice is
    appended to it (the last one given is the one that would count)."""
    _check_text(text)
    text = text.removeprefix("\ufeff")  # a byte-order mark, as Windows editors save UTF-8
    if duplicates is not None and object_pairs_hook is None:
        object_pairs_hook = _noting_duplicates(duplicates)
    try:
        data = json.loads(text, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise ParseLimitError(f"nested more than {MAX_DEPTH} levels deep") from None
    check_tree(data)
    return data


def json_hint(exc: Exception) -> str:
    """What JSON's own words leave out, where it stopped at something a person writes in a config: a comma before a
    closing brace or bracket (some CVS threshold files have one), or a comment."""
    if not isinstance(exc, json.JSONDecodeError):
        return ""
    before = exc.doc[:exc.pos].rstrip()
    if before.endswith(",") and exc.doc[exc.pos:exc.pos + 1] in "}]":
        line = exc.doc.count("\n", 0, len(before) - 1) + 1
        return f": the comma ending line {line} comes before a closing bracket, which JSON does not allow"
    if exc.pos == 0 and exc.doc.startswith("#!"):
        return ": it starts with #!, a script, not a config (a launch script runs with `megapilot run SCRIPT`)"
    if exc.doc.startswith(("//", "/*", "#"), exc.pos):
        return (f": a comment at line {exc.lineno}, which JSON does not allow; write it as a \"_comment\" key "
                "(keys starting with _ are skipped)")
    return ""


def _noting_duplicates(duplicates: list[str]) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    return pairs


def parse_yaml(text: str, *, duplicates: list[str] | None = None) -> Any:
    """YAML (safe subset) within the bounds; aliases are allowed while the expanded document stays small. With
    `duplicates`, each key a mapping gives twice is appended to it, as parse_json does (a `<<` merge is no
    duplicate: the keys written beside it are meant to override it)."""
    import yaml  # start-up: 18 ms to import, paid only when a config is YAML

    _check_text(text)

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            if duplicates is not None:
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                        continue
                    key = self.construct_object(key_node)
                    if key in seen:
                        duplicates.append(str(key))
                    seen.add(key)
            mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
            return mapping

    try:
        data = yaml.load(text, Loader=Loader)  # a SafeLoader: only the safe tags construct
    except RecursionError:
        raise ParseLimitError(f"nested more than {MAX_DEPTH} levels deep") from None
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None
    check_tree(data)
    return data


def _check_text(text: str) -> None:
    size = len(text.encode("utf-8", "replace"))
    if size > MAX_BYTES:
        raise ParseLimitError(f"{size / 2**20:.1f} MiB of text; a suite file is at most {MAX_BYTES >> 20} MiB")
    depth = deepest = 0
    for match in _BRACKETS.finditer(text):  # brackets inside strings count too: harmless for a real config
        depth += 1 if match.group() in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > MAX_DEPTH:
                raise ParseLimitError(f"nested more than {MAX_DEPTH} levels deep")


def check_tree(data: Any) -> None:
    """Depth, expanded size (a value reached through N aliases counts N times) and finite numbers, walked
    without recursion and each shared value measured once."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, int, bool, str]] = [(data, 1, False, "")]
    while stack:
        node, depth, children_done, path = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise ParseLimitError(f"{node} is not a value a setting can take; write a finite number", path)
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise ParseLimitError(f"nested more than {MAX_DEPTH} levels deep", path)
        children = _children(node, path)
        if children_done:
            total = 1 + sum(sizes.get(id(child), 1) for child, _ in children)
            if total > MAX_NODES:
                raise ParseLimitError(f"more than {MAX_NODES:,} values once its aliases are expanded (an alias "
                                      "bomb?); write the values out, or use fewer aliases", path)
            sizes[id(node)] = total
            continue
        if id(node) in sizes:
            continue
        stack.append((node, depth, True, path))
        stack.extend((child, depth + 1, False, where) for child, where in children if id(child) not in sizes)


def _children(node: dict[Any, Any] | list[Any], path: str) -> list[tuple[Any, str]]:
    if isinstance(node, dict):
        return [(value, f"{path}.{key}" if path else str(key)) for key, value in node.items()]
    return [(value, f"{path}[{index}]") for index, value in enumerate(node)]


__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "ParseLimitError", "check_tree", "json_hint", "parse_json",
           "parse_yaml"]
