"""Watch a running job's node logs for fatal error signatures, so a combo fails early with evidence.

CVS `cat`s the whole last-node log over SSH twice per 120 s poll and only matches four case-sensitive
patterns. Here every node's log is read incrementally (only the bytes written since the last poll),
each new line is matched against megapilot's signature taxonomy (`megapilot.logs.signatures`), and the
first line of a fatal category stops the job: an OOM or an NCCL timeout never recovers, and waiting
for the hang watchdog would only waste the cluster's time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from megapilot.diagnose.findings import EXPLANATIONS, Finding
from megapilot.logs.parser import GLOG_WARNING_RE, WORKERS_DONE_RE
from megapilot.logs.records import Evidence
from megapilot.logs.signatures import match_line

# Categories after which a training job cannot finish well. process_crash is left to the executor
# (it sees the exit code and names the rank); config_error ends the job by itself within seconds.
FATAL_CATEGORIES = frozenset({"oom", "nccl_timeout", "nccl_error", "gpu_hw_fault", "shm_insufficient",
                              "rendezvous_failure", "checkpoint_save_failure", "checkpoint_load_failure"})
MAX_LINE_CHARS = 2000  # evidence is for people; a megabyte-long line is cut
MAX_READ_BYTES = 8 * 1024 * 1024  # per file per poll: a flood of output is read over several polls


@dataclass
class _FileCursor:
    offset: int = 0
    line_no: int = 0
    partial: bytes = b""
    node_done: bool = False


@dataclass
class FatalWatch:
    """Reads new lines of each node log at every `scan` and returns the first fatal finding."""

    cursors: dict[Path, _FileCursor] = field(default_factory=dict)

    def scan(self, node_logs: list[Path]) -> Finding | None:
        for node, path in enumerate(node_logs):
            finding = self._scan_file(node, path)
            if finding is not None:
                return finding
        return None

    def _scan_file(self, node: int, path: Path) -> Finding | None:
        cursor = self.cursors.setdefault(path, _FileCursor())
        try:
            size = path.stat().st_size
        except OSError:
            return None
        if size < cursor.offset:  # truncated or replaced: start over
            self.cursors[path] = cursor = _FileCursor()
        if size == cursor.offset or cursor.node_done:
            return None
        with path.open("rb") as handle:
            handle.seek(cursor.offset)
            data = handle.read(min(size - cursor.offset, MAX_READ_BYTES))
        cursor.offset += len(data)
        lines = (cursor.partial + data).split(b"\n")
        cursor.partial = lines.pop()
        for raw in lines:
            cursor.line_no += 1
            text = raw.decode("utf-8", "replace").rstrip("\r")
            if WORKERS_DONE_RE.search(text):  # past it, the job's exit code judges, not this watch
                cursor.node_done = True
                return None
            # a c10d warning (a store retried at start-up, a store gone at a node's end) is not the failure: if the
            # job fails, its exit or the hang watchdog says so (the log analysis afterwards reads warnings the same
            # way for rendezvous failures, `LineParser._error`)
            signature = None if GLOG_WARNING_RE.match(text) else match_line(text)
            if signature is not None and signature.category in FATAL_CATEGORIES:
                evidence = Evidence(file=str(path), line=cursor.line_no, text=text[:MAX_LINE_CHARS])
                return Finding(category=signature.category, severity="critical",
                               title=f"{signature.category} ({path.name} line {cursor.line_no}): "
                                     f"{text.strip()[:300]}",
                               evidence=[evidence], cause=EXPLANATIONS[signature.category], node=node)
        return None


__all__ = ["FATAL_CATEGORIES", "FatalWatch"]
