"""Starting a CLI process that a test interrupts the way a user at a terminal does."""

from __future__ import annotations

import signal


def interruptible() -> None:
    """`preexec_fn` for a child a test sends SIGINT: a shell starts background jobs with SIGINT ignored, and
    Python keeps an ignored SIGINT ignored, so under `make test &` the child would never see Ctrl-C. Give it the
    default disposition, as an interactive terminal does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
