"""Types of the compiled scanner (megapilot/logs/_scan.c), the compiled engine of megapilot.logs.bulk."""

from megapilot.logs.summary import SummaryBuilder

STOP_END: int
STOP_LINE: int
STOP_FALLBACK: int
TIME_PREFIX: int
TIME_LINE: int
INERT_NEVER: int
INERT_ALWAYS: int
INERT_BEFORE_SUFFIX: int
INERT_UNLESS_ITERATION: int
INERT_IN_CHATTER: int

def use_vectors(flag: bool, /) -> bool: ...

class Scanner:
    def __init__(self, needles: tuple[tuple[bytes, int, bytes], ...], keys: tuple[bytes, ...], reservoir_size: int,
                 warmup_cap: int) -> None: ...
    def scan(self, block: bytes | bytearray, start: int, end: int, summary: SummaryBuilder,
             shape: tuple[int, int, int] | None, awaits_step_line: bool,
             rows_out: list[tuple[int, int, int, int, int, float | None, int, int, float | None, int]] | None = None,
             /,
             ) -> tuple[int, int, int, int, int]: ...
    def pop_time(self) -> tuple[int, int, int] | None: ...
    def pop_counted(self) -> tuple[int, int] | None: ...
