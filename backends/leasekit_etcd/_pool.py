"""The etcd leases a provider granted, and the idle ones it may bind again.

Granting an etcd lease is a round trip (and a raft write) before the transaction that
binds it. A lease that a release, a transfer or a denied acquire leaves without a
record is not revoked but kept, so that the next acquire of *this* provider binds it
in its one transaction. That is only correct within limits, which this class keeps:

- **Exclusive.** An idle lease is taken out before it is bound, so it carries at most
  one record at any time, as a freshly granted one does; revoking it, or letting it
  expire, can only ever end that one record.
- **Never shorter than asked, and little longer.** A lease's time runs from its grant
  (or its last keep-alive), not from when it is bound. For TTLs of
  ``REUSE_MIN_TTL_S`` and more (so that the extra second is at most a tenth of the
  TTL), leases are granted one second longer than the TTL asked for, and one is bound
  again only while it still has the whole TTL
  ahead of it, counted from a lower bound of its expiry: the moment its grant (or
  keep-alive) was *sent*, plus the TTL etcd granted, less a guard for clock-rate drift
  and the binding transaction's flight. A record bound that way outlives the
  holder's own reckoning (from when the acquire was sent), as a fresh lease does.
- **Only our own.** Only leases this provider granted are tracked, so a lease another
  process granted (met as a record's previous lease) is revoked, never bound here.
  The tracking is a hint: a lease forgotten (pruned, or revoked meanwhile by someone
  else) is revoked instead of kept, or fails its binding with "lease not found", which
  the acquire answers by granting a fresh one.
- **Idle only while it can be bound.** An idle lease is revoked as soon as it can no
  longer be bound (about ``REUSE_EXTRA_S - BIND_GUARD_S`` after its grant or last
  keep-alive), by a timer, not when the next acquire happens to look at it: a lease
  that can never carry a record again is not kept, so the provider never holds more
  idle leases than it left empty in the last second, and an ``aclose`` that cannot
  reach the server (frozen) abandons only those few revocations; each of those
  leases then ends on its own at its granted TTL.

An idle lease found too old to bind is revoked then too; ``flush()`` and ``aclose()``
revoke whatever is idle.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

__all__ = [
    "BIND_GUARD_S",
    "REUSE_EXTRA_S",
    "REUSE_MIN_TTL_S",
    "Bindings",
    "CallAt",
    "LeasePool",
    "Timer",
]

#: Seconds added to each grant: the window in which an idle lease can be bound again.
REUSE_EXTRA_S = 1
#: The shortest TTL (whole seconds) whose etcd leases are reused: shorter ones are
#: granted exactly (rounded up), since a second more would be over a tenth of them.
REUSE_MIN_TTL_S = 10
#: Kept in hand beyond the TTL when binding an idle lease: clock-rate drift over the
#: lease's life and the binding transaction's time in flight.
BIND_GUARD_S = 0.1
_PRUNE_EVERY = 1024
_PRUNE_AFTER_S = 60.0
#: How many records' etcd leases :class:`Bindings` remembers, the oldest forgotten first.
BINDINGS_KEPT = 65536


class Timer(Protocol):
    """A callback due at some time, as a driver's :data:`CallAt` schedules it."""

    def cancel(self) -> None:
        """Never run it."""

    def pending(self) -> bool:
        """Whether it will still run (not run, not cancelled, its runner still there)."""


CallAt = Callable[[float, Callable[[], None]], Timer]
"""``call_at(when, callback)``: run ``callback`` at ``when`` on the pool's clock, once.

The asyncio provider's runs it on its event loop (``loop.call_at``), the blocking
provider's on its background thread (``_blocking.Revoker``).
"""


class LeasePool:
    """This provider's etcd leases: when each surely lives until, and which are idle.

    Written for both drivers: the clock (``now``) and the timers (``call_at``) are the
    driver's, and every method holds one lock, so threads may share a pool (the
    blocking provider's callers, and its timer thread).
    """

    __slots__ = (
        "_call_at",
        "_enabled",
        "_expires_by",
        "_granted_s",
        "_grants",
        "_idle",
        "_idle_of",
        "_lock",
        "_now",
        "_revoke",
        "_timers",
    )

    def __init__(
        self,
        revoke: Callable[[int], None],
        *,
        now: Callable[[], float],
        call_at: CallAt,
        enabled: bool = True,
    ) -> None:
        #: revokes an etcd lease in the background (and forgets it here)
        self._revoke = revoke
        #: the clock every time here is on, and how to run a callback at one of them
        self._now = now
        self._call_at = call_at
        #: False (``reuse_leases=false``): nothing is kept, every empty lease revoked
        self._enabled = enabled
        # Reentrant: revoking forgets the lease here (``Context.revoke``).
        self._lock = threading.RLock()
        # lease ID -> clock time before which etcd cannot have ended it (a lower bound)
        self._expires_by: dict[int, float] = {}
        # lease ID -> the TTL etcd granted it (what a keep-alive restores)
        self._granted_s: dict[int, int] = {}
        # granted TTL -> idle lease IDs, the most recently idle last
        self._idle: dict[int, list[int]] = {}
        # idle lease ID -> its granted TTL (which stack it is on)
        self._idle_of: dict[int, int] = {}
        # lease ID -> the timer that revokes it if it is idle when its window closes;
        # left pending when the lease is bound again (it then finds it not idle)
        self._timers: dict[int, Timer] = {}
        self._grants = 0

    def __len__(self) -> int:
        with self._lock:
            return sum(len(stack) for stack in self._idle.values())

    def extra_s(self, ttl_s: int) -> int:
        """Seconds to grant beyond ``ttl_s``: 1 if its etcd leases are reused, else 0."""
        return REUSE_EXTRA_S if self._enabled and ttl_s >= REUSE_MIN_TTL_S else 0

    def granted(self, lease: int, granted_s: int, sent_at: float) -> None:
        """A grant (sent at clock time ``sent_at``) gave ``lease`` of ``granted_s``, to
        be kept for reuse once it is left empty."""
        with self._lock:
            self._expires_by[lease] = sent_at + granted_s
            self._granted_s[lease] = granted_s
            self._grants += 1
            if self._grants % _PRUNE_EVERY == 0:
                self._prune(sent_at)

    def kept_alive(self, lease: int, granted_s: int, sent_at: float) -> None:
        """A keep-alive sent at ``sent_at`` restored ``lease``'s TTL."""
        with self._lock:
            if lease in self._expires_by:
                self._expires_by[lease] = sent_at + granted_s

    def take(self, granted_s: int, need_s: float, now: float) -> int | None:
        """An idle lease of ``granted_s`` that surely lives ``need_s`` more, taken out."""
        with self._lock:
            stack = self._idle.get(granted_s)
            while stack:
                lease = stack.pop()
                del self._idle_of[lease]
                expires_by = self._expires_by.get(lease)
                if expires_by is not None and expires_by - now >= need_s + BIND_GUARD_S:
                    return lease
                self._revoke(lease)  # too old to bind; it carries nothing
            return None

    def give_back(self, lease: int, now: float) -> bool:
        """``lease`` was just left without a record (at clock time ``now``); False if it
        is not ours to keep, or can no longer be bound (the caller revokes it then).

        A kept lease is revoked by a timer once it can no longer be bound: when less
        than the TTL it serves (its granted TTL less ``REUSE_EXTRA_S``) and the guard
        are left of it.
        """
        with self._lock:
            granted_s = self._granted_s.get(lease)
            if granted_s is None or not self._enabled:
                return False
            bindable_until = self._bindable_until(lease, granted_s)
            if bindable_until <= now:
                return False
            self._idle.setdefault(granted_s, []).append(lease)
            self._idle_of[lease] = granted_s
            timer = self._timers.get(lease)
            # One a previous idle spell set is still due, unless its runner is gone (an
            # async provider used from another event loop now: that timer never runs).
            if timer is None or not timer.pending():
                self._start_timer(lease, bindable_until)
            return True

    def forget(self, lease: int) -> None:
        """``lease`` is revoked, gone, or its state unknown: never bind it again."""
        with self._lock:
            self._expires_by.pop(lease, None)
            self._granted_s.pop(lease, None)

    def take_all_idle(self) -> list[int]:
        """Every idle lease, forgotten, for the caller to revoke."""
        with self._lock:
            idle = [lease for stack in self._idle.values() for lease in stack]
            self._idle.clear()
            self._idle_of.clear()
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
            for lease in idle:
                self.forget(lease)
            return idle

    def _bindable_until(self, lease: int, granted_s: int) -> float:
        """When ``lease`` stops having the whole TTL it serves ahead of it (the granted
        TTL less ``REUSE_EXTRA_S``) and the guard: it can be bound only before then."""
        return self._expires_by[lease] - (granted_s - REUSE_EXTRA_S) - BIND_GUARD_S

    def _start_timer(self, lease: int, when: float) -> None:
        self._timers[lease] = self._call_at(when, lambda: self._expire(lease))

    def _expire(self, lease: int) -> None:
        """The timer: revoke ``lease`` if it is idle and can no longer be bound."""
        with self._lock:
            self._timers.pop(lease, None)
            granted_s = self._idle_of.get(lease)
            if granted_s is None:
                return  # bound again (or revoked) since: a later idle spell sets its own
            if lease in self._expires_by:
                bindable_until = self._bindable_until(lease, granted_s)
                if bindable_until > self._now():
                    self._start_timer(lease, bindable_until)  # kept alive meanwhile
                    return
            del self._idle_of[lease]
            self._idle[granted_s].remove(lease)
            self._revoke(lease)  # it carries nothing, and never will again

    def _prune(self, now: float) -> None:
        # Records whose holder never released nor renewed them leave their lease here;
        # forgetting one long past its expiry costs nothing but a revoke instead of reuse.
        for lease in [i for i, t in self._expires_by.items() if t < now - _PRUNE_AFTER_S]:
            self.forget(lease)
        for stack in self._idle.values():
            for lease in stack:
                if lease not in self._expires_by:
                    del self._idle_of[lease]
            stack[:] = [lease for lease in stack if lease in self._expires_by]


class Bindings:
    """Which etcd lease of this provider's each record it wrote was bound to, last it knew.

    So that a release whose outcome is lost (its caller cancelled, or it failed after
    the transaction may have been sent) can revoke that lease in the background:
    revoking it ends the record if the release did not land, and an empty lease if it
    did, where otherwise one of the two would be left until the lease's TTL.

    Only leases this provider granted are remembered (another process may bind its own
    lease to another record once it is empty, never one of ours), each for at most one
    record: a lease left empty, bound to another record, or revoked is dropped. A
    record whose lease has since ended, or that another process moved, names a lease
    that is gone or carries nothing, and revoking that changes nothing. Bounded: the
    oldest of ``BINDINGS_KEPT`` entries is forgotten first, which costs only the
    cleanup.
    """

    __slots__ = ("_lease_of", "_record_of", "_size")

    def __init__(self, size: int = BINDINGS_KEPT) -> None:
        self._size = size
        self._lease_of: OrderedDict[bytes, int] = OrderedDict()
        self._record_of: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self._lease_of)

    def bound(self, record: bytes, lease: int) -> None:
        """This provider's transaction put ``record`` on ``lease``, its own."""
        self.pop(record)
        self.drop_lease(lease)
        self._lease_of[record] = lease
        self._record_of[lease] = record
        if len(self._lease_of) > self._size:
            _, oldest = self._lease_of.popitem(last=False)
            self._record_of.pop(oldest, None)

    def pop(self, record: bytes) -> int | None:
        """Forget ``record``; the lease it was last known on, if any."""
        lease = self._lease_of.pop(record, None)
        if lease is not None:
            self._record_of.pop(lease, None)
        return lease

    def keep_if_on(self, record: bytes, lease: int) -> None:
        """``record`` was just read on ``lease``: forget it unless that is the one known."""
        if self._lease_of.get(record) != lease:
            self.pop(record)

    def drop_lease(self, lease: int) -> None:
        """``lease`` carries no record now (left empty, revoked, or unknown)."""
        record = self._record_of.pop(lease, None)
        if record is not None:
            self._lease_of.pop(record, None)
