"""Training-log intelligence: a streaming parser for what training jobs print, and whatever else a failed job
left behind (a rank's stderr, dmesg, SLURM and torchrun summaries).

Dialects: Megatron-LM (and Megatron-LLM), Megatron-Bridge, Primus (Megatron and torchtitan backends), upstream
torchtitan, Megatron-DeepSpeed, GPT-NeoX, DeepSpeed, NeMo 1.x/2.x. Any text is read: lines without training
progress still run every error signature, and tracebacks are classified by their frames and final exception.

Public API:
- `parse_logs(paths, options=, summary_only=, on_record=) -> ParsedLog` (`-` = stdin)
- `expand_log_paths(arguments) -> list[str]` (directories, globs, text check; `megapilot.logs.sources`)
- `follow_log(path, ..., idle_timeout_s=, timeout_s=, should_stop=) -> ParsedLog` (one growing file, hang watch)
- `RunFollower(paths).poll()` (many growing files at once, O(new bytes); `megapilot.logs.follow`)
- `parse_text(text) -> ParsedLog`
- `LineParser(file, options).feed(line_no, text) -> tuple[Record, ...]` (one line at a time)
- records: `IterationRecord`, `MemoryRecord`, `TheoreticalMemoryRecord`, `TimerRecord`,
  `CheckpointEvent`, `CheckpointOp`, `ErrorRecord`, `ProgressMarker`, `Evidence`
- `SIGNATURES`, `CATEGORIES`, `match_line` (the error taxonomy), `RunSummary` (steady-state rule in
  `megapilot.logs.summary`), `ParsedLog.framework` (`megapilot.logs.framework`: which fixes fit).
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
    "CATEGORIES", "DIALECTS", "RULE_TEXT", "SIGNATURES", "ArgumentsRecord", "CheckpointEvent", "CheckpointOp",
    "ErrorRecord",
    "Evidence", "IterationRecord", "LineParser", "LogCollector", "MemoryRecord", "ParseOptions", "ParsedLog",
    "ProgressMarker", "RunSummary", "TheoreticalMemoryRecord", "TimerRecord", "follow_log", "match_line",
    "parse_logs", "parse_text",
]
