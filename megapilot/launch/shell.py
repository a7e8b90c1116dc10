"""Pieces shared by every rendered script: header, environment block, quoted bash arrays.

Every value that reaches the script goes through `shlex.quote`; nothing is pasted into a command
line unquoted, so paths with spaces or `$` stay literal.
"""

from __future__ import annotations

import shlex

from megapilot.launch.environment import EnvVar
from megapilot.launch.megatron_args import MEGATRON_RELEASE
from megapilot.launch.sections import ArgSection
from megapilot.spec import SavedPlan


def q(value: str) -> str:
    """shlex.quote, plus quotes around commas so shellcheck does not read a list as one array item."""
    quoted = shlex.quote(value)
    if quoted == value and "," in value:
        return f"'{value}'"
    return quoted


def header(plan: SavedPlan, nodes: int, what: str, *, release: str = MEGATRON_RELEASE, cpu: bool = False) -> list[str]:
    """Shebang and a comment that says what this draft launches and how it was derived."""
    p, c = plan.parallel, plan.cluster
    # A CPU launch's plan carries a stand-in GPU; the script says what really runs.
    per_node = f"{c.gpus_per_node} CPU ranks" if cpu else f"{c.gpus_per_node} {c.gpu.name}"
    return [
        "#!/usr/bin/env bash",
        f"# {what}: {plan.model.name} on {nodes} node(s) x {per_node}",
        f"# Layout {p.shell_block(plan.training.global_batch_size)}; precision {plan.training.precision}.",
        f"# Flags checked against Megatron-LM {release}. Drafted by megapilot: review, then run.",
    ]


def write_file(target: str, text: str, end: str) -> list[str]:
    """Shell lines that write `text` to the file `target` names (a quoted shell word, e.g. `"$CONFIG"`): its
    folder made, then a quoted heredoc ending at `end`, so nothing in the text is expanded."""
    if end in text:
        raise ValueError(f"file text contains the heredoc terminator {end}")
    return [f'mkdir -p "$(dirname {target})"', f"cat > {target} <<'{end}'", text.rstrip("\n"), end]


def strict_mode() -> list[str]:
    return ["set -euo pipefail", ""]


def env_block(env: list[EnvVar]) -> list[str]:
    lines = ["# ---- environment: each variable with the reason it is set"]
    for var in env:
        lines.append(f"# {var.why}")
        lines.append(f"unset {var.name}" if var.unset else f"export {var.name}={q(var.value)}")
    lines.append("")
    return lines


def bash_array(name: str, items: list[str], *, raw: frozenset[str] = frozenset()) -> list[str]:
    """`NAME=( ... )`, one flag (with its values) per line; `raw` items are already shell words."""
    lines = [f"{name}=("]
    line: list[str] = []
    for item in items:
        word = item if item in raw else q(item)
        if item.startswith("--") and line:
            lines.append("  " + " ".join(line))
            line = []
        line.append(word)
    if line:
        lines.append("  " + " ".join(line))
    lines.append(")")
    return lines


def megatron_args_array(sections: list[ArgSection]) -> list[str]:
    """MEGATRON_ARGS=( ... ) with one commented block per section."""
    lines = ["MEGATRON_ARGS=("]
    for section in sections:
        if not section.args:
            continue
        lines.append(f"  # {section.title}")
        lines.extend(bash_array("X", section.args)[1:-1])
    lines.append(")")
    return lines
