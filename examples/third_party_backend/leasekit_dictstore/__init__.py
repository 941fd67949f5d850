"""leasekit-dictstore: leases kept in a plain dict, an example third-party leasekit backend.

Deliberately simple: one dict per store maps each key to its owner, fencing token and
expiry on the process's monotonic clock; one counter issues every token. It shows
the whole path a backend author takes (the five operations, the validators,
capabilities, ``from_url``, the lifecycle, an entry point, the conformance suite),
using only public ``leasekit`` names.

Leases live in this process only. ``dictstore://`` opens a private store;
``dictstore://NAME`` a store shared by every provider opened with that name in this
process (it lives until the process exits). An expired lease stays in the dict, dead,
until its key is acquired again, like a row in a SQL table; a backend for
long-running processes with ever-new keys would sweep them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseProviderClosed,
    LeaseResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)

__all__ = ["DictLeaseProvider"]

_SCHEME = "dictstore://"


@dataclass(slots=True)
class _Lease:
    owner: str
    token: int
    expires_at: float  # time.monotonic() seconds; the lease is live while now < expires_at


def _deadline(now: float, ttl_ms: int) -> float:
    return now + ttl_ms / 1000


class _DictStore:
    """The leases of one store and its token counter, shared by every provider on it."""

    def __init__(self) -> None:
        self.leases: dict[str, _Lease] = {}
        # One counter for all keys: each token is greater than every token this store
        # ever issued, so nothing needs remembering about released or expired keys.
        self.last_token = 0
        # Operations never await inside their critical section, which already makes
        # them atomic between asyncio tasks; the lock covers event loops in other
        # threads sharing a named store.
        self.lock = threading.Lock()

    def live(self, key: str, now: float) -> _Lease | None:
        """The lease on ``key`` if there is one and it has not expired."""
        lease = self.leases.get(key)
        if lease is None or now >= lease.expires_at:
            return None
        return lease

    def grant(self, key: str, owner: str, ttl_ms: int, now: float) -> _Lease:
        """Give ``key`` to ``owner`` with a fresh token, replacing any previous lease."""
        self.last_token += 1
        lease = _Lease(owner, self.last_token, _deadline(now, ttl_ms))
        self.leases[key] = lease
        return lease


_named_stores: dict[str, _DictStore] = {}
_named_stores_lock = threading.Lock()


class DictLeaseProvider:
    """Leases in a dict in this process's memory, with fencing and atomic transfer.

    ``DictLeaseProvider()`` has a private store; ``DictLeaseProvider("NAME")`` shares
    the store named ``NAME`` with every other provider of that name in this process.
    Use it as ``async with`` (or call :meth:`aclose`); operations after closing raise
    :class:`leasekit.LeaseProviderClosed`.
    """

    # Declared once, as data: the suite checks each guarantee declared here. Expiry is
    # decided by time.monotonic() of this process, and nothing is shared with other
    # processes, so the other capabilities keep their conservative defaults.
    capabilities = Capabilities(atomic_transfer=True, fencing=True)

    def __init__(self, name: str | None = None) -> None:
        if name is None:
            self._store = _DictStore()
        else:
            checked: object = name  # callers may pass anything; check at run time
            if not isinstance(checked, str) or not checked:
                raise InvalidLeaseArgument.for_argument(
                    "name", f"must be a non-empty str, got {name!r}"
                )
            with _named_stores_lock:
                self._store = _named_stores.setdefault(name, _DictStore())
        self.name = name
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DictLeaseProvider:
        """Build from ``dictstore://`` (private store) or ``dictstore://NAME`` (shared)."""
        if options:
            raise InvalidLeaseArgument.for_argument(
                "options", f"dictstore:// takes no options, got {sorted(options)}"
            )
        if not url.lower().startswith(_SCHEME) or "?" in url or "#" in url:
            raise InvalidLeaseArgument.for_argument(
                "url", f"must look like dictstore:// or dictstore://NAME, got {url!r}"
            )
        return cls(url[len(_SCHEME) :] or None)

    def _open_store(self) -> _DictStore:
        if self._closed:
            raise LeaseProviderClosed(backend="dictstore")
        return self._store

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        """Take ``key`` if it is free, expired or already ``owner``'s; else report the holder."""
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            now = time.monotonic()
            lease = store.live(key, now)
            if lease is None:
                lease = store.grant(key, owner, ttl_ms, now)
            elif lease.owner == owner:
                lease.expires_at = _deadline(now, ttl_ms)  # idempotent: same token
            else:
                return LeaseResult(False, lease.owner, None)
            return LeaseResult(True, owner, lease.token)

    async def get_lease_owner(self, key: str) -> str | None:
        """Return the live holder of ``key``, or ``None``."""
        validate_key(key)
        store = self._open_store()
        with store.lock:
            lease = store.live(key, time.monotonic())
            return None if lease is None else lease.owner

    async def release_lease(self, key: str, owner: str) -> None:
        """Free ``key`` if ``owner`` holds it; anyone else's release changes nothing."""
        validate_key(key)
        validate_owner(owner)
        store = self._open_store()
        with store.lock:
            lease = store.live(key, time.monotonic())
            if lease is not None and lease.owner == owner:
                del store.leases[key]

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Reset ``owner``'s live lease to ``ttl_ms`` from now; ``False`` if not the holder."""
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            now = time.monotonic()
            lease = store.live(key, now)
            if lease is None or lease.owner != owner:
                return False
            lease.expires_at = _deadline(now, ttl_ms)
            return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``from_owner``'s live lease to ``to_owner`` with a fresh token and TTL.

        Atomic: the new lease replaces the old one in a single step, so the key is
        never free in between. ``False`` if ``from_owner`` is not the live holder.
        """
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            now = time.monotonic()
            lease = store.live(key, now)
            if lease is None or lease.owner != from_owner:
                return False
            if to_owner == from_owner:
                lease.expires_at = _deadline(now, ttl_ms)  # the same as renew
            else:
                store.grant(key, to_owner, ttl_ms, now)
            return True

    async def aclose(self) -> None:
        """Close this provider; a named store stays for the other providers of that name."""
        self._closed = True

    async def __aenter__(self) -> DictLeaseProvider:
        self._open_store()
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
        return f"DictLeaseProvider({where}{', closed' if self._closed else ''})"
