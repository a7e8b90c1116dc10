"""Shared CLI helpers: JSON output, the rich consoles, and user input checked at the edge."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleDimensions
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # types only: importing these at start-up would cost every command their load time
    from pathlib import Path

    from pydantic import ValidationError

    from megapilot.errors import MegapilotError
    from megapilot.spec import ClusterSpec, SavedPlan
    from megapilot.store.profile import Profile

# Off a terminal (a pipe, a file, a CI log) nothing measures the width, and rich's fallback of 80 columns
# cuts table cells to "A100…". Wide enough that no table of this CLI is cut; lines are not padded to it.
PIPED_WIDTH = 4000


class OutputConsole(Console):
    """A rich console whose output survives pipes.

    On a terminal it is rich's console. Piped or redirected it renders at `PIPED_WIDTH` columns so
    tables keep every character (`megapilot gpus | cat`, `| less`, CI logs), and, as rich does off a
    terminal, writes no colour codes. `COLUMNS` set by the user still wins.
    """

    @property
    def size(self) -> ConsoleDimensions:
        measured: ConsoleDimensions = Console.size.fget(self)  # type: ignore[attr-defined]  # the base property's getter
        if self.is_terminal or self._width is not None or os.environ.get("COLUMNS", "").isdigit():
            return measured
        return ConsoleDimensions(PIPED_WIDTH, measured.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]  # the base property's setter

    def print(self, *objects: Any, **kwargs: Any) -> None:  # the same call, tables made uncut
        super().print(*(self._uncut(renderable) for renderable in objects), **kwargs)

    def _uncut(self, renderable: Any) -> Any:
        """A table that fits folds its cells; one that cannot fit even folded becomes one block per row."""
        if not isinstance(renderable, Table):
            return renderable
        fold_instead_of_cut(renderable)
        # rich's own layout of the columns (private, stable since rich 10): wider than the terminal is cropped
        widths = renderable._calculate_column_widths(self, self.options)
        if sum(widths) + renderable._extra_width <= self.width:
            return renderable
        return as_records(renderable)

    def on_broken_pipe(self) -> None:
        """The reader of a pipe went away (`megapilot plan | head`): it had what it wanted, so stop quietly with
        exit code 0 (rich's own handler exits 1); stdout goes to /dev/null so the final flush cannot fail."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(0)


def fold_instead_of_cut(table: Table) -> None:
    """A table narrower than its text (an 80-column terminal) folds its cells onto more lines instead of cutting
    them to `A100…`; its first column (the names a user types: GPU aliases, model and template names) keeps its
    longest value whole."""
    for column in table.columns:
        column.overflow = "fold"
        column.no_wrap = False
    if table.columns:
        first = table.columns[0]
        widest = max((_plain_width(cell) for cell in first._cells), default=0)
        first.min_width = max(first.min_width or 0, widest)


def as_records(table: Table) -> Table:
    """The table as one block per row (`name` first, then `header  value` lines): what an 80-column terminal shows
    of a table too wide for it, every value whole."""
    headers = [" ".join(Text.from_markup(str(column.header)).plain.split()) for column in table.columns]
    records = Table(title=table.title, show_header=False, box=None, pad_edge=False)
    records.add_column(style="dim", overflow="fold")
    records.add_column(overflow="fold")
    for number, row in enumerate(zip(*(column._cells for column in table.columns), strict=True)):
        if number:
            records.add_row("", "")
        records.add_row(headers[0] or "name", row[0])
        for header, value in zip(headers[1:], row[1:], strict=True):
            records.add_row(header, value)
    return records


def _plain_width(cell: object) -> int:
    text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
    return max((len(line) for line in text.splitlines()), default=0)


# No emoji codes: log evidence is full of `host:pid:tid` (`node-3:1234:5678`), which rich would turn into emoji.
console = OutputConsole(emoji=False)
err_console = OutputConsole(stderr=True, emoji=False)


def _default(obj: object) -> object:
    model_dump = getattr(obj, "model_dump", None)  # pydantic models, without importing pydantic here
    if model_dump is not None:
        return model_dump(mode="json")
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


_PIECES_PER_WRITE = 1 << 16  # one write per this many encoded pieces: a bounded buffer, few system calls


def emit_json(payload: object) -> None:
    """Print machine output: one JSON document on stdout, nothing else."""
    # Written as it is encoded: `json.dumps` would first hold every piece of a large document (a few hundred MB
    # of log gives millions of records, ten times their size in pieces) and then the joined text beside them.
    pieces: list[str] = []
    for piece in json.JSONEncoder(default=_default, indent=2).iterencode(payload):
        pieces.append(piece)
        if len(pieces) == _PIECES_PER_WRITE:
            sys.stdout.write("".join(pieces))
            pieces.clear()
    sys.stdout.write("".join(pieces) + "\n")


def cluster_label(cluster: ClusterSpec) -> str:
    """'8 × H100', '16,384 × H100': the GPUs a figure is for, written one way by every command that heads its
    figures with them (thousands separated, as every other count in a table is)."""
    return f"{cluster.world_size:,} × {cluster.gpu.alias.upper()}"


def print_assumptions(assumptions: list[str]) -> None:
    """One line (on stderr, so piped stdout stays the answer) naming what the command assumed."""
    if assumptions:
        err_console.print(f"assumed: {'; '.join(assumptions)}", style="dim", highlight=False, soft_wrap=True)


# ---- user input checked at the edge ---------------------------------------------------------------
# Library code trusts its inputs' types; what only a user can get wrong (a count of zero, a directory
# where a file belongs, a binary file, a plan file from another version) is refused here, naming the flag.

def require_positive(flag: str, value: float | None) -> None:
    """Refuse a count or duration that is zero or negative (None = not given, fine)."""
    from megapilot.errors import MegapilotError

    if value is not None and not value > 0:  # `not > 0` also refuses NaN
        raise MegapilotError(f"must be positive, got {value}", field=flag, fix=f"pass {flag} with a value > 0")


def require_at_most(flag: str, value: float | None, limit: float, beyond: str) -> None:
    """Refuse a count past a bound far above any real run (`beyond` names the largest real one): a slip of digits,
    which would otherwise be written into a script or priced as asked."""
    from megapilot.errors import MegapilotError

    if value is not None and value > limit:
        raise MegapilotError(f"{value:,} is above {limit:,}, far beyond any real run ({beyond})", field=flag,
                             fix=f"pass {flag} with a value <= {limit:,}")


def read_text_file(path: str | Path, *, flag: str, what: str, fix: str) -> str:
    """Read a user-named file as UTF-8 text; a missing path, a directory, or binary content is one MegapilotError.
    A leading byte-order mark (some Windows editors write one) is dropped: JSON refuses it and it cannot be seen."""
    from pathlib import Path

    from megapilot.errors import MegapilotError

    location = Path(path)
    if location.is_dir():
        raise MegapilotError(f"{location} is a directory, not {what}", field=flag, fix=fix)
    try:
        return location.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise MegapilotError(f"no such file: {location}", field=flag, fix=fix) from None
    except OSError as exc:
        raise MegapilotError(f"cannot read {location} ({exc.strerror or exc})", field=flag, fix=fix) from None
    except UnicodeDecodeError as exc:
        raise MegapilotError(f"{location} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})",
                             field=flag, fix=fix) from None


def planned_model(path: str | Path, saved: SavedPlan) -> dict[str, str]:
    """The model a plan file fixes, in the shape of `ResolvedModel.to_dict` (every `--json` names its model)."""
    return {"name": saved.model.name, "requested": str(path), "source": "plan file"}


def load_plan_file(path: str | Path, *, flag: str = "--plan") -> SavedPlan:
    """A `megapilot plan --save` file as a SavedPlan, or one MegapilotError naming what is wrong with it."""
    import json

    from pydantic import ValidationError

    from megapilot.errors import MegapilotError, from_validation_error
    from megapilot.spec import SavedPlan, validate_layout
    from megapilot.spec.plan_file import PLAN_FILE_VERSION

    fix = "pass a file written by `megapilot plan ... --save plan.json`"
    text = read_text_file(path, flag=flag, what="a plan file", fix=fix)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MegapilotError(f"{path} is not JSON ({exc.msg}, line {exc.lineno})", field=flag, fix=fix) from None
    if not isinstance(raw, dict):
        raise MegapilotError(f"{path} holds a JSON {type(raw).__name__}, not a plan object", field=flag, fix=fix)
    version = raw.get("version", PLAN_FILE_VERSION)
    if version != PLAN_FILE_VERSION:
        raise MegapilotError(f"{path} is a version {version!r} plan file; this megapilot reads version "
                             f"{PLAN_FILE_VERSION}", field=flag,
                             fix="re-create it with this megapilot's `megapilot plan ... --save`")
    recreate = "re-create the file with `megapilot plan ... --save`"
    try:
        saved = SavedPlan.model_validate(raw)
    except ValidationError as exc:
        error = from_validation_error(exc, prefix="plan")
        raise MegapilotError(f"{path}: {error.field}: {error.problem}", field=flag,
                             fix=f"fix that field, or {recreate}") from None
    # Each part may be valid alone and the whole not (a layout for 48 GPUs in a plan for 16, a global batch its
    # DP cannot split): the rules `plan` saved it under, so a hand-edited file is refused here, naming the field.
    try:
        validate_layout(saved.model, saved.cluster, saved.training, saved.parallel, allow_tp_across_nodes=True)
    except MegapilotError as exc:
        raise MegapilotError(f"{path}: {exc.field}: {exc.problem}" if exc.field else f"{path}: {exc.problem}",
                             field=flag, fix=f"{exc.fix}; or {recreate}" if exc.fix else recreate) from None
    return saved


def load_profile_checked(path: str | Path | None) -> Profile:
    """The saved profile; a profile path that is a directory or binary is a MegapilotError, not a traceback."""
    from pathlib import Path

    from megapilot.errors import MegapilotError
    from megapilot.store.profile import load_profile

    fix = "pass a TOML file written by `megapilot profile set`, or leave --profile out"
    if path is not None and Path(path).is_dir():
        raise MegapilotError(f"{path} is a directory, not a profile file", field="--profile", fix=fix)
    try:
        return load_profile(path)
    except UnicodeDecodeError:
        raise MegapilotError(f"{path or 'the saved profile'} is not UTF-8 text", field="--profile", fix=fix) from None
    except OSError as exc:
        raise MegapilotError(f"cannot read the profile ({exc.strerror or exc})", field="--profile", fix=fix) from None


def validation_error(exc: ValidationError | ValueError, *, flags: dict[str, str], prefix: str = "",
                     fix: str | None = None) -> MegapilotError:
    """A pydantic ValidationError as a MegapilotError that names the command-line flag (not the model field)."""
    from megapilot.errors import MegapilotError, from_validation_error

    error = from_validation_error(exc, prefix=prefix)
    flag = flags.get(error.field or "", error.field)
    return MegapilotError(error.problem, field=flag, fix=fix or (f"pass a valid {flag}" if flag else None))
