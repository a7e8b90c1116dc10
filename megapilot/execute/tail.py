"""Read a growing log file line by line, from where the last read stopped.

The executors let the job write its log straight to a file (no pipe through this process: the
log survives if megapilot dies, and SLURM/SSH jobs write theirs the same way) and follow it with a
`LogTail`. Only complete lines are returned while the job runs; `read_rest` adds the last partial
line once it has ended.
"""

from __future__ import annotations

from pathlib import Path

from megapilot.logs.lines import block_end

# A "line" longer than this is handed on before its newline: a progress bar that redraws one line with carriage
# returns is cut after its last complete update (`block_end`, the log readers' rule: each update is a record, and a
# cut inside one would hand on two fragments, "elapsed time per iteration (ms): 1" of a 123 ms step); bytes with
# neither (binary junk) are handed on whole.
_MAX_LINE_BYTES = 64 * 1024


class LogTail:
    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new_lines(self) -> list[str]:
        """Complete lines appended since the last call (decoded, newline stripped)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        end, continues = block_end(data, len(data), _MAX_LINE_BYTES)
        complete = data[:end].split(b"\n")
        if not continues:
            complete.pop()  # after the block's last newline: nothing (the unfinished line waits)
        self._partial = data[end:]
        if len(self._partial) > _MAX_LINE_BYTES:  # no `\r` to end a segment at (binary junk): handed on whole
            complete.append(self._partial)
            self._partial = b""
        return [line.decode("utf-8", errors="replace").rstrip("\r") for line in complete]

    def read_rest(self) -> list[str]:
        """Everything not yet returned, the final unterminated line included."""
        lines = self.read_new_lines()
        if self._partial:
            lines.append(self._partial.decode("utf-8", errors="replace").rstrip("\r"))
            self._partial = b""
        return lines
