"""The stop signals as megapilot's main thread sees them: the first raises `Interrupted` (exit 128 + N), one that
comes while results are written is only recorded, and the handlers are put back afterwards."""

from __future__ import annotations

import os
import signal
import time

import pytest

from megapilot.execute.interrupt import Interrupted, finishing, received_signal, stop_on_signals


def _deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # the handler runs at the next bytecode boundary of the main thread


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_signal_raises_interrupted_with_the_shells_exit_code(signum: int, code: int) -> None:
    before = signal.getsignal(signum)
    with pytest.raises(Interrupted) as caught, stop_on_signals():
        _deliver(signum)
    assert caught.value.exit_code == code and isinstance(caught.value, KeyboardInterrupt)
    assert received_signal() == signum
    assert signal.getsignal(signum) == before


def test_a_signal_while_results_are_written_is_recorded_not_raised() -> None:
    with stop_on_signals():
        finishing()
        _deliver(signal.SIGTERM)
        assert received_signal() == signal.SIGTERM
