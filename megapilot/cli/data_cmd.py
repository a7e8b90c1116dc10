"""`megapilot data prepare`: turn a `.jsonl`/`.txt` file into Megatron's indexed dataset.

The output (`PREFIX.bin` + `PREFIX.idx`) is what `--data-path PREFIX` reads, in megapilot's trainer
and in Megatron-LM alike. It is written with the standard library (`megapilot.data.indexed`), so the
command needs neither torch nor megatron-core and answers a small file in a fraction of a second;
an input of `PROGRESS_FROM_BYTES` or more shows a progress bar on stderr.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from megapilot.cli.common import console, emit_json
from megapilot.errors import MegapilotError

data_app = typer.Typer(help="Prepare training data (Megatron indexed datasets).", no_args_is_help=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


PROGRESS_FROM_BYTES = 64 * 1024 * 1024  # below this, the whole file takes about a second or less


def prepare(
    input_path: Annotated[Path, typer.Argument(metavar="INPUT", help="A .jsonl (one JSON object per line) or "
                                               ".txt file (documents separated by blank lines); .gz accepted.")],
    output_prefix: Annotated[str, typer.Option("--output-prefix", help="Absolute path prefix; writes "
                                               "PREFIX.bin and PREFIX.idx.")],
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="Tokenizer: byte (UTF-8 bytes + end-of-document; "
                                           "vocabulary 258).")] = "byte",
    json_key: Annotated[str, typer.Option("--json-key", help="Field of each .jsonl object that holds the "
                                          "text.")] = "text",
    force: Annotated[bool, typer.Option("--force", help="Replace a dataset already at --output-prefix (once the "
                                        "new one is whole).")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Tokenize INPUT into Megatron's indexed dataset format (for --data-path)."""
    if input_path.is_dir():
        raise MegapilotError(f"{input_path} is a directory", field="INPUT",
                             fix="pass one .jsonl or .txt file (run once per file, or concatenate them)")
    from megapilot.trainer.corpus import prepare_indexed_dataset

    with _progress_bar(input_path, json_output) as on_bytes:  # a failed read or write is named by the library
        prepared = prepare_indexed_dataset(input_path, output_prefix, tokenizer=tokenizer, json_key=json_key,
                                           on_bytes=on_bytes, force=force)
    payload = {
        "prefix": prepared.prefix, "bin_path": prepared.bin_path, "idx_path": prepared.idx_path,
        "documents": prepared.documents, "tokens": prepared.tokens, "tokenizer": prepared.tokenizer,
        "vocab_size": prepared.vocab_size,
    }
    if json_output:
        emit_json(payload)
        return
    from rich.table import Table

    table = Table(title=f"Indexed dataset written: --data-path {prepared.prefix}")
    table.add_column("documents", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("tokenizer")
    table.add_column("vocab", justify="right")
    table.add_column("files")
    table.add_row(f"{prepared.documents:,}", f"{prepared.tokens:,}", prepared.tokenizer, str(prepared.vocab_size),
                  f"{prepared.bin_path}\n{prepared.idx_path}")
    console.print(table)


@contextmanager
def _progress_bar(input_path: Path, quiet: bool) -> Iterator[Callable[[int], None] | None]:
    """A bar over the input's bytes (on stderr) for a large file; None (no bar) for a small one or a missing one."""
    size = input_path.stat().st_size if input_path.is_file() else 0
    if quiet or size < PROGRESS_FROM_BYTES:
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from megapilot.cli.common import err_console

    with Progress(TextColumn("tokenizing"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=err_console, transient=True) as progress:
        task = progress.add_task("tokenizing", total=size)
        yield lambda done: progress.update(task, completed=min(done, size))


def register(app: typer.Typer) -> None:
    """Add `megapilot data prepare`."""
    data_app.command("prepare")(prepare)
    app.add_typer(data_app, name="data")
