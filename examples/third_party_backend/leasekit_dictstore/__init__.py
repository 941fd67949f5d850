"""leasekit-dictstore: leases kept in a plain dict, an example third-party leasekit backend.

Deliberately simple: one dict per store maps each key to its owner, fencing token and
expiry on the process's monotonic clock; one counter issues every token. It shows
the whole path a backend author takes, built from leasekit's public toolkit
(``leasekit.backend``): :class:`~leasekit.backend.BackendProvider` gives the
lifecycle (``async with``, an idempotent ``aclose()``, ``LeaseProviderClosed``
afterwards), the ``timeout_s`` bound and error mapping of every call; ``parse_url``
and an :class:`~leasekit.backend.OptionSet` read ``from_url``;
:class:`~leasekit.backend.LeaseRecord` is what ``inspect`` returns. What is left here
is the backend's own part: the store and its five atomic operations, the validators,
the capabilities, an entry point, and the conformance suite to prove it.

Leases live in this process only. ``dictstore://`` opens a private store;
``dictstore://NAME`` a store shared by every provider opened with that name in this
process (it lives until the process exits). An expired lease stays in the dict, dead,
until its key is acquired again, like a row in a SQL table; a backend for
long-running processes with ever-new keys would sweep them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import (
    BackendProvider,
    ErrorMap,
    LeaseRecord,
    OptionSet,
    parse_url,
    timeout_option,
)

__all__ = ["DictLeaseProvider", "named_store", "parse_dictstore_url"]

_T = TypeVar("_T")

# The options this backend takes, from a URL's query or from keyword arguments: the
# toolkit coerces and checks them, and refuses unknown ones naming them.
_OPTIONS = OptionSet("dictstore", [timeout_option(5.0)])


@dataclass(slots=True)
class _Lease:
    owner: str
    token: int
    expires_at: float  # time.monotonic() seconds; the lease is live while now < expires_at


def _deadline(now: float, ttl_ms: int) -> float:
    return now + ttl_ms / 1000


class _DictStore:
    """The leases of one store and its token counter, shared by every provider on it.

    Its five operations are the backend's atomic mechanism: each runs start to finish
    under the lock, taking the time as an argument, and touches nothing but the dict.
    """

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

    def acquire(self, now: float, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        lease = self.live(key, now)
        if lease is None:
            lease = self.grant(key, owner, ttl_ms, now)
        elif lease.owner == owner:
            lease.expires_at = _deadline(now, ttl_ms)  # idempotent: same token
        else:
            return LeaseResult(False, lease.owner, None)
        return LeaseResult(True, owner, lease.token)

    def owner(self, now: float, key: str) -> str | None:
        lease = self.live(key, now)
        return None if lease is None else lease.owner

    def release(self, now: float, key: str, owner: str) -> None:
        lease = self.live(key, now)
        if lease is not None and lease.owner == owner:
            del self.leases[key]

    def renew(self, now: float, key: str, owner: str, ttl_ms: int) -> bool:
        lease = self.live(key, now)
        if lease is None or lease.owner != owner:
            return False
        lease.expires_at = _deadline(now, ttl_ms)
        return True

    def transfer(self, now: float, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        lease = self.live(key, now)
        if lease is None or lease.owner != from_owner:
            return False
        if to_owner == from_owner:
            lease.expires_at = _deadline(now, ttl_ms)  # the same as renew
        else:
            self.grant(key, to_owner, ttl_ms, now)  # one step: never free in between
        return True

    def records(self, now: float, prefix: str | None, limit: int) -> list[LeaseRecord]:
        found = [
            LeaseRecord(key, lease.owner, lease.token, max(1, int((lease.expires_at - now) * 1000)))
            for key, lease in self.leases.items()
            if now < lease.expires_at and (prefix is None or key.startswith(prefix))
        ]
        return sorted(found, key=lambda record: record.key)[:limit]


_named_stores: dict[str, _DictStore] = {}
_named_stores_lock = threading.Lock()


def named_store(name: str) -> _DictStore:
    """The store called ``name`` in this process, created on first use."""
    with _named_stores_lock:
        return _named_stores.setdefault(name, _DictStore())


def parse_dictstore_url(url: str, **options: Any) -> tuple[str | None, dict[str, Any]]:
    """The store's name (None: private) and every option's value; as ``from_url`` reads them.

    The benchmark's floor (``leasekit_dictstore._bench``) reads its URL here too, so
    an option means the same to both.
    """
    parsed = parse_url(url, schemes=["dictstore"])
    if (
        len(parsed.endpoints) > 1
        or parsed.path
        or parsed.username is not None
        or any(endpoint.port is not None for endpoint in parsed.endpoints)
    ):
        raise InvalidLeaseArgument.for_argument(
            "url", f"must look like dictstore:// or dictstore://NAME, got {parsed.redacted!r}"
        )
    settings = _OPTIONS.parse(parsed.query, options, url=url)
    name = parsed.endpoints[0].host if parsed.endpoints else None
    return name, settings.values


class DictLeaseProvider(BackendProvider):
    """Leases in a dict in this process's memory, with fencing and atomic transfer.

    ``DictLeaseProvider()`` has a private store; ``DictLeaseProvider("NAME")`` shares
    the store named ``NAME`` with every other provider of that name in this process.
    Use it as ``async with`` (or call :meth:`aclose`); operations after closing raise
    :class:`leasekit.LeaseProviderClosed`.
    """

    backend: ClassVar[str] = "dictstore"
    # Declared once, as data: the suite checks each guarantee declared here. Expiry is
    # decided by time.monotonic() of this process, and nothing is shared with other
    # processes, so the other capabilities keep their conservative defaults.
    capabilities: Capabilities = Capabilities(atomic_transfer=True, fencing=True)
    # A dict raises nothing a driver would; a networked backend lists its driver's
    # exceptions here, such as {DriverTimeout: leasekit.LeaseBackendTimeout}.
    errors: ClassVar[ErrorMap] = ErrorMap({}, backend="dictstore")

    def __init__(self, name: str | None = None, **options: Any) -> None:
        settings = _OPTIONS.parse((), options)
        super().__init__(timeout_s=settings["timeout_s"], owns_client=True)
        if name is None:
            self._store = _DictStore()
        else:
            checked: object = name  # callers may pass anything; check at run time
            if not isinstance(checked, str) or not checked:
                raise InvalidLeaseArgument.for_argument(
                    "name", f"must be a non-empty str, got {name!r}"
                )
            self._store = named_store(name)
        self.name = name

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DictLeaseProvider:
        """Build from ``dictstore://`` (private store) or ``dictstore://NAME`` (shared).

        ``?timeout_s=2`` (or the keyword) sets the bound on every operation.
        """
        name, values = parse_dictstore_url(url, **options)
        return cls(name, **values)

    def _describe(self) -> str:
        return "private" if self.name is None else repr(self.name)

    def _open_store(self) -> _DictStore:
        self._refuse_if_closed()
        return self._store

    async def _run(self, operation: Callable[..., _T], *args: Any) -> _T:
        """One atomic operation on the store: what every public method hands to ``_call``."""
        store = self._open_store()
        with store.lock:
            return operation(store, time.monotonic(), *args)

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        """Take ``key`` if it is free, expired or already ``owner``'s; else report the holder."""
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        return await self._call(self._run(_DictStore.acquire, key, owner, ttl_ms), key)

    async def get_lease_owner(self, key: str) -> str | None:
        """Return the live holder of ``key``, or ``None``."""
        validate_key(key)
        return await self._call(self._run(_DictStore.owner, key), key)

    async def release_lease(self, key: str, owner: str) -> None:
        """Free ``key`` if ``owner`` holds it; anyone else's release changes nothing."""
        validate_key(key)
        validate_owner(owner)
        await self._call(self._run(_DictStore.release, key, owner), key)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Reset ``owner``'s live lease to ``ttl_ms`` from now; ``False`` if not the holder."""
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        return await self._call(self._run(_DictStore.renew, key, owner, ttl_ms), key)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``from_owner``'s live lease to ``to_owner`` with a fresh token and TTL.

        Atomic: the new lease replaces the old one in a single step, so the key is
        never free in between. ``False`` if ``from_owner`` is not the live holder.
        """
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        operation = self._run(_DictStore.transfer, key, from_owner, to_owner, ttl_ms)
        return await self._call(operation, key)

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """Live leases in key order (``leasekit inspect``), only keys under ``prefix`` if given."""
        if prefix is not None:
            validate_key(prefix, "prefix")
        checked: object = limit
        if isinstance(checked, bool) or not isinstance(checked, int) or checked < 1:
            raise InvalidLeaseArgument.for_argument("limit", f"must be an int >= 1, got {limit!r}")
        return await self._call(self._run(_DictStore.records, prefix, limit))
