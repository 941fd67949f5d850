"""The suite through the blocking driver: a blocking provider, driven from worker threads.

What Flask views, Django requests and Celery tasks call is a blocking provider
(:class:`leasekit.backend.SyncProvider`: ``leasekit.sync.connect(url)``, or a backend's
native one from its ``sync_from_url``). :class:`BlockingProviderAsAsync` wraps one as
an async provider, each call running in a worker thread of its own, so every check of
:class:`LeaseProviderContract` drives it, and the concurrency checks really run
blocking calls at the same time from many threads. :class:`BlockingLeaseProviderContract`
is the suite over it: a backend's test class overrides one fixture that builds the
blocking provider.

A blocking call cannot be interrupted once it runs: the checks that cancel calls at
random points, and the wake-up checks (``watch_release`` is an async provider's extra;
``leasekit.sync.wait_for`` waits through the facade's async provider), skip under the
class attribute :attr:`~leasekit_contract.ContractBase.blocking_driver`, each with
:data:`BLOCKING_DRIVER_REASON`; the checks they are are listed in
:data:`BLOCKING_DRIVER_SKIPS`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.to_thread
import pytest

from leasekit import Capabilities, InvalidLeaseArgument, LeaseError, LeaseResult
from leasekit.backend import SyncProvider

from ._base import BLOCKING_DRIVER_REASON, KeySpace, ProviderFactory
from ._cancellation import CANCEL_CHECKS
from ._lifecycle import describe_outcome
from ._notifications import WAKE_UP_CHECKS
from ._routing import GRANT_HINT_CHECKS
from ._suite import LeaseProviderContract

__all__ = [
    "BLOCKING_DRIVER_REASON",
    "BLOCKING_DRIVER_SKIPS",
    "FORWARDED_EXTRAS",
    "BlockingLeaseProviderContract",
    "BlockingProviderAsAsync",
    "BlockingProviderFactory",
    "blocking_provider_factory",
]

BlockingProviderFactory = Callable[[], SyncProvider]
"""A zero-argument callable returning a new, unopened blocking provider on one store."""

BLOCKING_DRIVER_SKIPS = CANCEL_CHECKS | WAKE_UP_CHECKS | GRANT_HINT_CHECKS
"""The checks that skip through the blocking driver, each with :data:`BLOCKING_DRIVER_REASON`."""

THREADS = 64
"""How many calls of one wrapped provider may block at once, each in its own thread:
more than any check runs at the same time, so none waits for a thread."""

_T = TypeVar("_T")

FORWARDED_EXTRAS = (
    "release_grant",
    "release_if_held",
    "renew_leases",
    "inspect",
    "lease_remaining_ms",
    "get_lease_record",
    "acquire_slot",
    "renew_slot",
    "release_slot",
    "transfer_slot",
    "get_slot_holders",
    "acquire_lease_in_turn",
)
"""The optional extras a blocking provider's wrapper offers when the provider has them."""


class BlockingProviderAsAsync:
    """An async lease provider whose every call is a blocking provider's, in a worker thread.

    The five operations, ``aclose()`` and ``async with`` run the blocking provider's
    methods (``close()``, ``open()``) in threads of their own (up to :data:`THREADS` at
    once), so tasks racing on the wrapper are threads racing on the blocking provider.
    ``capabilities`` and ``timeout_s`` are the blocking provider's, and so are those of
    the optional extras in :data:`FORWARDED_EXTRAS` it has (each a method of the same
    name here, run in a thread too), so the suite's checks of an extra run through the
    blocking driver as well. A call whose awaiting task is cancelled still runs to its
    end in its thread: it cannot be interrupted, so the wrapper waits for it.
    """

    def __init__(self, blocking: SyncProvider) -> None:
        self.blocking = blocking
        self._threads = anyio.CapacityLimiter(THREADS)
        for name in FORWARDED_EXTRAS:
            method = getattr(blocking, name, None)
            if callable(method):
                setattr(self, name, functools.partial(self._forward, method))

    async def _forward(self, method: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await self._run(functools.partial(method, *args, **kwargs))

    @classmethod
    def build(cls, factory: BlockingProviderFactory) -> BlockingProviderAsAsync:
        """Wrap a new blocking provider from ``factory`` (picklable when ``factory`` is)."""
        return cls(factory())

    @property
    def capabilities(self) -> Capabilities:
        return self.blocking.capabilities

    @property
    def backend(self) -> str:
        return str(getattr(self.blocking, "backend", "blocking"))

    @property
    def timeout_s(self) -> float | None:
        """The blocking provider's ``timeout_s``, which bounds ``aclose()``; ``None`` if none."""
        timeout_s = getattr(self.blocking, "timeout_s", None)
        return timeout_s if isinstance(timeout_s, int | float) else None

    async def _run(self, call: Callable[..., _T], *args: Any) -> _T:
        return await anyio.to_thread.run_sync(call, *args, limiter=self._threads)

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        if metadata is None:
            return await self._run(self.blocking.acquire_lease, key, owner, ttl_ms)
        acquire: Any = self.blocking.acquire_lease
        granted: LeaseResult = await self._run(
            functools.partial(acquire, metadata=metadata), key, owner, ttl_ms
        )
        return granted

    async def get_lease_owner(self, key: str) -> str | None:
        return await self._run(self.blocking.get_lease_owner, key)

    async def release_lease(self, key: str, owner: str) -> None:
        await self._run(self.blocking.release_lease, key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self._run(self.blocking.renew_lease, key, owner, ttl_ms)

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        if metadata is None:
            return await self._run(self.blocking.transfer_lease, key, from_owner, to_owner, ttl_ms)
        transfer: Any = self.blocking.transfer_lease
        handed: bool = await self._run(
            functools.partial(transfer, metadata=metadata), key, from_owner, to_owner, ttl_ms
        )
        return handed

    async def aclose(self) -> None:
        await self._run(self.blocking.close)

    async def __aenter__(self) -> BlockingProviderAsAsync:
        await self._run(self.blocking.open)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.blocking!r}>"


def blocking_provider_factory(factory: BlockingProviderFactory) -> ProviderFactory:
    """A ``provider_factory`` for the suite from a factory of blocking providers.

    Picklable when ``factory`` is (``functools.partial(leasekit.sync.connect, url)``),
    so the multi-process checks can race blocking providers in child processes.
    """
    return functools.partial(BlockingProviderAsAsync.build, factory)


class BlockingLeaseProviderContract(LeaseProviderContract):
    """The conformance suite through a blocking provider: override ``blocking_factory``.

    ::

        import functools, pytest, leasekit.sync
        from leasekit_contract import BlockingLeaseProviderContract

        class TestMyBackendBlocking(BlockingLeaseProviderContract):
            @pytest.fixture
            def blocking_factory(self):        # required: new, unopened blocking providers
                return functools.partial(leasekit.sync.connect, "myscheme://...")

    ``leasekit.sync.connect(url)`` is what blocking callers get: the backend's native
    blocking provider where it has one (``sync_from_url``), otherwise the facade
    running its async provider on a loop thread; either passes through this class.
    The fixtures ``provider`` and ``provider_factory`` are built from
    ``blocking_factory`` (the factory must be picklable for the multi-process checks,
    as ``provider_factory`` must be). Every check of :class:`LeaseProviderContract`
    runs, except :data:`BLOCKING_DRIVER_SKIPS` (skipped with
    :data:`BLOCKING_DRIVER_REASON`); two lifecycle checks of the blocking provider
    itself are added.
    """

    blocking_driver: ClassVar[bool] = True

    @pytest.fixture
    def blocking_factory(self) -> BlockingProviderFactory:
        """Return a zero-argument callable giving a new, unopened blocking provider.

        Every backend's blocking test class must override this. Each provider it
        returns must reach the same store.
        """
        raise NotImplementedError(
            "override the 'blocking_factory' fixture in your BlockingLeaseProviderContract "
            "subclass:\n\n"
            "    @pytest.fixture\n"
            "    def blocking_factory(self):\n"
            "        return functools.partial(leasekit.sync.connect, URL)\n"
        )

    @pytest.fixture
    async def provider(
        self, blocking_factory: BlockingProviderFactory
    ) -> AsyncIterator[BlockingProviderAsAsync]:
        async with BlockingProviderAsAsync.build(blocking_factory) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(self, blocking_factory: BlockingProviderFactory) -> ProviderFactory:
        return blocking_provider_factory(blocking_factory)

    def test_blocking_provider_is_a_context_manager_that_closes_it(
        self, blocking_factory: BlockingProviderFactory
    ) -> None:
        """``with`` opens the blocking provider; leaving it closes it for good."""
        blocking: Any = blocking_factory()
        for method in ("open", "close", "__enter__", "__exit__"):
            assert callable(getattr(blocking, method, None)), (
                f"a blocking provider must have {method}() (leasekit.backend.SyncProvider, "
                "and a context manager)"
            )
        with blocking as entered:
            assert entered is blocking, "entering `with` must return the provider itself"
            assert entered.get_lease_owner(KeySpace()("with")) is None
        _expect_closed(blocking, "leaving `with`")
        blocking.close()  # idempotent
        _expect_closed(blocking, "a second close()")

    def test_blocking_provider_repr_shows_it_closed(
        self, blocking_factory: BlockingProviderFactory
    ) -> None:
        """``repr`` works open and closed, without I/O, and says ``closed`` once closed."""
        blocking = blocking_factory()
        blocking.open()
        try:
            shown = repr(blocking)
            assert "closed" not in shown, f"an open blocking provider's repr says closed: {shown}"
        finally:
            blocking.close()
        closed = repr(blocking)
        assert "closed" in closed, (
            f"a closed blocking provider's repr must say so (as leasekit.backend."
            f"SyncBackendProvider's does), got {closed}"
        )


def _expect_closed(blocking: SyncProvider, how: str) -> None:
    """Each of the five operations raises a ``LeaseError`` after ``how``, at once."""
    key = KeySpace()("closed")
    calls: dict[str, tuple[object, ...]] = {
        "acquire_lease": (key, "alice", 60_000),
        "get_lease_owner": (key,),
        "release_lease": (key, "alice"),
        "renew_lease": (key, "alice", 60_000),
        "transfer_lease": (key, "alice", "bob", 60_000),
    }
    for name, args in calls.items():
        outcome = _outcome(getattr(blocking, name), args)
        if not isinstance(outcome, LeaseError):
            pytest.fail(
                f"{name} after {how} gave {describe_outcome(outcome)}; it must raise "
                "leasekit.LeaseProviderClosed (a leasekit.LeaseError), never a driver's "
                "exception"
            )
        assert not isinstance(outcome, InvalidLeaseArgument), (
            f"{name} with valid arguments after {how} raised {outcome!r}; expected "
            "leasekit.LeaseProviderClosed"
        )


def _outcome(call: Callable[..., object], args: tuple[object, ...]) -> object:
    """What ``call(*args)`` returned, or the exception it raised."""
    try:
        return call(*args)
    except Exception as exc:  # noqa: BLE001  (the caller judges it, naming what was raised)
        return exc
