"""The ``memory://`` provider: in-process leases for tests and single-process programs."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from ._capabilities import Capabilities
from ._clock import Clock
from ._contract import (
    LeaseResult,
    validate_key,
    validate_metadata,
    validate_owner,
    validate_ttl_ms,
)
from ._errors import InvalidLeaseArgument, LeaseProviderClosed
from ._memory_slots import MemorySlots, _Lease, _SlotKey
from .backend._batch import RenewItem, check_renew_items
from .backend._notify import ReleaseHub, ReleaseWatch
from .backend._records import LeaseRecord

__all__ = ["MemoryLeaseProvider"]

_NS_PER_MS = 1_000_000


class _MemoryStore:
    """One table of leases, guarded by a lock so several event loops may share it.

    Every operation runs start to finish under the lock without awaiting, which is
    what makes it atomic; the lock only matters when threads (the sync facade, or
    several loops) share a named store.
    """

    def __init__(self, clock_ns: Callable[[], int]) -> None:
        self.clock_ns = clock_ns
        self.lock = threading.Lock()
        self.leases: dict[str, _Lease] = {}
        # One counter for the whole store: a token greater than every token ever
        # issued is in particular greater than every token of that key, and expired
        # keys can then be forgotten without keeping a per-key counter alive.
        self.last_token = 0
        # (expires_ns, token, key) candidates for sweeping; stale entries are skipped.
        self.expiries: list[tuple[int, int, str]] = []
        # Waiters of every provider on this store, woken on release and transfer.
        self.hub = ReleaseHub()
        # Counting leases, apart from the leases above: key -> its limit and slots.
        self.slots: dict[str, _SlotKey] = {}
        # Fair waiting: key -> its line, owner -> when its place lapses (arrival order).
        self.lines: dict[str, dict[str, int]] = {}

    def line(self, key: str, now_ns: int) -> dict[str, int]:
        """The live places in ``key``'s line, in arrival order (lapsed ones dropped)."""
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = {}
            return line
        for owner in [o for o, lapses in line.items() if lapses <= now_ns]:
            del line[owner]
        return line

    def live_slots(self, key: str, now_ns: int) -> _SlotKey | None:
        """The key's live slots (expired ones dropped); ``None`` once none is live."""
        entry = self.slots.get(key)
        if entry is None:
            return None
        expired = [o for o, lease in entry.holders.items() if lease.expires_ns <= now_ns]
        for owner in expired:
            del entry.holders[owner]
        if not entry.holders and entry.claimant(now_ns) is None:
            del self.slots[key]
            return None
        return entry

    def live(self, key: str, now_ns: int) -> _Lease | None:
        lease = self.leases.get(key)
        if lease is not None and lease.expires_ns <= now_ns:
            del self.leases[key]
            return None
        return lease

    def grant(
        self, key: str, owner: str, ttl_ms: int, now_ns: int, metadata: bytes | None
    ) -> _Lease:
        self.last_token += 1
        lease = _Lease(owner, self.last_token, now_ns + ttl_ms * _NS_PER_MS, metadata)
        self.leases[key] = lease
        self.schedule(key, lease)
        return lease

    def extend(self, key: str, lease: _Lease, ttl_ms: int, now_ns: int) -> None:
        expires_ns = now_ns + ttl_ms * _NS_PER_MS
        if expires_ns < lease.expires_ns:
            self.schedule(key, lease, expires_ns)  # shortened: the sweep must look sooner
        else:
            # Lengthened (a renewal, nearly always): the lease's heap entry stays, and the
            # sweep moves it on when it comes up. One push per TTL, not per renewal.
            lease.expires_ns = expires_ns

    def schedule(self, key: str, lease: _Lease, expires_ns: int | None = None) -> None:
        if expires_ns is not None:
            lease.expires_ns = expires_ns
        heapq.heappush(self.expiries, (lease.expires_ns, lease.token, key))
        if len(self.expiries) > 2 * len(self.leases) + 64:
            # Renewals leave stale heap entries behind; rebuild so the heap stays
            # proportional to the live table however long the TTLs are.
            self.expiries = [(v.expires_ns, v.token, k) for k, v in self.leases.items()]
            heapq.heapify(self.expiries)

    def sweep(self, now_ns: int) -> None:
        """Forget expired leases, so memory follows live keys, not every key ever used."""
        expiries = self.expiries
        while expiries and expiries[0][0] <= now_ns:
            _, token, key = heapq.heappop(expiries)
            lease = self.leases.get(key)
            if lease is None or lease.token != token:
                continue  # released, or granted anew (which pushed an entry of its own)
            if lease.expires_ns <= now_ns:
                del self.leases[key]
            else:
                heapq.heappush(expiries, (lease.expires_ns, token, key))  # renewed since


def _nanoseconds_of(clock: Clock) -> Callable[[], int]:
    exact = getattr(clock, "monotonic_ns", None)
    if callable(exact):
        return exact  # type: ignore[no-any-return]
    read = clock.monotonic
    return lambda: round(read() * 1e9)


_named_stores: dict[str, _MemoryStore] = {}
_named_lock = threading.Lock()


class MemoryLeaseProvider(MemorySlots):
    """Leases in this process's memory: asyncio-safe, thread-safe, fencing tokens.

    ``memory://`` gives a private store; ``memory://NAME`` a store shared by every
    provider in this process opened with the same name (it lives until the process
    exits). Expiry follows the monotonic clock and is applied lazily; expired
    entries are swept as writes happen. Nothing is shared with other processes: use
    ``sqlite:///path`` for that.
    """

    capabilities = Capabilities(
        atomic_transfer=True,
        fencing=True,
        ttl_resolution_ms=1,
        min_ttl_ms=1,
        server_clock=True,  # the one clock every participant reads is the store's own
        shared_across_processes=False,
        shared_across_hosts=False,
        persistent=False,
        release_notifications=True,
        grant_notifications=True,
        metadata=True,
        slots=True,
        fair_waiting=True,
    )

    def __init__(
        self,
        name: str | None = None,
        *,
        clock_ns: Callable[[], int] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if clock is not None:
            if clock_ns is not None:
                raise InvalidLeaseArgument.for_argument("clock", "give clock or clock_ns, not both")
            clock_ns = _nanoseconds_of(clock)
        self.clock = clock
        """The clock leases expire on when one was given (``None``: the monotonic clock)."""
        if name is None:
            self._store = _MemoryStore(time.monotonic_ns if clock_ns is None else clock_ns)
        else:
            checked: object = name  # callers may pass anything; check at run time
            if not isinstance(checked, str) or not checked:
                raise InvalidLeaseArgument.for_argument(
                    "name", f"must be a non-empty str, got {name!r}"
                )
            if clock_ns is not None:
                raise InvalidLeaseArgument.for_argument(
                    "clock" if clock is not None else "clock_ns",
                    "cannot be set for a named store (its providers share one clock)",
                )
            with _named_lock:
                store = _named_stores.get(name)
                if store is None:
                    store = _named_stores[name] = _MemoryStore(time.monotonic_ns)
            self._store = store
        self.name = name
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryLeaseProvider:
        """Build from ``memory://`` (private) or ``memory://NAME`` (shared in-process).

        One option: ``clock``, a :class:`leasekit.Clock` (such as
        ``leasekit.testing.FakeClock``) that leases expire on; private stores only.
        """
        clock = options.pop("clock", None)
        if options:
            raise InvalidLeaseArgument.for_argument(
                "options", f"memory:// takes only the clock option, got {sorted(options)}"
            )
        prefix = "memory://"
        if not url.lower().startswith(prefix) or "?" in url or "#" in url:
            raise InvalidLeaseArgument.for_argument(
                "url", f"must look like memory:// or memory://NAME, got {url!r}"
            )
        name = url[len(prefix) :]
        return cls(name or None, clock=clock)

    def _check(self) -> _MemoryStore:
        if self._closed:
            raise LeaseProviderClosed(backend="memory")
        return self._store

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        data = None if metadata is None else validate_metadata(metadata)
        store = self._check()
        with store.lock:
            now = store.clock_ns()
            store.sweep(now)
            lease = store.live(key, now)
            if lease is not None:
                if lease.owner != owner:
                    return LeaseResult(False, lease.owner, None, lease.metadata)
                store.extend(key, lease, ttl_ms, now)
                lease.metadata = data
                return LeaseResult(True, owner, lease.token, data)
            lease = store.grant(key, owner, ttl_ms, now, data)
        store.hub.notify(key, granted=True)  # owner watchers look again: taken
        return LeaseResult(True, owner, lease.token, data)

    async def acquire_lease_in_turn(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        place_ttl_ms: int,
        metadata: bytes | str | None = None,
    ) -> LeaseResult:
        """``acquire_lease`` in arrival order (``leasekit.backend.SupportsFairWaiting``).

        Granted when the key is free and no live place in its line is ahead of
        ``owner``'s; otherwise ``owner`` keeps (or takes, at the end) its place, which
        lives ``place_ttl_ms`` from now.
        """
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        validate_ttl_ms(place_ttl_ms, "place_ttl_ms")
        data = None if metadata is None else validate_metadata(metadata)
        store = self._check()
        with store.lock:
            now = store.clock_ns()
            store.sweep(now)
            line = store.line(key, now)
            lease = store.live(key, now)
            mine = lease is not None and lease.owner == owner
            if not mine and (lease is not None or next(iter(line), owner) != owner):
                line[owner] = now + place_ttl_ms * _NS_PER_MS  # a new place goes last
                if lease is None:
                    return LeaseResult(False, None, None)  # free, but not the caller's turn
                return LeaseResult(False, lease.owner, None, lease.metadata)
            line.pop(owner, None)
            if not line:
                store.lines.pop(key, None)
            if lease is not None:
                store.extend(key, lease, ttl_ms, now)
                lease.metadata = data
                return LeaseResult(True, owner, lease.token, data)
            lease = store.grant(key, owner, ttl_ms, now, data)
        store.hub.notify(key, granted=True)
        return LeaseResult(True, owner, lease.token, data)

    async def get_lease_record(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key``, ``None`` if free (``SupportsRecords``)."""
        validate_key(key)
        store = self._check()
        with store.lock:
            now = store.clock_ns()
            lease = store.live(key, now)
            if lease is None:
                return None
            remaining_ms = max(1, -(-(lease.expires_ns - now) // _NS_PER_MS))
            return LeaseRecord(key, lease.owner, lease.token, remaining_ms, lease.metadata)

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        store = self._check()
        with store.lock:
            lease = store.live(key, store.clock_ns())
            return None if lease is None else lease.owner

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)
        _release(self._check(), key, owner, None)

    async def release_if_held(self, key: str, owner: str) -> bool:
        """Release ``key`` if ``owner`` holds it; whether it did (``SupportsReleaseReport``)."""
        validate_key(key)
        validate_owner(owner)
        return _release(self._check(), key, owner, None)

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it with ``token`` (``SupportsReleaseGrant``)."""
        validate_key(key)
        validate_owner(owner)
        _release(self._check(), key, owner, token)

    def undo_grant(self, key: str, owner: str) -> None:
        """Release a grant of ``key`` to ``owner`` nobody learned of (``SupportsUndoGrant``).

        At once: every operation here is atomic and never left half done, so a
        cancelled acquire either granted before it returned or did nothing, and this
        release cannot overtake a grant still on its way.
        """
        validate_key(key)
        validate_owner(owner)
        if self._closed:
            return
        _release(self._store, key, owner, None)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        store = self._check()
        with store.lock:
            now = store.clock_ns()
            lease = store.live(key, now)
            if lease is None or lease.owner != owner:
                return False
            store.extend(key, lease, ttl_ms, now)
            return True

    async def renew_leases(self, items: Sequence[RenewItem]) -> list[bool]:
        """Renew each ``(key, owner, ttl_ms)`` as ``renew_lease`` would, under one lock hold.

        ``leasekit.backend.SupportsRenewMany``: what hold() batches renewals into.
        """
        checked = check_renew_items(items)
        store = self._check()
        renewed: list[bool] = []
        with store.lock:
            now = store.clock_ns()
            for key, owner, ttl_ms in checked:
                lease = store.live(key, now)
                if lease is None or lease.owner != owner:
                    renewed.append(False)
                else:
                    store.extend(key, lease, ttl_ms, now)
                    renewed.append(True)
        return renewed

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        data = None if metadata is None else validate_metadata(metadata)
        store = self._check()
        with store.lock:
            now = store.clock_ns()
            lease = store.live(key, now)
            if lease is None or lease.owner != from_owner:
                return False
            if to_owner == from_owner:
                store.extend(key, lease, ttl_ms, now)
                lease.metadata = data
                return True
            store.grant(key, to_owner, ttl_ms, now, data)
        store.hub.notify(key)  # waiters look again: still held, by someone new
        return True

    async def watch_release(self, key: str, *, grants: bool = False) -> ReleaseWatch:
        """Watch ``key`` for release and transfer (expiry: see :meth:`lease_remaining_ms`);
        with ``grants``, for grants too."""
        validate_key(key)
        return self._check().hub.watch(key, grants=grants)

    async def lease_remaining_ms(self, key: str) -> int | None:
        """Milliseconds left on the live lease of ``key`` (rounded up), ``None`` if free."""
        validate_key(key)
        store = self._check()
        with store.lock:
            now = store.clock_ns()
            lease = store.live(key, now)
            if lease is None:
                return None
            return -(-(lease.expires_ns - now) // _NS_PER_MS)

    async def aclose(self) -> None:
        """Close this provider; a named store stays for other providers of that name."""
        self._closed = True

    async def __aenter__(self) -> MemoryLeaseProvider:
        self._check()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        where = "private" if self.name is None else repr(self.name)
        return f"MemoryLeaseProvider({where}{', closed' if self._closed else ''})"


def _release(store: _MemoryStore, key: str, owner: str, token: int | None) -> bool:
    """Free ``key`` if ``owner`` holds it live (with ``token``, when given), and tell waiters."""
    with store.lock:
        lease = store.live(key, store.clock_ns())
        if lease is None or lease.owner != owner or (token is not None and lease.token != token):
            return False
        del store.leases[key]
    store.hub.notify(key)
    return True
