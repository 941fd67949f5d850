"""leasekit.backend.SyncDeadlines: one watchdog thread bounding blocking calls."""

from __future__ import annotations

import threading

from faults import PATIENCE_S

from leasekit.backend import SyncDeadlines


def test_an_open_call_is_broken_at_its_deadline_and_a_closed_one_never() -> None:
    deadlines = SyncDeadlines(0.05)
    fired: list[str] = []
    broken = threading.Event()
    try:
        finished = deadlines.open(lambda: fired.append("finished"))
        assert deadlines.close(finished) is False  # done in time: never broken
        stalled = deadlines.open(lambda: (fired.append("stalled"), broken.set()))
        assert broken.wait(PATIENCE_S)
        assert deadlines.close(stalled) is True  # the caller raises a timeout
        assert fired == ["stalled"]
        # The watchdog sleeps while nothing is open, and wakes for the next call.
        again = threading.Event()
        deadlines.open(again.set)
        assert again.wait(PATIENCE_S)
    finally:
        deadlines.stop()
    assert not any(t.name == "leasekit-deadlines" and t.is_alive() for t in threading.enumerate())


def test_a_breaker_that_raises_does_not_stop_the_watchdog() -> None:
    deadlines = SyncDeadlines(0.01)
    later = threading.Event()

    def explode() -> None:
        raise OSError("socket already gone")

    try:
        deadlines.open(explode)
        deadlines.open(later.set)
        assert later.wait(PATIENCE_S)
    finally:
        deadlines.stop()
