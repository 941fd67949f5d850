"""The ``memory://`` provider's counting leases (``leasekit.backend.SupportsSlots``).

A mixin of :class:`leasekit.MemoryLeaseProvider`: each method runs start to finish
under the store's lock, as every memory operation does, which makes it atomic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ._contract import validate_key, validate_owner, validate_ttl_ms
from ._errors import SlotLimitMismatch
from ._slots import (
    EXCLUSIVE_INTENT_MS,
    SLOT_HOLDERS_SHOWN,
    SlotResult,
    check_slot_acquire,
)
from .backend._records import LeaseRecord

__all__ = ["MemorySlots"]

_NS_PER_MS = 1_000_000


@dataclass(slots=True)
class _Lease:
    owner: str
    token: int
    expires_ns: int
    metadata: bytes | None = None
    exclusive: bool = False  # a slot of a counting lease held exclusively


@dataclass(slots=True)
class _SlotKey:
    limit: int
    holders: dict[str, _Lease]  # by owner, in grant order
    # A denied exclusive acquirer's claim to go next, and when it lapses.
    intent: str | None = None
    intent_expires_ns: int = 0

    def claimant(self, now_ns: int) -> str | None:
        """The owner of a live claim to go next, if any."""
        return self.intent if self.intent is not None and self.intent_expires_ns > now_ns else None


class _SlotStore(Protocol):
    """What of the memory store the slots use."""

    lock: threading.Lock
    clock_ns: Callable[[], int]
    last_token: int
    slots: dict[str, _SlotKey]

    def live_slots(self, key: str, now_ns: int) -> _SlotKey | None: ...


class MemorySlots:
    """Counting leases on the memory store (see :class:`leasekit.backend.SupportsSlots`)."""

    def _check(self) -> _SlotStore:
        raise NotImplementedError  # the provider's

    async def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Take one of ``limit`` slots of ``key``, or the whole key with ``exclusive``.

        ``leasekit.backend.SupportsSlots``; the rules are in ``docs/more-than-one-holder.md``.
        """
        check_slot_acquire(key, owner, ttl_ms, limit, exclusive)
        store = self._check()
        with store.lock:
            now = store.clock_ns()
            entry = store.live_slots(key, now)
            if entry is not None and entry.holders and entry.limit != limit:
                raise SlotLimitMismatch(key=key, limit=limit, stored_limit=entry.limit)
            if entry is None:
                entry = store.slots[key] = _SlotKey(limit, {})
            entry.limit = limit
            expires_ns = now + ttl_ms * _NS_PER_MS
            holders = entry.holders
            mine = holders.get(owner)
            if mine is not None and (mine.exclusive or not exclusive):
                mine.expires_ns = expires_ns  # the caller's own, as it holds it
                return SlotResult(True, owner, mine.token, len(holders), limit, (), mine.exclusive)
            claimant = entry.claimant(now)
            others = len(holders) - (mine is not None)
            held_exclusively = any(lease.exclusive for lease in holders.values())
            if exclusive and not others and claimant in (None, owner):
                entry.intent = None
                holders.pop(owner, None)  # a shared slot of the caller's becomes the key
                store.last_token += 1
                holders[owner] = _Lease(owner, store.last_token, expires_ns, exclusive=True)
                return SlotResult(True, owner, store.last_token, 1, limit, (), True)
            if not exclusive and not held_exclusively and claimant is None and others < limit:
                store.last_token += 1
                holders[owner] = _Lease(owner, store.last_token, expires_ns)
                return SlotResult(True, owner, store.last_token, len(holders), limit)
            if exclusive and claimant in (None, owner):
                entry.intent = owner  # goes next: new slots wait for it
                intent_ms = min(ttl_ms, EXCLUSIVE_INTENT_MS)
                entry.intent_expires_ns = now + intent_ms * _NS_PER_MS
            shown = tuple(list(holders)[:SLOT_HOLDERS_SHOWN])
            waiting = claimant if claimant != owner else None
            return SlotResult(
                False, None, None, len(holders), limit, shown, held_exclusively, waiting
            )

    async def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Reset the TTL of ``owner``'s live slot of ``key``; whether it held one."""
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        store = self._check()
        with store.lock:
            now = store.clock_ns()
            entry = store.live_slots(key, now)
            mine = None if entry is None else entry.holders.get(owner)
            if mine is None:
                return False
            mine.expires_ns = now + ttl_ms * _NS_PER_MS
            return True

    async def release_slot(self, key: str, owner: str) -> bool:
        """Free ``owner``'s live slot of ``key``; whether it held one."""
        validate_key(key)
        validate_owner(owner)
        store = self._check()
        with store.lock:
            entry = store.live_slots(key, store.clock_ns())
            return entry is not None and entry.holders.pop(owner, None) is not None

    async def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``from_owner``'s live slot to ``to_owner`` with a new token; whether it moved."""
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        store = self._check()
        with store.lock:
            now = store.clock_ns()
            entry = store.live_slots(key, now)
            mine = None if entry is None else entry.holders.get(from_owner)
            if entry is None or mine is None:
                return False
            if to_owner == from_owner:
                mine.expires_ns = now + ttl_ms * _NS_PER_MS
                return True
            if to_owner in entry.holders:
                return False
            del entry.holders[from_owner]
            store.last_token += 1
            entry.holders[to_owner] = _Lease(
                to_owner, store.last_token, now + ttl_ms * _NS_PER_MS, exclusive=mine.exclusive
            )
            return True

    async def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """The live slots of ``key``, in grant order."""
        validate_key(key)
        store = self._check()
        with store.lock:
            now = store.clock_ns()
            entry = store.live_slots(key, now)
            if entry is None:
                return []
            return [
                LeaseRecord(key, o, lease.token, max(1, -(-(lease.expires_ns - now) // _NS_PER_MS)))
                for o, lease in sorted(entry.holders.items(), key=lambda item: item[1].token)
            ]
