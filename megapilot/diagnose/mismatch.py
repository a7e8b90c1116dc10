"""Is the log the run the script describes? A log of another run is a finding of its own.

Megatron-LM prints its parsed arguments at start-up (`ParsedLog.arguments`), and every iteration line
its global batch size. When those say another world size, another TP/PP/VPP/CP/EP split, another
batch, sequence length or model shape than the script's flags, the log measured a different run:
its step time must not calibrate predictions for the script, and findings that pair the two
(throughput against the prediction, memory fixes for the script's layout) would mislead. Each
differing field is reported with the log line that shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from megapilot.diagnose.findings import Finding, Fix
from megapilot.diagnose.flags import RunConfig
from megapilot.logs import ParsedLog
from megapilot.logs.records import ArgumentsRecord, Evidence
from megapilot.vocabulary import field_value, term


@dataclass(frozen=True)
class LogMismatch:
    """One field on which the log and the script disagree."""

    field: str  # as a user names it: "world size", "TP", "global batch size"
    script_value: int
    log_value: int
    script_flag: str  # where the script says it
    evidence: Evidence

    def describe(self) -> str:
        return f"{self.field} {self.log_value} in the log, {self.script_value} in the script ({self.script_flag})"


@dataclass(frozen=True)
class _Check:
    field: str
    argument: str  # the name in Megatron's arguments block
    script_flag: str
    script_value: Callable[[RunConfig], int | None]


def _world(config: RunConfig) -> int | None:
    return None if config.world_size_assumed else config.world_size


def _gbs(config: RunConfig) -> int | None:
    given = config.flags.has("--global-batch-size")
    return config.training.global_batch_size if (given and config.training) else None


def _of_field(path: str) -> Callable[[RunConfig], int | None]:
    def value(config: RunConfig) -> int | None:
        found = field_value(config, path)  # every checked field is a whole number
        return found if isinstance(found, int) else None
    return value


def _of_flag(label: str, flag: str) -> _Check:
    """A field checked by its flag in the Megatron vocabulary: the log's argument is the flag's destination."""
    row = term(flag)
    assert row.field is not None, flag
    return _Check(label, row.dest, row.flag, _of_field(row.field))


_CHECKS: tuple[_Check, ...] = (
    _Check("world size", "world_size", "--nnodes x --nproc-per-node", _world),
    _of_flag("TP", "--tensor-model-parallel-size"),
    _of_flag("PP", "--pipeline-model-parallel-size"),
    # Megatron logs the virtual stage count under its own name, whichever of the two VPP flags set it
    _Check("VPP", "virtual_pipeline_model_parallel_size", "--num-layers-per-virtual-pipeline-stage",
           _of_field("parallel.vpp")),
    _of_flag("CP", "--context-parallel-size"),
    _of_flag("EP", "--expert-model-parallel-size"),
    _Check("global batch size", "global_batch_size", "--global-batch-size", _gbs),
    _of_flag("micro-batch size", "--micro-batch-size"),
    _of_flag("sequence length", "--seq-length"),
    _of_flag("layers", "--num-layers"),
    _of_flag("hidden size", "--hidden-size"),
)
# Megatron prints `None` for a VPP it did not set: one virtual stage.
_NONE_MEANS_ONE = frozenset({"virtual_pipeline_model_parallel_size"})


def log_mismatches(log: ParsedLog, config: RunConfig) -> list[LogMismatch]:
    """Every field on which the log's own record of its run differs from the script's flags."""
    found = list(_argument_mismatches(log.arguments, config)) if log.arguments is not None else []
    if not any(m.field == "global batch size" for m in found):
        found += _iteration_batch_mismatch(log, config)
    return found


def _argument_mismatches(arguments: ArgumentsRecord, config: RunConfig) -> Iterator[LogMismatch]:
    for check in _CHECKS:
        script = check.script_value(config)
        logged = _argument_int(arguments, check.argument)
        if script is None or logged is None or script == logged:
            continue
        yield LogMismatch(field=check.field, script_value=int(script), log_value=logged,
                          script_flag=check.script_flag, evidence=arguments.evidence(check.argument))


def _argument_int(arguments: ArgumentsRecord, name: str) -> int | None:
    text = arguments.values.get(name)
    if text is None or text == "None":
        return 1 if (text == "None" and name in _NONE_MEANS_ONE) else None
    try:
        return int(text)
    except ValueError:
        return None


def _iteration_batch_mismatch(log: ParsedLog, config: RunConfig) -> list[LogMismatch]:
    """The batch printed on the iteration lines (logs without an arguments block: Bridge, Primus, NeoX)."""
    script = _gbs(config)
    if script is None or config.flags.has("--rampup-batch-size"):  # a ramp prints smaller batches first
        return []
    for record in reversed(log.iterations):
        if record.gbs is not None:
            if record.gbs == script:
                return []
            evidence = Evidence(file=record.file, line=record.line, text=record.text)
            return [LogMismatch(field="global batch size", script_value=script, log_value=record.gbs,
                                script_flag="--global-batch-size", evidence=evidence)]
    return []


def mismatch_finding(mismatches: list[LogMismatch]) -> Finding | None:
    """One finding for all differing fields, each with its evidence line; None when the log matches."""
    if not mismatches:
        return None
    title = "The log is of another run than the script: " + "; ".join(m.describe() for m in mismatches)
    cause = ("The log's own record of its run (Megatron's arguments block, the iteration lines) differs from the "
             "script's flags, so it measured a different run: its step time calibrates nothing and the script's "
             "layout is not used to judge it (findings and fixes below come from the log alone).")
    fix = Fix(action="add", flag="pass the log this script's run wrote, or the script that wrote this log", value=None,
              reason="a log of another run cannot judge this launch", kind="advice")
    return Finding(category="log_mismatch", severity="error", title=title,
                   evidence=[m.evidence for m in mismatches], cause=cause, fixes=[fix])
