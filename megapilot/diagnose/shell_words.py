"""The words a bash launch script passes to its commands, read without running a shell.

Launch scripts hold their flags in several shapes: one long command continued with `\\`, variables
(`TP=8`, `export SEQ=4096`, `${TP:-2}`), and bash arrays spanning lines with comments inside
(`MEGATRON_ARGS=( ... )`, expanded as `"${MEGATRON_ARGS[@]}"`). `script_words(text)` lexes the
script as bash does for these cases — quotes, escapes, comments, continuations, arrays, here-documents —
and expands the variables it has seen assigned, so `"${ARR[@]}"` becomes one word per element and an
unquoted `$VAR` is split on whitespace. A `case "$VAR" in ... esac` runs the branch its known subject matches
(`MODEL_SCALE="800M"; case ... "800M") TP=1 ;; "8B") TP=4 ;; esac` reads TP=1); with an unknown subject every
branch is read, the last assignment winning. What cannot be known without running it (command
substitution, variables set elsewhere) stays as its literal text, e.g. `$NODE_RANK`.

`#SBATCH` lines set what sbatch would put in the job's environment (`SLURM_NNODES`, ...), so
`--nnodes "$SLURM_NNODES"` reads as the allocation's node count. Here-document bodies are kept (a
Primus launch writes its experiment YAML with one).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from megapilot.errors import MegapilotError

_NAME_RE = re.compile(r"[A-Za-z_]\w*")
_ASSIGNMENT_RE = re.compile(r"^([A-Za-z_]\w*)(\+?)=")
_DECLARATION_WORDS = frozenset({"export", "local", "declare", "readonly", "typeset"})
_SBATCH_RE = re.compile(r"^#SBATCH\s+(.*)$", re.MULTILINE)
# sbatch option -> the environment variables it sets in the job
_SBATCH_ENV = {"--nodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"), "-N": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
               "--ntasks-per-node": ("SLURM_NTASKS_PER_NODE",), "--gpus-per-node": ("SLURM_GPUS_PER_NODE",),
               "--ntasks": ("SLURM_NTASKS",), "-n": ("SLURM_NTASKS",), "--job-name": ("SLURM_JOB_NAME",),
               "-J": ("SLURM_JOB_NAME",)}


@dataclass(frozen=True)
class _Text:
    """Literal characters of a word."""

    text: str
    quoted: bool


@dataclass(frozen=True)
class _Reference:
    """A `$NAME` / `${NAME[@]:-default}` reference; `raw` is its source text, kept when it is unknown."""

    name: str
    raw: str
    quoted: bool
    all_elements: bool = False
    default: str | None = None


_Part = _Text | _Reference
_Word = list[_Part]
_OPEN, _CLOSE = "(", ")"  # array parentheses, as bare tokens
_PIPE = "|"  # ends a command piped into the next (or one alternative of a case pattern)


@dataclass
class ScriptWords:
    """The expanded words of every command (assignments excluded), in order, and what else was read."""

    words: list[str]
    variables: dict[str, list[str]]
    heredocs: list[str] = field(default_factory=list)
    sbatch: dict[str, str] = field(default_factory=dict)

    def scalar(self, name: str) -> str | None:
        values = self.variables.get(name)
        return values[0] if values else None


# ---- lexing ------------------------------------------------------------------------------------

class _Lexer:
    """Splits script text into commands of words, keeping quoting per part and here-document bodies."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.commands: list[list[_Word | str]] = []
        self.heredocs: list[str] = []
        self._pending_heredocs: list[tuple[str, bool]] = []

    def run(self) -> list[list[_Word | str]]:
        command: list[_Word | str] = []
        word: _Word | None = None
        depth = 0  # inside NAME=( ... ): newlines do not end the command
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            if ch == "\\" and text.startswith("\\\n", self.pos):
                self.pos += 2
                continue
            if ch in " \t\r" or (ch == "\n" and depth > 0):
                word = self._end_word(command, word)
                self.pos += 1
                if ch == "\n":
                    self._read_heredoc_bodies()
                continue
            if ch in "\n;&|":
                word = self._end_word(command, word)
                if ch == "|" and command:  # kept as a token: `a|b)` is one case pattern with two alternatives
                    command.append(_PIPE)
                if command:
                    self.commands.append(command)
                command = []
                self.pos += 1
                if ch == "\n":
                    self._read_heredoc_bodies()
                continue
            if ch == "#" and word is None:
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
                continue
            if (ch in "()" and word is None) or ch == _CLOSE:
                word = self._end_word(command, word)
                command.append(ch)
                depth = depth + 1 if ch == _OPEN else max(0, depth - 1)
                self.pos += 1
                continue
            if ch == _OPEN:  # NAME=( : the word so far is the assignment target
                word = self._end_word(command, word)
                command.append(_OPEN)
                depth += 1
                self.pos += 1
                continue
            if ch == "<" and text.startswith("<<<", self.pos):  # here-string: the next word is its input
                word = self._end_word(command, word)
                command.append([_Text("<<<", quoted=False)])
                self.pos += 3
                continue
            if ch == "<" and text.startswith("<<", self.pos):
                word = self._end_word(command, word)
                self._heredoc_operator()
                continue
            word = word if word is not None else []
            self._word_part(word)
        self._end_word(command, word)
        if command:
            self.commands.append(command)
        return self.commands

    @staticmethod
    def _end_word(command: list[_Word | str], word: _Word | None) -> None:
        if word is not None:
            command.append(word)
        return None

    def _word_part(self, word: _Word) -> None:
        text, ch = self.text, self.text[self.pos]
        if ch == "'":
            end = text.find("'", self.pos + 1)
            if end < 0:
                raise _unbalanced(text, self.pos)
            word.append(_Text(text[self.pos + 1:end], quoted=True))
            self.pos = end + 1
        elif ch == '"':
            self._double_quoted(word)
        elif ch == "\\":
            word.append(_Text(text[self.pos + 1:self.pos + 2], quoted=True))
            self.pos += 2
        elif ch == "$":
            word.append(self._dollar(quoted=False))
        elif ch == "`":
            end = text.find("`", self.pos + 1)
            end = len(text) - 1 if end < 0 else end
            word.append(_Text(text[self.pos:end + 1], quoted=True))
            self.pos = end + 1
        else:
            start = self.pos
            while self.pos < len(text) and text[self.pos] not in " \t\r\n;&|()<'\"\\$`":
                self.pos += 1
            if self.pos == start:  # a lone '<' or '>' redirection character
                self.pos += 1
            word.append(_Text(text[start:self.pos], quoted=False))

    def _double_quoted(self, word: _Word) -> None:
        text, opened_at = self.text, self.pos
        self.pos += 1
        literal: list[str] = []
        while True:
            if self.pos >= len(text):
                raise _unbalanced(text, opened_at)
            ch = text[self.pos]
            if ch == '"':
                self.pos += 1
                break
            if ch == "\\" and text[self.pos + 1:self.pos + 2] in ('"', "\\", "$", "`", "\n"):
                if text[self.pos + 1] != "\n":
                    literal.append(text[self.pos + 1])
                self.pos += 2
            elif ch == "$":
                word.append(_Text("".join(literal), quoted=True))
                literal = []
                word.append(self._dollar(quoted=True))
            else:
                literal.append(ch)
                self.pos += 1
        word.append(_Text("".join(literal), quoted=True))

    def _dollar(self, *, quoted: bool) -> _Part:
        text, start = self.text, self.pos
        if text.startswith("$(", start):  # command or arithmetic substitution: kept literally
            end = _matching_paren(text, start + 1)
            self.pos = end + 1
            return _Text(text[start:self.pos], quoted=True)
        if text.startswith("${", start):
            end = text.find("}", start)
            if end < 0:
                raise _unbalanced(text, start)
            self.pos = end + 1
            return _braced_reference(text[start:self.pos], quoted)
        found = _NAME_RE.match(text, start + 1)
        if found:
            self.pos = found.end()
            return _Reference(found.group(0), text[start:self.pos], quoted)
        self.pos = start + (2 if start + 1 < len(text) and text[start + 1] in "@*#?$!0123456789-" else 1)
        return _Text(text[start:self.pos], quoted=True)

    def _heredoc_operator(self) -> None:
        text = self.text
        self.pos += 2
        strip_tabs = text.startswith("-", self.pos)
        self.pos += 1 if strip_tabs else 0
        while self.pos < len(text) and text[self.pos] in " \t":
            self.pos += 1
        delimiter: _Word = []
        while self.pos < len(text) and text[self.pos] not in " \t\r\n;&|()<":
            self._word_part(delimiter)
        self._pending_heredocs.append(("".join(p.text if isinstance(p, _Text) else p.raw for p in delimiter),
                                       strip_tabs))

    def _read_heredoc_bodies(self) -> None:
        for delimiter, strip_tabs in self._pending_heredocs:
            body: list[str] = []
            while self.pos < len(self.text):
                end = self.text.find("\n", self.pos)
                end = len(self.text) if end < 0 else end
                line = self.text[self.pos:end]
                self.pos = end + 1
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
                body.append(line)
            self.heredocs.append("\n".join(body) + "\n")
        self._pending_heredocs = []


def _matching_paren(text: str, open_at: int) -> int:
    depth = 0
    for index in range(open_at, len(text)):
        if text[index] == "(":
            depth += 1
        elif text[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    raise _unbalanced(text, open_at)


def _braced_reference(raw: str, quoted: bool) -> _Part:
    found = re.fullmatch(r"\$\{([A-Za-z_]\w*|\d+)(\[[@*]\])?(?:(:?[-=])(.*))?\}", raw, re.DOTALL)
    if not found:  # ${#X}, ${X%%.*}, ${X:?message}, ...: not evaluated
        name = re.match(r"\$\{([A-Za-z_]\w*)", raw)
        return _Reference(name.group(1), raw, quoted) if name and ":?" in raw else _Text(raw, quoted=True)
    return _Reference(found.group(1), raw, quoted, all_elements=found.group(2) is not None,
                      default=_unquote(found.group(4)) if found.group(3) else None)


def _unquote(default: str) -> str:
    """The text of a `${X:-default}` default, its own quotes removed (`${1:-"a b"}` is `a b`)."""
    try:
        return " ".join(shlex.split(default))
    except ValueError:
        return default


def _unbalanced(text: str, position: int) -> MegapilotError:
    line_number = text.count("\n", 0, position) + 1
    lines = text.splitlines()
    line = lines[min(line_number, len(lines)) - 1] if lines else ""  # the position may be the text's end
    return MegapilotError(f"cannot split line {line_number} of the script into words (unbalanced quote, "
                          f"brace or parenthesis): {line.strip()[:80]}", field="script",
                          fix="balance the quotes on that line")


# ---- expansion ---------------------------------------------------------------------------------

def _expand(word: _Word, variables: dict[str, list[str]]) -> list[str]:
    """The fields a word expands to: quoted parts stay whole, unquoted expansions split on whitespace."""
    meaningful = [p for p in word if not (isinstance(p, _Text) and not p.text)]
    if len(meaningful) == 1 and isinstance(meaningful[0], _Reference) and meaningful[0].quoted \
            and meaningful[0].all_elements and meaningful[0].name in variables:
        return list(variables[meaningful[0].name])  # "${ARR[@]}": one word per element
    fields: list[list[Any]] = [["", False]]  # [text, kept even if empty]
    for part in word:
        if isinstance(part, _Text):
            fields[-1][0] += part.text
            fields[-1][1] = fields[-1][1] or part.quoted
            continue
        values = variables.get(part.name)
        if values is None:
            values = [part.default] if part.default is not None else [part.raw]
        elif not part.all_elements:
            values = values[:1]
        value = " ".join(values)
        if part.quoted:
            fields[-1][0] += value
            fields[-1][1] = True
            continue
        pieces = value.split()
        if not pieces:
            continue
        if value[0].isspace() and (fields[-1][0] or fields[-1][1]):
            fields.append(["", False])
        fields[-1][0] += pieces[0]
        fields.extend([piece, False] for piece in pieces[1:])
        if value[-1].isspace():
            fields.append(["", False])
    return [text for text, kept in fields if text or kept]


def _assignment(word: _Word) -> tuple[str, bool, _Word] | None:
    """(name, append, value parts) when the word is NAME=value or NAME+=value."""
    if not word or not isinstance(word[0], _Text) or word[0].quoted:
        return None
    found = _ASSIGNMENT_RE.match(word[0].text)
    if not found:
        return None
    rest = word[0].text[found.end():]
    head: _Word = [_Text(rest, quoted=False)] if rest else []
    value = head + list(word[1:])
    return found.group(1), bool(found.group(2)), value


def _sbatch_environment(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    options: dict[str, str] = {}
    for line in _SBATCH_RE.findall(text):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        index = 0
        while index < len(words):
            name, eq, value = words[index].partition("=")
            if not eq and index + 1 < len(words) and not words[index + 1].startswith("-"):
                value = words[index + 1]
                index += 1
            options[name] = value
            index += 1
    env: dict[str, list[str]] = {}
    for name, value in options.items():
        for variable in _SBATCH_ENV.get(name, ()):
            env[variable] = [value.split("-")[0] if variable == "SLURM_NNODES" else value]
    return options, env


@dataclass
class _Case:
    """A `case SUBJECT in ... esac` being read: its subject's value (None: unknown) and whether the branch being
    read runs. An unknown subject runs every branch (the last assignment wins, as before `case` was read)."""

    subject: str | None
    matched: bool = False
    active: bool = True
    alternatives: list[str] = field(default_factory=list)  # `a|` read before the `b)` that closes the pattern


def _case_step(command: list[_Word | str], cases: list[_Case],
               variables: dict[str, list[str]]) -> list[_Word | str] | None:
    """Follow `case` / `pattern)` / `esac` through the commands; the part of `command` left to run (None: none)."""
    head = _literal(command[0])
    if head == "case" and len(command) >= 2 and isinstance(command[1], list):
        subject = _expand(command[1], variables)
        known = len(subject) == 1 and "$" not in subject[0]
        running = all(case.active for case in cases)
        cases.append(_Case(subject[0] if known and running else None, active=running))
        rest = command[3:] if len(command) > 3 and _literal(command[2]) == "in" else []
        return _case_step(rest, cases, variables) if rest else None  # `case $X in a) ...` on one line
    if head == "esac" and cases:
        cases.pop()
        return None
    if not cases:
        return command
    case = cases[-1]
    if len(command) in (2, 3) and command[-1] == _PIPE and isinstance(command[-2], list) \
            and (len(command) == 2 or command[0] == _OPEN):
        case.alternatives.append(" ".join(_expand(command[-2], variables)))
        return None
    close = command.index(_CLOSE) if _CLOSE in command else -1
    if close in (1, 2) and all(isinstance(item, list) or item == _OPEN for item in command[:close]):
        patterns = case.alternatives + [" ".join(_expand(command[close - 1], variables))]  # type: ignore[arg-type]
        case.alternatives = []
        outer = all(c.active for c in cases[:-1])
        if case.subject is None:
            case.active = outer
        else:
            case.active = outer and not case.matched and any(
                fnmatch.fnmatchcase(case.subject, pattern) for pattern in patterns)
            case.matched = case.matched or case.active
        command = command[close + 1:]
    return command if command and case.active else None


def script_words(text: str) -> ScriptWords:
    """Lex and expand a bash script (see the module doc)."""
    sbatch, variables = _sbatch_environment(text)
    lexer = _Lexer(text)
    words: list[str] = []
    cases: list[_Case] = []
    for whole in lexer.run():
        command = _case_step(whole, cases, variables)
        if command is None:
            continue
        index = 0
        if _literal(command[0]) in _DECLARATION_WORDS:  # export A=1, declare -a ARR=(...)
            index = 1
            while index < len(command) and _literal(command[index]).startswith("-"):
                index += 1
        while index < len(command) and isinstance(command[index], list):
            word = command[index]
            target = _assignment(word)  # type: ignore[arg-type]  # a word: narrowed above
            if target is None:
                break
            name, append, value = target
            index += 1
            if not value and index < len(command) and command[index] == _OPEN:
                index, elements = _array_elements(command, index + 1, variables)
                variables[name] = (variables.get(name, []) if append else []) + elements
            else:
                expanded = " ".join(_expand(value, variables))
                previous = variables.get(name, [""])[0] if append else ""
                variables[name] = [previous + expanded]
        for item in command[index:]:
            if isinstance(item, list):
                words.extend(_expand(item, variables))
    return ScriptWords(words=words, variables=variables, heredocs=lexer.heredocs, sbatch=sbatch)


def _literal(item: object) -> str:
    """The text of an unquoted plain word ('' for anything else)."""
    if isinstance(item, list) and len(item) == 1 and isinstance(item[0], _Text) and not item[0].quoted:
        return item[0].text
    return ""


def _array_elements(command: list[_Word | str], index: int, variables: dict[str, list[str]]) -> tuple[int, list[str]]:
    elements: list[str] = []
    while index < len(command) and command[index] != _CLOSE:
        element = command[index]
        if isinstance(element, list):
            elements.extend(_expand(element, variables))
        index += 1
    return index + 1, elements
