"""Training-log intelligence: a streaming parser for Megatron-LM, Megatron-Bridge and Primus logs.

Public API:
- `parse_logs(paths, options=, summary_only=, on_record=) -> ParsedLog` (`-` = stdin)
- `follow_log(path, ..., idle_timeout_s=, timeout_s=, should_stop=) -> ParsedLog` (growing files)
- `parse_text(text) -> ParsedLog`
- `LineParser(file, options).feed(line_no, text) -> tuple[Record, ...]` (one line at a time)
- records: `IterationRecord`, `MemoryRecord`, `TheoreticalMemoryRecord`, `TimerRecord`,
  `CheckpointEvent`, `CheckpointOp`, `ErrorRecord`, `ProgressMarker`, `Evidence`
- `SIGNATURES`, `CATEGORIES`, `match_line` (the error taxonomy), `RunSummary` (steady-state rule in
  `megapilot.logs.summary`).
"""

from megapilot.logs.collect import (
    LogCollector,
    ParsedLog,
    follow_log,
    parse_logs,
    parse_text,
)
from megapilot.logs.parser import LineParser, ParseOptions
from megapilot.logs.records import (
    DIALECTS,
    ArgumentsRecord,
    CheckpointEvent,
    CheckpointOp,
    ErrorRecord,
    Evidence,
    IterationRecord,
    MemoryRecord,
    ProgressMarker,
    TheoreticalMemoryRecord,
    TimerRecord,
)
from megapilot.logs.signatures import CATEGORIES, SIGNATURES, match_line
from megapilot.logs.summary import RULE_TEXT, RunSummary

__all__ = [
    "CATEGORIES", "DIALECTS", "RULE_TEXT", "SIGNATURES", "ArgumentsRecord", "CheckpointEvent", "CheckpointOp", "ErrorRecord",
    "Evidence", "IterationRecord", "LineParser", "LogCollector", "MemoryRecord", "ParseOptions", "ParsedLog",
    "ProgressMarker", "RunSummary", "TheoreticalMemoryRecord", "TimerRecord", "follow_log", "match_line",
    "parse_logs", "parse_text",
]
