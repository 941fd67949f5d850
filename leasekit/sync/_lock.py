"""The blocking :class:`Lock`: :class:`leasekit.Lock`'s rules and operations over a facade.

One attempt, ``release()``, ``extend()``, ``reacquire()``, ``locked()`` and ``owned()``
run on the facade's own operations (the driver's blocking client where the backend has
one, in the calling thread); a wait runs :func:`leasekit.wait_for`'s loop on the facade's
event-loop thread, so it is woken by the store's notifications; ``timeout=None`` holds
with :func:`leasekit.sync.hold`'s machinery.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from .._errors import LeaseHeld
from .._hold import LeaseHold
from .._lock import (
    DEFAULT_LEASE_TTL_S,
    Call,
    LockError,
    LockRules,
    Op,
    not_owned,
    owner_op,
    release_op,
    renew_op,
)
from .._waiting import acquire_polling
from ..backend._operation import drive
from ._facade import SyncLeaseProvider, facade_of
from ._holding import SyncLeaseHold

__all__ = ["Lock"]

_T = TypeVar("_T")


class Lock(LockRules):
    """The blocking :class:`leasekit.Lock`, over a :class:`leasekit.sync.SyncLeaseProvider`.

    ::

        with leasekit.sync.connect("redis://localhost:6379/0") as leases:
            with leasekit.sync.Lock(leases, "reports", timeout=30):
                ...

    Same arguments, methods, errors and semantics as :class:`leasekit.Lock`, without
    ``await``; with ``thread_local=True`` (the default) each thread has its own owner id,
    so a lock acquired in one thread cannot be released from another.
    """

    def __init__(  # noqa: PLR0917 (redis-py's signature)
        self,
        provider: SyncLeaseProvider,
        name: str,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        self._facade = facade_of(provider)
        super().__init__(
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            lease_ttl=lease_ttl,
        )

    def _run(self, operation: Op[_T]) -> _T:
        facade = self._facade

        def exchange(call: Call) -> Any:
            method: Callable[..., Any] = getattr(facade, call.method)
            return method(*call.args)

        return drive(operation, exchange, throws=())

    def acquire(
        self,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | None = None,
        *,
        sleep: float | None = None,
    ) -> bool:
        """Take the lock; see :meth:`leasekit.Lock.acquire`."""
        wait_s = self._wait_s(blocking, blocking_timeout)
        owner = self._token(token)
        poll_s = self._sleep(sleep)
        ttl_ms = self._ttl_ms()
        facade = self._facade
        if self.timeout is None:
            return self._acquire_held(owner, ttl_ms, wait_s, poll_s)
        if wait_s == 0:
            sent_at = time.monotonic()
            result = facade.acquire_lease(self.name, owner, ttl_ms)
        else:
            result, sent_at = facade.run(
                acquire_polling,
                facade.provider,
                self.name,
                owner,
                ttl_ms,
                timeout_s=wait_s,
                poll_s=poll_s,
                max_poll_s=poll_s,
            )
        if not result.acquired:
            return False
        self._held(owner, sent_at, ttl_ms)
        return True

    def _acquire_held(self, owner: str, ttl_ms: int, wait_s: float | None, poll_s: float) -> bool:
        facade = self._facade
        lease = LeaseHold(
            facade.provider,
            self.name,
            owner,
            ttl_ms,
            on_lost="flag",
            wait_s=wait_s,
            poll_s=poll_s,
            max_poll_s=poll_s,
        )
        keeper = SyncLeaseHold(facade, lease, "flag")
        try:
            keeper.__enter__()
        except LeaseHeld:
            return False
        self._keep(owner, keeper)
        self._owns(owner)
        return True

    def release(self) -> None:
        """Release the lock; :class:`leasekit.LockNotOwnedError` if it was no longer ours."""
        token = self._release_token()
        keeper: SyncLeaseHold | None = self._take_keeper(token)
        if keeper is None:
            self._run(release_op(self.name, token, atomic=self._facade.reports_releases))
            return
        try:
            holder = self._run(owner_op(self.name))
        finally:
            keeper.__exit__(None, None, None)  # releases, a no-op on the store if not ours
        if holder != token:
            raise not_owned(self.name)

    def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """See :meth:`leasekit.Lock.extend`."""
        token = self._timed_token("extend")
        ttl_ms = self._extend_ttl_ms(additional_time, replace_ttl)
        sent_at = time.monotonic()
        self._run(renew_op(self.name, token, ttl_ms, "extend"))
        self._held(token, sent_at, ttl_ms)
        return True

    def reacquire(self) -> bool:
        """See :meth:`leasekit.Lock.reacquire`."""
        token = self._timed_token("reacquire")
        ttl_ms = self._ttl_ms()
        sent_at = time.monotonic()
        self._run(renew_op(self.name, token, ttl_ms, "reacquire"))
        self._held(token, sent_at, ttl_ms)
        return True

    def locked(self) -> bool:
        """True if anyone holds the lock now."""
        return self._run(owner_op(self.name)) is not None

    def owned(self) -> bool:
        """True if this holder (this thread's token, with ``thread_local``) holds it now."""
        token = self._mine()
        if token is None:
            return False
        return self._run(owner_op(self.name)) == token

    def __enter__(self) -> Lock:
        if self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
