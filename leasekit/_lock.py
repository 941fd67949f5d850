"""A lock with redis-py's manners on every backend: :class:`Lock`, its errors, its rules.

``leasekit.Lock`` (asyncio) and ``leasekit.sync.Lock`` (blocking) share everything but
their I/O: the argument checks, the owner-id bookkeeping (per thread, as redis-py's), the
error messages, and the short operations behind ``release()``, ``extend()``,
``reacquire()``, ``locked()`` and ``owned()``, written once as sans-I/O generators
(:mod:`leasekit.backend`'s model) that the async lock drives over an async provider and
the blocking one over a :class:`leasekit.sync.SyncLeaseProvider`.

``timeout=None`` (held until released) is a lease of ``lease_ttl`` seconds renewed in
the background by :func:`leasekit.hold`'s machinery, so a crashed holder's lock frees
itself after at most ``lease_ttl`` instead of never.
"""

from __future__ import annotations

import inspect
import math
import os
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import SimpleNamespace, TracebackType
from typing import Any, TypeVar, cast

from . import _hooks
from ._contract import MAX_TTL_MS, LeaseProvider, validate_key, validate_owner
from ._detection import is_lease_provider
from ._errors import InvalidLeaseArgument, LeaseError
from ._hold import LeaseHold
from ._lock_keeper import Keeper
from ._owners import new_owner_id
from ._waiting import acquire_polling, check_poll_s, check_wait_s
from .backend._operation import drive_async
from .backend._records import SupportsReleaseReport, supports

__all__ = ["DEFAULT_LEASE_TTL_S", "Lock", "LockError", "LockNotOwnedError"]

DEFAULT_LEASE_TTL_S = 30.0
"""The TTL of the lease under a ``timeout=None`` lock, renewed every third of it."""

_T = TypeVar("_T")


class LockError(LeaseError, ValueError):
    """A lock operation that cannot be done: releasing or extending a lock not acquired,
    extending one without a timeout, ``sleep`` longer than ``timeout``, or a ``with``
    block that could not acquire in time. ``lock_name`` is the lock's name.

    As redis-py's ``LockError``, it is also a :class:`ValueError`.
    """

    def __init__(self, message: str = "", *, lock_name: str | None = None) -> None:
        super().__init__(message)
        self.lock_name = lock_name


class LockNotOwnedError(LockError):
    """The lock is no longer this holder's: it expired, and maybe someone else took it."""


class _Local(threading.local):
    token: str | None = None
    pid: int = 0  # the process that acquired: a forked child does not hold the parent's lock
    # When the grant (or the last extend/reacquire) was sent plus the TTL it set, on
    # time.monotonic(): never later than the store's expiry, so extend() never adds
    # time the lease does not have.
    expires_at: float = -math.inf


def _local(thread_local: bool) -> Any:
    if thread_local:
        return _Local()
    return SimpleNamespace(token=None, pid=0, expires_at=-math.inf)


@dataclass(frozen=True, slots=True)
class Call:
    """One request of a lock operation: a contract method and its arguments."""

    method: str
    args: tuple[Any, ...]


Op = Generator[Call, Any, _T]


def _seconds(value: object, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be a number of seconds, got {value!r}", value
        )
    if not 0 < value * 1000 <= MAX_TTL_MS:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be > 0 and at most {MAX_TTL_MS / 1000:g} seconds, got {value!r}", value
        )
    return float(value)


def _ms(seconds: float) -> int:
    """Seconds to a TTL in ms, rounded up (the lock is never held shorter than asked)."""
    return min(max(1, math.ceil(seconds * 1000)), MAX_TTL_MS)


def _flag(value: object, argument: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidLeaseArgument.for_argument(argument, f"must be True or False, got {value!r}")
    return value


# -- the operations, written once ------------------------------------------------------------


def release_op(name: str, token: str, *, atomic: bool = False) -> Op[None]:
    if atomic:  # the backend's release says whether it released, in its one atomic step
        released = yield Call("release_if_held", (name, token))
        if not released:
            raise not_owned(name)
        return
    # The contract's release is a silent no-op for a non-holder, so ask first. Between
    # the two, the only change possible is that this holder's lease ran out: it was
    # ours until then.
    holder = yield Call("get_lease_owner", (name,))
    if holder != token:
        raise not_owned(name)
    yield Call("release_lease", (name, token))


def not_owned(name: str) -> LockNotOwnedError:
    return LockNotOwnedError("Cannot release a lock that's no longer owned", lock_name=name)


def renew_op(name: str, token: str, ttl_ms: int, what: str) -> Op[bool]:
    renewed = yield Call("renew_lease", (name, token, ttl_ms))
    if not renewed:
        raise LockNotOwnedError(f"Cannot {what} a lock that's no longer owned", lock_name=name)
    return True


def owner_op(name: str) -> Op[str | None]:
    holder: str | None = yield Call("get_lease_owner", (name,))
    return holder


class LockRules:
    """State and rules shared by the async and blocking locks; no I/O here."""

    def __init__(  # noqa: PLR0917 (redis-py's signature, positional arguments included)
        self,
        name: str,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        self.name = validate_key(name, "name")
        self.timeout = None if timeout is None else _seconds(timeout, "timeout")
        self.sleep = check_poll_s(sleep, "sleep")
        self.blocking = _flag(blocking, "blocking")
        self.blocking_timeout = check_wait_s(blocking_timeout, "blocking_timeout")
        self.thread_local = _flag(thread_local, "thread_local")
        self.lease_ttl = _seconds(lease_ttl, "lease_ttl")
        if self.timeout is not None and self.sleep > self.timeout:
            raise LockError('"sleep" must be less than "timeout"', lock_name=self.name)
        self.local = _local(self.thread_local)
        # Under timeout=None, the hold renewing each token's lease (any thread may release).
        self._keepers: dict[str, Any] = {}
        self._keepers_lock = threading.Lock()

    def _wait_s(self, blocking: bool | None, blocking_timeout: float | None) -> float | None:
        """How long an acquire waits: 0 for one attempt, None without limit."""
        block = self.blocking if blocking is None else _flag(blocking, "blocking")
        if not block:
            return 0.0
        if blocking_timeout is None:
            return self.blocking_timeout
        return check_wait_s(blocking_timeout, "blocking_timeout")

    def _token(self, token: str | None) -> str:
        return new_owner_id() if token is None else validate_owner(token, "token")

    def _sleep(self, sleep: float | None) -> float:
        return self.sleep if sleep is None else check_poll_s(sleep, "sleep")

    def _ttl_ms(self) -> int:
        return _ms(self.lease_ttl if self.timeout is None else self.timeout)

    def _mine(self) -> str | None:
        """This holder's token; ``None`` if it acquired nothing (or in a forked child)."""
        token: str | None = self.local.token
        if token is not None and self.local.pid != os.getpid():
            return None  # the parent's lock stays the parent's
        return token

    def _owns(self, token: str) -> None:
        self.local.token = token
        self.local.pid = os.getpid()

    def _held(self, token: str, sent_at: float, ttl_ms: int) -> None:
        self._owns(token)
        self.local.expires_at = sent_at + ttl_ms / 1000

    def _release_token(self) -> str:
        token = self._mine()
        if token is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        self.local.token = None  # cleared even if the release then fails, as redis-py does
        self.local.expires_at = -math.inf
        return token

    def _take_keeper(self, token: str) -> Any:
        with self._keepers_lock:
            return self._keepers.pop(token, None)

    def _keep(self, token: str, keeper: object) -> None:
        with self._keepers_lock:
            self._keepers[token] = keeper

    def _timed_token(self, what: str) -> str:
        token = self._mine()
        if token is None:
            raise LockError(f"Cannot {what} an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError(f"Cannot {what} a lock with no timeout", lock_name=self.name)
        return token

    def _extend_ttl_ms(self, additional_time: float, replace_ttl: bool) -> int:
        additional_ms = _ms(_seconds(additional_time, "additional_time"))
        if _flag(replace_ttl, "replace_ttl"):
            return additional_ms
        expires_at: float = self.local.expires_at
        left_ms = max(0, math.floor((expires_at - time.monotonic()) * 1000))
        if left_ms + additional_ms > MAX_TTL_MS:
            raise InvalidLeaseArgument.for_argument(
                "additional_time",
                f"would hold the lock longer than {MAX_TTL_MS / 1000:g} seconds",
                additional_time,
            )
        return left_ms + additional_ms

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__name__} {self.name!r}>"


class Lock(LockRules):
    """A lock on ``name`` with redis-py's ``Lock`` manners, on any leasekit backend (asyncio).

    ::

        lock = leasekit.Lock(provider, "reports", timeout=30)
        async with lock:
            ...  # at most one holder at a time, for up to 30 s

    ``timeout`` is how long the lock lasts, in seconds (``None``: until released; then
    the lease under it lasts ``lease_ttl`` seconds and is renewed in the background
    every third of that, so a crashed holder's lock frees itself). ``acquire()`` waits
    (``blocking``, up to ``blocking_timeout`` seconds, ``None`` forever), woken by the
    store's release notifications where it has them and otherwise looking again every
    ``sleep`` seconds. Each ``acquire()`` makes a new owner id (or uses ``token``);
    with ``thread_local=True`` the id is kept per thread, so one thread cannot release
    another's lock; tasks of one event loop share their thread's.
    """

    def __init__(  # noqa: PLR0917 (redis-py's signature)
        self,
        provider: LeaseProvider,
        name: str,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        if callable(getattr(provider, "run", None)) and not inspect.iscoroutinefunction(
            getattr(provider, "acquire_lease", None)
        ):
            raise InvalidLeaseArgument.for_argument(
                "provider",
                "is a blocking leasekit.sync provider: use leasekit.sync.Lock with it",
            )
        if not is_lease_provider(provider):
            raise InvalidLeaseArgument.for_argument(
                "provider",
                "must be a leasekit provider (from leasekit.connect), "
                f"got {type(provider).__name__}",
            )
        super().__init__(
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            lease_ttl=lease_ttl,
        )
        self._ops = _hooks.HookedLeaseProvider(
            _hooks.unwrap(provider), _hooks.backend_name(provider)
        )
        self._atomic_release = supports(self._ops.wrapped, SupportsReleaseReport)

    async def _run(self, operation: Op[_T]) -> _T:
        ops = self._ops

        async def exchange(call: Call) -> Any:
            if call.method == "release_if_held":
                return await self._release_if_held(*call.args)
            method: Callable[..., Any] = getattr(ops, call.method)
            return await method(*call.args)

        return await drive_async(operation, exchange, throws=())

    async def _release_if_held(self, key: str, owner: str) -> bool:
        """The backend's atomic release, with the events its ``release_lease`` would emit."""
        ops = self._ops
        start = time.perf_counter()
        try:
            reporter = cast("SupportsReleaseReport", ops.wrapped)
            released = await reporter.release_if_held(key, owner)
        except Exception as exc:
            _hooks.emit(
                "leasekit_failed",
                operation="release",
                key=key,
                owner=owner,
                backend=ops.backend,
                error=exc,
                latency_s=time.perf_counter() - start,
            )
            raise
        if released:
            _hooks.emit(
                "leasekit_released",
                key=key,
                owner=owner,
                backend=ops.backend,
                latency_s=time.perf_counter() - start,
            )
        return released

    async def acquire(
        self,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | None = None,
        *,
        sleep: float | None = None,
    ) -> bool:
        """Take the lock; True if taken, False if the wait ran out (or ``blocking=False``
        and it is held). Arguments default to the lock's own."""
        wait_s = self._wait_s(blocking, blocking_timeout)
        owner = self._token(token)
        poll_s = self._sleep(sleep)
        ttl_ms = self._ttl_ms()
        if self.timeout is None:
            return await self._acquire_held(owner, ttl_ms, wait_s, poll_s)
        result, sent_at = await acquire_polling(
            self._ops,
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

    async def _acquire_held(
        self, owner: str, ttl_ms: int, wait_s: float | None, poll_s: float
    ) -> bool:
        lease = LeaseHold(
            self._ops,
            self.name,
            owner,
            ttl_ms,
            on_lost="flag",
            wait_s=wait_s,
            poll_s=poll_s,
            max_poll_s=poll_s,
        )
        keeper = Keeper(lease)
        if not await keeper.start():
            return False
        self._keep(owner, keeper)
        self._owns(owner)
        return True

    async def release(self) -> None:
        """Release the lock; :class:`LockNotOwnedError` if it was no longer ours."""
        token = self._release_token()
        keeper: Keeper | None = self._take_keeper(token)
        if keeper is None:
            await self._run(release_op(self.name, token, atomic=self._atomic_release))
            return
        try:
            holder = await self._run(owner_op(self.name))
        finally:
            await keeper.stop()  # releases the lease, a no-op on the store if not ours
        if holder != token:
            raise not_owned(self.name)

    async def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the lock's remaining time (or, with
        ``replace_ttl``, set it to that); True, or :class:`LockNotOwnedError`."""
        token = self._timed_token("extend")
        ttl_ms = self._extend_ttl_ms(additional_time, replace_ttl)
        sent_at = time.monotonic()
        await self._run(renew_op(self.name, token, ttl_ms, "extend"))
        self._held(token, sent_at, ttl_ms)
        return True

    async def reacquire(self) -> bool:
        """Reset the lock's remaining time to ``timeout``; True, or :class:`LockNotOwnedError`."""
        token = self._timed_token("reacquire")
        ttl_ms = self._ttl_ms()
        sent_at = time.monotonic()
        await self._run(renew_op(self.name, token, ttl_ms, "reacquire"))
        self._held(token, sent_at, ttl_ms)
        return True

    async def locked(self) -> bool:
        """True if anyone holds the lock now."""
        return await self._run(owner_op(self.name)) is not None

    async def owned(self) -> bool:
        """True if this holder (this thread's token, with ``thread_local``) holds it now."""
        token = self._mine()
        if token is None:
            return False
        return await self._run(owner_op(self.name)) == token

    async def __aenter__(self) -> Lock:
        if await self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()
