"""What every section of the suite shares: the fixtures, key names, timing, result checks."""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import anyio
import pytest

from leasekit import MAX_TTL_MS, Capabilities, LeaseProvider, LeaseResult, capabilities_of

__all__ = [
    "BLOCKING_DRIVER_REASON",
    "CLOCK_TOLERANCE_S",
    "URL_KEY",
    "ContractBase",
    "KeySpace",
    "ProviderFactory",
    "ShortLease",
    "Timing",
    "check_denied",
    "check_granted",
    "expect_expiry",
    "require_factory",
    "run_concurrently",
    "token_of",
    "with_short_lease",
]

URL_KEY = pytest.StashKey[str]()
"""Where the plugin keeps the ``--leasekit-url`` it runs the suite against."""

ProviderFactory = Callable[[], LeaseProvider]
"""A picklable zero-argument callable returning a new, unopened provider on the same store."""

SHORT_TTL_MS = 100
"""The TTL of leases a test waits out; backends with coarser TTLs round it up."""

LONG_TTL_MS = 60_000
"""The TTL of leases that must not expire during a test."""

SHORT_LEASE_ATTEMPTS = 4
"""How often a check that needs a short lease to outlast its next calls is tried, with a
TTL four times longer each time, before it is skipped as too slow to judge."""

CLOCK_TOLERANCE_S = 0.002
"""How much earlier than its TTL a lease may end: a store that keeps times as whole
milliseconds may lose up to one at each conversion (SQLite's ``julianday('now')``
truncated to an integer, say), so its count can start slightly before the request."""

BLOCKING_DRIVER_REASON = (
    "not through the blocking driver (blocking_driver=True): a blocking call cannot be "
    "cancelled once it runs, and release notifications (watch_release) are an async "
    "provider's extra (leasekit.sync waits through the facade's async provider)"
)
"""Why the checks in ``leasekit_contract.BLOCKING_DRIVER_SKIPS`` skip on the blocking driver."""


class ContractBase:
    """The fixtures a backend's test class overrides, and the async setup every test uses.

    Tests run through anyio's pytest plugin (installed with anyio, auto-registered),
    on asyncio unless the subclass overrides ``anyio_backend``.
    """

    pytestmark = pytest.mark.anyio

    blocking_driver: ClassVar[bool] = False
    """True when ``provider`` drives a blocking provider from worker threads.

    Set by :class:`leasekit_contract.BlockingLeaseProviderContract`. The checks that
    cannot apply to a blocking call (cancelling it mid-flight, waiting on release
    notifications) then skip with :data:`BLOCKING_DRIVER_REASON`; every other check runs.
    """

    @pytest.fixture
    def anyio_backend(self) -> str:
        """The event loop the suite runs on; override to return ``"trio"`` for trio."""
        return "asyncio"

    @pytest.fixture
    def provider(self) -> LeaseProvider:
        """Yield a fresh, open provider; every backend's test class must override this."""
        raise NotImplementedError(
            "override the 'provider' fixture in your LeaseProviderContract subclass:\n\n"
            "    @pytest.fixture\n"
            "    async def provider(self):\n"
            "        async with MyLeaseProvider(...) as p:\n"
            "            yield p\n"
        )

    @pytest.fixture
    def provider_factory(self) -> ProviderFactory | None:
        """Return a picklable zero-argument callable giving a new provider on the same store.

        Optional. The provider it returns must not be open yet (the suite enters it with
        ``async with``). It lets the suite check that fencing tokens continue across
        reconnects, and, when the backend declares ``shared_across_processes=True``, race
        several OS processes against each other (started with multiprocessing's
        ``spawn``, so the callable must be importable by reference, for example
        ``functools.partial(leasekit.connect, url)``).
        """
        return None


class KeySpace:
    """Fresh lease keys under a random prefix.

    Every test (and every stateful example) takes its own, so the suite can run against
    a shared live store, even twice at once, without cleanup races.
    """

    def __init__(self) -> None:
        self.prefix = f"leasekit-contract/{uuid.uuid4().hex[:12]}/"

    def __call__(self, label: str) -> str:
        return self.prefix + label


@dataclass(frozen=True, slots=True)
class Timing:
    """Durations scaled to what the backend declares (``ttl_resolution_ms``, ``min_ttl_ms``).

    ``short_ttl_ms`` is what tests request for leases they wait out; the backend may
    round it up, and ``effective_s`` says by how much. ``grace_s`` is how late after
    its TTL a lease may still be seen: a backend with whole-second TTLs gets two
    seconds, one with millisecond TTLs 50 ms.
    """

    caps: Capabilities
    short_ttl_ms: int
    long_ttl_ms: int
    grace_s: float
    poll_s: float

    @classmethod
    def of(cls, provider: object) -> Timing:
        caps = capabilities_of(provider)
        effective_short_ms = caps.effective_ttl_ms(SHORT_TTL_MS)
        return cls(
            caps=caps,
            short_ttl_ms=SHORT_TTL_MS,
            long_ttl_ms=min(MAX_TTL_MS, caps.effective_ttl_ms(LONG_TTL_MS)),
            grace_s=max(50, 2 * caps.ttl_resolution_ms) / 1000,
            poll_s=max(2, effective_short_ms // 20) / 1000,
        )

    def effective_s(self, ttl_ms: int) -> float:
        """How long a lease requested with ``ttl_ms`` really lives, in seconds."""
        return self.caps.effective_ttl_ms(ttl_ms) / 1000

    @property
    def short_s(self) -> float:
        return self.effective_s(self.short_ttl_ms)

    async def outlive(self, set_finished: float, ttl_ms: int) -> None:
        """Sleep until a lease whose TTL was set by a call that returned at
        ``set_finished`` must have expired, grace included."""
        wake = set_finished + self.effective_s(ttl_ms) + self.grace_s
        await anyio.sleep(max(0.0, wake - time.monotonic()))


def require_factory(
    factory: ProviderFactory | None, caps: Capabilities, *, for_processes: bool
) -> ProviderFactory:
    """Return the provider factory, skipping or failing the test when it cannot run.

    For multi-process checks, a backend that does not declare
    ``shared_across_processes`` skips, and one that declares it without a factory
    fails: a declared capability is never skipped silently.
    """
    if for_processes and not caps.shared_across_processes:
        pytest.skip("the backend declares shared_across_processes=False")
    if factory is None:
        if for_processes:
            pytest.fail(
                "the backend declares shared_across_processes=True, so the suite must "
                "race several processes against it: override the 'provider_factory' "
                "fixture to return a picklable zero-argument callable that returns a new, "
                "unopened provider on the same store, for example "
                "functools.partial(leasekit.connect, url)"
            )
        pytest.skip(
            "override the 'provider_factory' fixture (a picklable zero-argument callable "
            "returning a new provider on the same store) to run this check"
        )
    if for_processes:
        try:
            pickle.dumps(factory)
        except Exception as exc:  # noqa: BLE001  (the failure names what was raised)
            pytest.fail(
                f"provider_factory must be picklable to reach child processes (spawn); "
                f"pickling {factory!r} raised {type(exc).__name__}: {exc}. Use a "
                "module-level function or functools.partial of one, not a lambda"
            )
    return factory


def check_granted(result: object, owner: str, caps: Capabilities, what: str) -> int | None:
    """Assert ``result`` is a granted :class:`LeaseResult` for ``owner``; return its token."""
    assert isinstance(result, LeaseResult), (
        f"{what}: acquire_lease must return a leasekit.LeaseResult, got {result!r}"
    )
    assert result.acquired is True, f"{what}: expected the lease to be granted, got {result!r}"
    assert result.owner == owner, (
        f"{what}: a granted LeaseResult must name the caller {owner!r} as owner, got {result!r}"
    )
    if caps.fencing:
        assert type(result.token) is int, (
            f"{what}: the backend declares fencing=True, so every successful acquire "
            f"must return an int token, got {result.token!r}"
        )
    return result.token


def check_denied(result: object, holder: str, what: str) -> None:
    """Assert ``result`` is a denied :class:`LeaseResult` naming ``holder``, with no token."""
    assert isinstance(result, LeaseResult), (
        f"{what}: acquire_lease must return a leasekit.LeaseResult, got {result!r}"
    )
    assert result == LeaseResult(False, holder, None), (
        f"{what}: expected LeaseResult(acquired=False, owner={holder!r}, token=None) "
        f"(denied, naming the live holder, no token), got {result!r}"
    )


async def run_concurrently(*checks: Callable[[], Awaitable[None]]) -> None:
    """Run ``checks`` as concurrent tasks; re-raise the first failure as itself.

    Unlike a bare task group, a failed assertion is not wrapped in an exception group,
    so pytest shows it as it would show any other.
    """
    failures: list[Exception] = []

    async def run(check: Callable[[], Awaitable[None]]) -> None:
        try:
            await check()
        except Exception as exc:  # noqa: BLE001  (re-raised below, outside the task group)
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        for check in checks:
            tg.start_soon(run, check)
    if failures:
        raise failures[0]


async def token_of(provider: LeaseProvider, key: str, holder: str, caps: Capabilities) -> int:
    """The holder's current fencing token, read by an idempotent re-acquire (keeps it)."""
    result = await provider.acquire_lease(key, holder, LONG_TTL_MS)
    token = check_granted(result, holder, caps, f"re-acquire of {key!r} by its holder")
    assert token is not None
    return token


async def expect_expiry(
    provider: LeaseProvider,
    key: str,
    holder: str,
    *,
    set_started: float,
    set_finished: float,
    ttl_ms: int,
    timing: Timing,
) -> None:
    """Poll until ``key`` is free; fail if it frees too early or stays held too long.

    The TTL was set by a call that ran from ``set_started`` to ``set_finished``
    (``time.monotonic()``). The store applied it somewhere in between, so the lease
    must be live until ``set_started + ttl`` (effective TTL, rounded up as the backend
    declares; less two milliseconds of clock granularity) and free by
    ``set_finished + ttl + grace``. Only answers whose whole
    round trip fell inside those bounds are judged, so a slow machine cannot fail a
    correct backend.
    """
    effective_s = timing.effective_s(ttl_ms)
    live_until = set_started + effective_s - CLOCK_TOLERANCE_S
    free_by = set_finished + effective_s + timing.grace_s
    while True:
        asked = time.monotonic()
        owner = await provider.get_lease_owner(key)
        answered = time.monotonic()
        if owner is None:
            assert answered >= live_until, (
                f"the lease on {key!r} (ttl_ms={ttl_ms}, effective "
                f"{effective_s * 1000:.0f} ms) was already free "
                f"{(answered - set_started) * 1000:.1f} ms after the call that set it "
                f"began: it expired too early"
            )
            return
        assert owner == holder, (
            f"while waiting for {holder!r}'s lease on {key!r} to expire, "
            f"get_lease_owner reported {owner!r}"
        )
        assert asked < free_by, (
            f"the lease on {key!r} (ttl_ms={ttl_ms}, effective {effective_s * 1000:.0f} ms) "
            f"was still held by {holder!r} {(asked - set_finished) * 1000:.0f} ms after "
            f"the call that set it returned; it must be free within its TTL plus "
            f"{timing.grace_s * 1000:.0f} ms (the allowance for ttl_resolution_ms="
            f"{timing.caps.ttl_resolution_ms})"
        )
        await anyio.sleep(min(timing.poll_s, max(0.0, free_by - time.monotonic()) + 0.001))


_T = TypeVar("_T")


class _TooSlow(Exception):
    """A call answered after the short lease it relied on may already have expired."""


class ShortLease:
    """One try of a check that needs a short lease to stay live across its next calls.

    A test granted a lease with ``ttl_ms`` (this try's TTL, at least the suite's short
    TTL), calls :meth:`granted` with the time its grant began, and wraps each later call
    that relies on the lease being live in :meth:`live`. An answer that arrives after
    the lease may have run out proves nothing about the backend, so :meth:`live`
    abandons the try instead of returning it; :func:`with_short_lease` then tries again.
    """

    def __init__(self, timing: Timing, ttl_ms: int, attempt: int) -> None:
        self.timing = timing
        self.ttl_ms = ttl_ms
        self.attempt = attempt
        self._live_until: float | None = None

    def granted(self, started: float) -> None:
        """The lease was granted (or its TTL set) by a call that began at ``started``."""
        self._live_until = started + self.timing.effective_s(self.ttl_ms) - CLOCK_TOLERANCE_S

    async def live(self, call: Awaitable[_T]) -> _T:
        """Await ``call``; its answer, if it arrived while the lease was surely live."""
        assert self._live_until is not None, "call granted() before live()"
        result = await call
        if time.monotonic() >= self._live_until:
            raise _TooSlow
        return result


async def with_short_lease(timing: Timing, check: Callable[[ShortLease], Awaitable[None]]) -> None:
    """Run ``check`` until one try finishes with its short lease live throughout.

    The first try uses the suite's short TTL; each try abandoned because a call answered
    too late (a loaded machine, a stalled store) runs again, on fresh keys, with a TTL
    four times longer. After :data:`SHORT_LEASE_ATTEMPTS` such tries the test is
    skipped: a slow machine must not fail a correct backend. ``check`` must take fresh
    keys on every call (a new :class:`KeySpace`).
    """
    ttl_ms = timing.short_ttl_ms
    for attempt in range(SHORT_LEASE_ATTEMPTS):
        try:
            await check(ShortLease(timing, ttl_ms, attempt))
        except _TooSlow:
            ttl_ms *= 4
            continue
        return
    pytest.skip(
        f"too slow to judge: in {SHORT_LEASE_ATTEMPTS} tries (TTLs up to {ttl_ms // 4} ms), "
        "a call that needed the lease to be live answered after it may have expired"
    )
