"""One to three real invocations per command, shown at the end of its `--help`.

Kept in one table so that every command gets them (including commands registered by other modules)
and so that a test can parse each example against the command it belongs to: an example that names
a flag the command no longer has fails the tests instead of misleading a reader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

EXAMPLES: dict[str, tuple[str, ...]] = {
    "gpus": (
        "megapilot gpus",
        "megapilot gpus --json",
        "megapilot gpus --measure-host",
    ),
    "models": (
        "megapilot models",
        "megapilot models llama3.1-405b",
        "megapilot models meta-llama/Llama-3.1-8B --json",
    ),
    "estimate": (
        "megapilot estimate --model llama3.1-70b --gpu h100 --gpus 64 --tp 8 --pp 4 --gbs 1024 --seq-len 4096",
        # experts spread over 8 nodes: the DeepEP dispatcher and the all-to-all overlap, as such layouts run
        ("megapilot estimate --model deepseek-v3 --gpu h100 --gpus 1024 --tp 2 --pp 8 --vpp 4 --ep 64 --etp 1 \\\n"
         "    --pp-layout 'Et|(tt|)*30mL' --gbs 8192 --seq-len 4096 --precision fp8 \\\n"
         "    --moe-flex-dispatcher deepep --moe-a2a-overlap --json"),
        "megapilot estimate --batch cases.jsonl --json",
    ),
    "plan": (
        "megapilot plan --model llama3.1-70b --gpu h100 --gpus 64",
        "megapilot plan --model deepseek-v3 --gpu h100 --gpus 2048 --seq-len 4096 --gbs 15360 --save plan.json",
        "megapilot plan --model tiny --gpu h100 --gpus 2 --seq-len 128 --gbs 16 --tp 1 --json",
    ),
    "script": (
        ("megapilot script --plan plan.json --launcher slurm --megatron-path /opt/Megatron-LM \\\n"
         "    --data-path /data/corpus_text_document --tokenizer-model /models/tokenizer.model -o train.sbatch"),
        ("megapilot script --model llama3.1-8b --gpu h100 --gpus 8 --tp 2 --gbs 128 --seq-len 8192 --mock-data "
         "--entrypoint megapilot"),
        "megapilot script --plan plan.json --cpu --entrypoint megapilot --mock-data -o train.sh",
    ),
    "diagnose": (
        "megapilot diagnose training.log",
        "megapilot diagnose training.log --script train.sh --gpu h100",
        "megapilot diagnose out-node0/training.log out-node1/training.log --json",
    ),
    "optimize": (
        "megapilot optimize --script train.sh --log training.log --gpu h100",
        "megapilot optimize --script train.sh --gpu mi300x --json",
    ),
    "run": (
        "megapilot run train.sh",
        "megapilot run train.sh --run-dir runs --combo first --json",
        "megapilot run --plan plan.json --train-iters 20",
    ),
    "profile set": (
        "megapilot profile set --gpu h100 --gpus 64 --gpus-per-node 8",
        "megapilot profile set --data-path /data/corpus_text_document --tokenizer /models/tokenizer.model",
    ),
    "profile show": (
        "megapilot profile show",
        "megapilot profile show --json",
    ),
    "logs parse": (
        "megapilot logs parse training.log",
        "megapilot logs parse training.log --json",
        "megapilot logs parse training.log --summary-only --seq-length 8192 --world-size 64",
    ),
    "suite check": (
        "megapilot suite check suite.json",
        "megapilot suite check cvs_config.json --cluster cluster.json --json",
    ),
    "suite templates": (
        "megapilot suite templates",
        "megapilot suite templates --json",
    ),
    "suite init": (
        "megapilot suite init tiny-local -o suite.json",
        "megapilot suite init tiny-local -o suite.json --force",
        "megapilot suite init tiny-local -o suite.json --gates predicted",
    ),
    "suite run": (
        "megapilot suite run suite.json",
        "megapilot suite run suite.json --dry-run --json",
        "megapilot suite run cvs_config.json --cluster cluster.json --out runs/suite",
    ),
    "suite report": (
        "megapilot suite report runs/suite/RUN_ID",
        "megapilot suite report runs/suite/RUN_ID --json",
    ),
    "history list": (
        "megapilot history list",
        "megapilot history list --limit 5 --model llama3.1-70b --json",
    ),
    "history show": (
        "megapilot history show RUN_ID",
        "megapilot history show RUN_ID --json",
    ),
    "history compare": (
        "megapilot history compare RUN_A RUN_B",
        "megapilot history compare RUN_A RUN_B --json",
    ),
    "history calibration": (
        "megapilot history calibration",
        "megapilot history calibration --json",
        "megapilot history calibration --cluster my-h100-cluster --json",
    ),
    "history import": (
        "megapilot history import runs.jsonl --cluster my-h100-cluster",
        "megapilot history import megatron_run_deck.json --cluster mi300x-lab --seq-len 8192 --json",
    ),
    "history record": (
        "megapilot history record runs/suite/20261205-031500-ab12",
        "megapilot history record runs/suite/20261205-031500-ab12 --db postgresql://megapilot@db/history",
    ),
    "history salvage": (
        "megapilot history salvage ~/.local/share/megapilot/history.sqlite",
        "megapilot history salvage history.sqlite --output history-salvaged.sqlite --json",
    ),
    "data prepare": (
        "megapilot data prepare docs.jsonl --output-prefix /data/mydocs",
        "megapilot data prepare book.txt.gz --output-prefix /data/book --json",
        "megapilot data prepare corpus.jsonl --output-prefix /data/corpus --json-key content",
    ),
}


# A group's help (`megapilot --help`, `megapilot suite --help`) shows the first example of some of its commands
# (checked with them by the tests): "" is the top level.
GROUP_EXAMPLES: dict[str, tuple[str, ...]] = {
    "": ("plan", "diagnose", "suite run"),
    "suite": ("suite templates", "suite init", "suite run"),
    "history": ("history list", "history show", "history compare"),
}


def group_epilog(group: str) -> str:
    """The examples shown on a group's help page, as `epilog` writes them."""
    lines = ["  " + line.replace("[", r"\[") for path in GROUP_EXAMPLES[group]
             for line in EXAMPLES[path][0].splitlines()]
    return "\n".join(["", "Examples:", *lines])


def epilog(command: str) -> str:
    """The examples of `command` (its path below `megapilot`, e.g. "suite run") as a help epilog, each line of a
    multi-line example (a `\\` continuation) indented as written.

    typer's rich help passes an epilog through `inspect.cleandoc`, which strips the first line and takes from
    every later line the indentation they all share, and then reads it as rich markup. So the epilog starts
    with an empty line (which cleandoc drops) to put the unindented heading among the later lines, leaving
    nothing shared to strip, and `[` in an example is escaped to print as typed (only `[` opens markup; rich's
    own `escape` would also double the line-ending `\\` of a continuation).
    """
    lines = ["  " + line.replace("[", r"\[") for example in EXAMPLES[command] for line in example.splitlines()]
    return "\n".join(["", "Examples:", *lines])


def add_examples(app: typer.Typer, prefix: str = "") -> None:
    """Give every command of `app` (and of its sub-apps) its examples, unless it has an epilog already."""
    for command in app.registered_commands:
        path = f"{prefix}{command.name}"
        if command.epilog is None and path in EXAMPLES:
            command.epilog = epilog(path)
    if prefix == "":
        app.info.epilog = group_epilog("")
    for group in app.registered_groups:
        path = f"{prefix}{group.name}"
        if path in GROUP_EXAMPLES and group.typer_instance is not None:
            group.typer_instance.info.epilog = group_epilog(path)
            group.epilog = group_epilog(path)
        if group.typer_instance is not None:
            add_examples(group.typer_instance, f"{path} ")
