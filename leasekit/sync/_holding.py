"""Above the blocking contract: :func:`hold`, :func:`wait_for`, :func:`watch_owner`,
:func:`elect`, each the async one running on the facade's loop thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Literal

from .._contract import LeaseResult
from .._errors import InvalidLeaseArgument, LeaseLost, LeaseProviderClosed
from .._hold import LeaseHold
from .._waiting import DEFAULT_MAX_POLL_S, DEFAULT_POLL_S
from .._waiting import wait_for as _async_wait_for
from .._watch import watch_owner as _async_watch_owner
from ._facade import SyncLeaseProvider, facade_of

__all__ = [
    "SyncLeaseHold",
    "SyncOnLost",
    "elect",
    "hold",
    "leaders",
    "wait_for",
    "watch_owner",
]

SyncOnLost = Literal["flag", "raise"]
"""What :func:`hold` does on loss: set ``.lost`` only, or also raise on leaving the block."""


def wait_for(
    provider: SyncLeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int,
    timeout_s: float | None,
    *,
    poll_s: float = DEFAULT_POLL_S,
    max_poll_s: float = DEFAULT_MAX_POLL_S,
    metadata: bytes | str | None = None,
    fair: bool = False,
) -> LeaseResult:
    """The blocking :func:`leasekit.wait_for`: wait until acquired, or raise ``LeaseHeld``."""
    facade = facade_of(provider)
    return facade.run(
        _async_wait_for,
        facade.provider,
        key,
        owner,
        ttl_ms,
        timeout_s,
        poll_s=poll_s,
        max_poll_s=max_poll_s,
        metadata=metadata,
        fair=fair,
    )


class SyncLeaseHold:
    """A lease held by :func:`hold`, renewed on the facade's loop while the block runs.

    ``key``, ``owner``, ``ttl_ms``, ``safety_margin_ms``, ``token``, ``lost_reason``,
    ``transferred_to``, ``valid_until`` and ``remaining()`` are those of the underlying
    :class:`leasekit.LeaseHold`; ``lost`` is a :class:`threading.Event`, set from the
    loop thread the moment the lease is lost: at the latest at ``valid_until``, a
    safety margin before the store can give the key to anyone else.
    """

    def __init__(self, facade: SyncLeaseProvider, lease: LeaseHold, on_lost: SyncOnLost) -> None:
        self._facade = facade
        self._lease = lease
        self.on_lost = on_lost
        self.lost = threading.Event()
        lease._add_lost_callback(self.lost.set)
        self._closed_by_facade = False
        self._release: asyncio.Event | None = None
        self._done: concurrent.futures.Future[None] | None = None
        self._pid = os.getpid()

    @property
    def key(self) -> str:
        """The lease key."""
        return self._lease.key

    @property
    def owner(self) -> str:
        """The holder's owner id."""
        return self._lease.owner

    @property
    def ttl_ms(self) -> int:
        """The TTL the grant and each renewal set."""
        return self._lease.ttl_ms

    @property
    def token(self) -> int | None:
        """The fencing token of the grant (``None`` on a backend without fencing)."""
        return self._lease.token

    @property
    def metadata(self) -> bytes | None:
        """The metadata stored with the grant (``None`` if none was given)."""
        return self._lease.metadata

    @property
    def safety_margin_ms(self) -> int:
        """How long before the TTL, counted from the last renewal, the holder stops believing."""
        return self._lease.safety_margin_ms

    @property
    def valid_until(self) -> float:
        """The deadline on :func:`time.monotonic`; see :attr:`leasekit.LeaseHold.valid_until`."""
        return self._lease.valid_until

    def remaining(self) -> float:
        """Seconds the lease is still believed held (``0.0`` once lost or ended).

        Safe from any thread. A blocking body checks it (or ``lost``) right before each
        side effect: the loop thread sets ``lost`` at the deadline, but cannot stop a
        call the body is already in.
        """
        return self._lease.remaining()

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost (see :class:`leasekit.LeaseHold`), ``"closed"`` if the
        facade was closed under the hold, or ``None``."""
        if self._closed_by_facade:
            return "closed"
        if self._pid != os.getpid():
            return "forked"
        return self._lease.lost_reason

    @property
    def transferred_to(self) -> str | None:
        """The owner the lease was handed to by :meth:`transfer_to`, if any."""
        return self._lease.transferred_to

    async def _hold_until_released(self, entered: concurrent.futures.Future[None]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._facade._holds.add(task)
        release = self._release = asyncio.Event()
        try:
            async with self._lease:
                entered.set_result(None)
                await release.wait()
        except asyncio.CancelledError:
            if entered.done():
                self._closed_by_facade = True
                self.lost.set()
            raise
        except Exception as exc:
            if not entered.done():
                entered.set_exception(exc)
                return
            raise
        finally:
            self._facade._holds.discard(task)

    def __enter__(self) -> SyncLeaseHold:
        if self._done is not None:
            raise RuntimeError("a SyncLeaseHold is entered once; call leasekit.sync.hold() again")
        self._pid = os.getpid()
        entered: concurrent.futures.Future[None] = concurrent.futures.Future()
        done = self._done = self._facade._submit(self._hold_until_released(entered))
        try:
            concurrent.futures.wait([entered, done], return_when=concurrent.futures.FIRST_COMPLETED)
            if not entered.done():
                self._facade._wait(done)  # raises: it ended before acquiring
                raise LeaseProviderClosed(backend=self._facade.backend)  # pragma: no cover
            entered.result()
        except BaseException:
            done.cancel()  # a Ctrl-C while acquiring: give up (a lease got is released)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        done = self._done
        release = self._release
        if done is None or release is None:
            return
        if self._pid != os.getpid():
            # A forked child leaving a block the parent entered: the lease is the
            # parent's, renewed and released by the parent; this process never held it.
            self.lost.set()
            return
        loop = self._facade._loop_runner().loop
        if not done.done():
            # RuntimeError: the loop already shut down, the facade was closed under us.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(release.set)
        try:
            self._facade._wait(done)
        except LeaseProviderClosed:
            pass  # closed under us: already released (or left to expire) and flagged lost
        except Exception:
            if exc_type is None:
                raise  # the release failed, and nothing else is being reported
        if self.on_lost == "raise" and self.lost.is_set() and exc_type is None:
            raise LeaseLost(key=self.key, owner=self.owner, reason=self.lost_reason)

    def transfer_to(
        self,
        next_owner: str,
        ttl_ms: int | None = None,
        *,
        metadata: bytes | str | None = None,
    ) -> None:
        """Hand the lease to ``next_owner``; see :meth:`leasekit.LeaseHold.transfer_to`."""
        self._facade.run(self._lease.transfer_to, next_owner, ttl_ms, metadata=metadata)

    def __repr__(self) -> str:
        return repr(self._lease).replace("<LeaseHold", "<SyncLeaseHold", 1)


def hold(
    provider: SyncLeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int,
    *,
    renew_every_ms: int | None = None,
    safety_margin_ms: int | None = None,
    on_lost: SyncOnLost = "flag",
    wait_s: float | None = 0.0,
    metadata: bytes | str | None = None,
    fair: bool = False,
) -> SyncLeaseHold:
    """The blocking :func:`leasekit.hold`: a ``with`` block holding ``key`` for ``owner``.

    ::

        with leasekit.sync.hold(leases, "thread-42", owner, ttl_ms=30_000) as lease:
            do_work(fencing_token=lease.token)

    Acquisition, renewal every ``renew_every_ms``, the deadline ``safety_margin_ms``
    before the TTL, loss detection and release are :func:`leasekit.hold`'s, running on
    the facade's loop thread while the block runs in the calling thread. A thread
    cannot be cancelled from outside, so on loss the body is not interrupted:
    ``.lost`` (a :class:`threading.Event`) is set at the deadline, and the body must
    check it (or ``remaining()``) before each side effect. ``on_lost="raise"`` also raises
    :class:`leasekit.LeaseLost` when the block ends normally after a loss, so work done
    without the lease does not pass as done with it. ``metadata`` is stored with the
    grant, as :func:`leasekit.hold` does.
    """
    facade = facade_of(provider)
    checked: object = on_lost
    if checked not in ("flag", "raise"):
        raise InvalidLeaseArgument.for_argument(
            "on_lost",
            f"must be 'flag' or 'raise' in leasekit.sync (a thread cannot be cancelled), "
            f"got {on_lost!r}",
        )
    lease = LeaseHold(
        facade.provider,
        key,
        owner,
        ttl_ms,
        renew_every_ms=renew_every_ms,
        safety_margin_ms=safety_margin_ms,
        on_lost="flag",
        wait_s=wait_s,
        metadata=metadata,
        fair=fair,
    )
    return SyncLeaseHold(facade, lease, on_lost)


def watch_owner(
    provider: SyncLeaseProvider, key: str, *, poll_s: float = 0.5
) -> Iterator[str | None]:
    """The blocking :func:`leasekit.watch_owner`: the owner now, then at each change.

    ``for owner in leasekit.sync.watch_owner(leases, key): ...``. Each step waits on the
    facade's loop thread (woken by release notifications where the backend has them);
    close the generator (or leave the ``for``) to stop watching.
    """
    facade = facade_of(provider)
    changes = _async_watch_owner(facade.provider, key, poll_s=poll_s)
    try:
        while True:  # watch_owner never ends by itself
            yield facade.run(changes.__anext__)
    finally:
        if not facade.closed:
            facade.run(changes.aclose)


def leaders(
    provider: SyncLeaseProvider, group: str, *, poll_s: float = 0.5
) -> Iterator[str | None]:
    """The blocking :func:`leasekit.leaders`: the leader of ``group`` now and at each change."""
    return watch_owner(provider, group, poll_s=poll_s)


def elect(
    provider: SyncLeaseProvider,
    group: str,
    candidate: str,
    ttl_ms: int,
    *,
    timeout_s: float | None = None,
    renew_every_ms: int | None = None,
    safety_margin_ms: int | None = None,
    on_lost: SyncOnLost = "flag",
    metadata: bytes | str | None = None,
) -> SyncLeaseHold:
    """The blocking :func:`leasekit.elect`: campaign, then lead inside the ``with`` block.

    Waits (woken by notifications where the backend has them) until ``candidate`` holds
    the group's lease or ``timeout_s`` passes (:class:`leasekit.LeaseHeld`); leadership
    is a :func:`hold`, so the body must check ``.lost`` or ``remaining()`` before each
    side effect. Leaving the block resigns.
    """
    return hold(
        provider,
        group,
        candidate,
        ttl_ms,
        renew_every_ms=renew_every_ms,
        safety_margin_ms=safety_margin_ms,
        on_lost=on_lost,
        wait_s=timeout_s,
        metadata=metadata,
    )
