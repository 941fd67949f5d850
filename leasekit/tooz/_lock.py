"""tooz's distributed lock on a lease: one lease per lock name, one owner per lock object."""

from __future__ import annotations

import math
import threading
import time
import uuid
from typing import Protocol

import tooz
from tooz import locking

from .. import sync as leasekit_sync
from .._errors import InvalidLeaseArgument, LeaseHeld
from ..backend import on_fork_in_child
from ._errors import translated
from ._options import ToozSettings

__all__ = ["LeasekitLock", "LockHost", "wait_seconds"]


class LockHost(Protocol):
    """What a lock needs of its coordinator (the driver), which keeps its held locks."""

    @property
    def facade(self) -> leasekit_sync.SyncLeaseProvider: ...

    settings: ToozSettings

    def lock_owner(self, member: str, instance: str) -> str: ...

    def lock_acquired(self, lock: LeasekitLock) -> None: ...

    def lock_released(self, lock: LeasekitLock) -> None: ...

    def release_if_held(self, key: str, owner: str) -> bool: ...

    def break_lease(self, key: str) -> bool: ...


def wait_seconds(blocking: object, timeout: object) -> float | None:
    """How long an acquire may wait: ``0`` (one attempt), seconds, or ``None`` (forever).

    tooz's conventions: ``blocking=False`` tries once; ``blocking=True`` waits, up to
    ``timeout`` seconds if given; a number as ``blocking`` is itself the timeout.
    """
    if blocking is False:
        return 0.0
    if blocking is True:
        limit = timeout
        argument = "timeout"
    else:
        limit = blocking
        argument = "blocking"
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be a bool or a finite number of seconds, got {limit!r}", limit
        )
    if limit < 0:
        raise InvalidLeaseArgument.for_argument(argument, f"must be >= 0, got {limit!r}", limit)
    return float(limit)


class LeasekitLock(locking.Lock):
    """An exclusive tooz lock held as the lease ``<namespace>/lock/<name>``.

    Each lock object is its own owner: two objects for one name exclude each other, in
    one coordinator or several, and one object held in one thread is not taken again
    by another thread until released. A held lock expires ``lock_timeout`` seconds
    after it was taken or last renewed by :meth:`heartbeat` (the coordinator's
    heartbeat renews every lock it holds). A blocking acquire waits for the lease with
    :func:`leasekit.sync.wait_for`, woken by the store's release notifications where it
    has them. Shared locks are not supported (``tooz.NotImplemented``).
    """

    def __init__(self, name: bytes, driver: LockHost, key: str, owner_member: str) -> None:
        super().__init__(name)
        self._driver = driver
        self._key = key
        self._owner_member = owner_member
        self._instance = uuid.uuid4().hex
        self._local = threading.Lock()
        self._owner: str | None = None
        on_fork_in_child(self)

    def _after_fork_in_child(self) -> None:
        """In a forked child the lock is not held (a copy held in the parent is the parent's)."""
        self._local = threading.Lock()
        self._owner = None

    @property
    def acquired(self) -> bool:
        """True while this object believes it holds the lock (it may have expired since)."""
        return self._owner is not None

    def acquire(
        self,
        blocking: bool = True,
        shared: bool = False,
        timeout: int | float | None = None,
    ) -> bool:
        """Take the lock; ``True`` if taken, ``False`` if not within the wait allowed."""
        if shared:
            raise tooz.NotImplemented("leasekit's tooz locks are exclusive only")
        wait_s = wait_seconds(blocking, timeout)
        started = time.monotonic()
        if wait_s == 0:
            taken_locally = self._local.acquire(blocking=False)
        else:
            taken_locally = self._local.acquire(timeout=-1 if wait_s is None else wait_s)
        if not taken_locally:
            return False
        try:
            owner = self._driver.lock_owner(self._owner_member, self._instance)
            got = self._acquire_lease(owner, wait_s, started)
        except BaseException:
            self._local.release()
            raise
        if not got:
            self._local.release()
            return False
        self._owner = owner
        self._driver.lock_acquired(self)
        return True

    def _acquire_lease(self, owner: str, wait_s: float | None, started: float) -> bool:
        facade = self._driver.facade
        ttl_ms = self._driver.settings.lock_ttl_ms
        with translated():
            if facade.acquire_lease(self._key, owner, ttl_ms).acquired:
                return True
            if wait_s == 0:
                return False
            left = None if wait_s is None else max(0.0, wait_s - (time.monotonic() - started))
            try:
                leasekit_sync.wait_for(facade, self._key, owner, ttl_ms, left)
            except LeaseHeld:
                return False
            return True

    def release(self) -> bool:
        """Release the lock; ``True`` only if this object still held it in the store."""
        owner = self._owner
        if owner is None:
            return False
        try:
            with translated():
                return self._driver.release_if_held(self._key, owner)
        finally:
            self._owner = None
            self._driver.lock_released(self)
            self._local.release()

    def break_(self) -> bool:
        """Release the lock whoever holds it; ``True`` if someone did."""
        with translated():
            return self._driver.break_lease(self._key)

    def heartbeat(self) -> bool:
        """Renew the held lock for another ``lock_timeout``; ``False`` if not held any more."""
        owner = self._owner
        if owner is None:
            return False
        with translated():
            return self._driver.facade.renew_lease(
                self._key, owner, self._driver.settings.lock_ttl_ms
            )

    def is_still_owner(self) -> bool:
        """Whether the store still has this object as the lock's holder."""
        owner = self._owner
        if owner is None:
            return False
        with translated():
            return self._driver.facade.get_lease_owner(self._key) == owner

    def __repr__(self) -> str:
        state = "held" if self._owner is not None else "free"
        return f"<LeasekitLock {self._key!r} {state}>"
