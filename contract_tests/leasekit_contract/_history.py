"""Checking a recorded history of who believed they held a key, and when.

Each worker records an :class:`Interval` for every stretch it was entitled to act as
the holder: from the return of the call that gave it the lease until the start of
the call that gave the lease up, and never past the start of the call that last set
the lease's TTL plus that (effective) TTL. Times are ``time.monotonic()``, one
system-wide clock on Linux, so intervals from different processes compare.

Mutual exclusion means no two intervals of different owners overlap. With fencing,
tokens order the leases: every interval of a smaller token ends before any interval
of a greater token starts.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

__all__ = ["Interval", "find_overlap", "find_token_disorder"]


class Interval(NamedTuple):
    """One stretch of time during which ``owner`` was entitled to believe it held the key."""

    owner: str
    start: float
    end: float
    token: int | None


def _describe(interval: Interval, origin: float) -> str:
    return (
        f"{interval.owner!r} from {(interval.start - origin) * 1000:.3f} ms "
        f"to {(interval.end - origin) * 1000:.3f} ms (token {interval.token})"
    )


def find_overlap(intervals: list[Interval]) -> str | None:
    """Describe the first overlap between two different owners' intervals, or ``None``.

    A sweep in start order keeps the latest-ending interval and the latest-ending one
    of any other owner: an interval overlaps an earlier one of a different owner
    exactly when it starts before the end of one of those two.
    """
    spans = sorted((i for i in intervals if i.end > i.start), key=lambda i: i.start)
    if not spans:
        return None
    origin = spans[0].start
    latest: Interval | None = None  # the interval with the greatest end so far
    runner_up: Interval | None = None  # greatest end among owners other than latest's
    for current in spans:
        for earlier in (latest, runner_up):
            if (
                earlier is not None
                and earlier.owner != current.owner
                and current.start < earlier.end
            ):
                return (
                    "two owners believed they held the key at the same time: "
                    f"{_describe(earlier, origin)} overlaps {_describe(current, origin)}"
                )
        if latest is None or current.end > latest.end:
            if latest is not None and latest.owner != current.owner:
                runner_up = latest
            latest = current
        elif current.owner != latest.owner and (runner_up is None or current.end > runner_up.end):
            runner_up = current
    return None


def find_token_disorder(intervals: list[Interval]) -> str | None:
    """Describe the first pair of leases whose fencing tokens disagree with time, or ``None``.

    Intervals sharing a token are one lease and must share an owner; every interval of
    a smaller token must end no later than any interval of a greater token starts.
    Empty intervals (the TTL ran out before the granting call returned) are ignored.
    """
    by_token: dict[int, list[Interval]] = defaultdict(list)
    for interval in intervals:
        if interval.token is not None and interval.end > interval.start:
            by_token[interval.token].append(interval)
    if not by_token:
        return None
    origin = min(i.start for group in by_token.values() for i in group)
    for token, group in by_token.items():
        owners = {i.owner for i in group}
        if len(owners) > 1:
            return f"fencing token {token} was given to several owners: {sorted(owners)}"
    previous: Interval | None = None  # the latest-ending interval of the smaller tokens
    for token in sorted(by_token):
        group = by_token[token]
        first = min(group, key=lambda i: i.start)
        if previous is not None and first.start < previous.end:
            return (
                "fencing tokens disagree with the order of the leases: "
                f"{_describe(previous, origin)} ends after {_describe(first, origin)} begins"
            )
        last = max(group, key=lambda i: i.end)
        if previous is None or last.end > previous.end:
            previous = last
    return None
