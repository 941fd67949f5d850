# A module over 500 lines: redis-py's whole Lock behaviour list, written once for both drivers.
"""leasekit.Lock and leasekit.sync.Lock: redis-py's Lock behaviour, on every backend.

The behaviour list of redis-py's tests/test_lock.py (tokens, locked/owned, competing
locks, timeouts, blocking timeouts, the context manager, releasing, extending and
reacquiring locks one does not hold or no longer owns, thread_local), run on memory,
SQLite, Redis, PostgreSQL, MariaDB and etcd, through the asyncio Lock and the blocking
one. What redis-py reads with GET and PTTL is read here from the store through the
provider (its owner, and its own count of the time left). Where redis-py overwrites the
key with SET to take the lock from its holder, the holder's lease is handed to an
intruder with transfer_lease, which only the live holder can do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import require_module, with_options

import leasekit
import leasekit.plugins
import leasekit.sync
from leasekit import InvalidLeaseArgument, LockError, LockNotOwnedError

BACKENDS = [
    "memory",
    "sqlite",
    "redis",
    "postgres",
    "mysql",
    pytest.param("etcd", marks=pytest.mark.slow),
]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    name = request.param
    if name == "memory":
        return "memory://"
    if name == "sqlite":
        return f"sqlite:///{tmp_path}/locks.db"
    if name == "redis":
        require_module("redis", extra="redis")
        redis_url: str = request.getfixturevalue("redis_url")
        return with_options(redis_url, prefix=request.getfixturevalue("redis_prefix"))
    if name == "postgres":
        require_module("psycopg", extra="postgres")
        postgres_url: str = request.getfixturevalue("postgres_url")
        return with_options(postgres_url, table=request.getfixturevalue("postgres_table"))
    if name == "mysql":
        require_module("asyncmy", extra="mysql")
        mysql_url: str = request.getfixturevalue("mysql_url")
        return with_options(mysql_url, table=request.getfixturevalue("mysql_table"))
    require_module("aetcd", extra="etcd")
    etcd_url: str = request.getfixturevalue("etcd_url")
    return f"{etcd_url}?prefix={request.getfixturevalue('etcd_prefix')}"


class Driver:
    """One way of using locks (asyncio, or blocking), with the store read on the side."""

    kind: str
    resolution_ms: int

    def lock(self, name: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def raw(self, method: str, *args: Any) -> Any:
        """Call the async provider's ``method`` (the store as it is, not through a lock)."""
        raise NotImplementedError

    def sleep(self, seconds: float) -> None:
        raise NotImplementedError

    def start(self, lock: Any, method: str, **kwargs: Any) -> Callable[[], Any]:
        """Start ``lock.method(**kwargs)`` in the background; returns its result's getter."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def owner(self, name: str) -> str | None:
        owner: str | None = self.raw("get_lease_owner", name)
        return owner

    def remaining_ms(self, name: str) -> int | None:
        """The store's own count of the time ``name``'s lease has left."""
        try:
            remaining: int | None = self.raw("lease_remaining_ms", name)
        except AttributeError:
            records = self.raw("inspect", name)
            matching = [r.remaining_ms for r in records if r.key == name]
            return matching[0] if matching else None
        return remaining

    def ceil_ms(self, ms: int) -> int:
        """The TTL the store sets for ``ms`` (etcd rounds up to whole seconds)."""
        return math.ceil(ms / self.resolution_ms) * self.resolution_ms


class _AsyncLock:
    """Runs an asyncio lock's methods on the driver's loop, so tests read as one list."""

    def __init__(self, lock: leasekit.Lock, run: Callable[[Awaitable[Any]], Any]) -> None:
        self.lock = lock
        self._run = run

    @property
    def local(self) -> Any:
        return self.lock.local

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.lock, name)
        return lambda *args, **kwargs: self._run(method(*args, **kwargs))

    def __enter__(self) -> _AsyncLock:
        self._run(self.lock.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(self.lock.__aexit__(None, None, None))


class AsyncDriver(Driver):
    kind = "async"

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.provider = self.loop.run_until_complete(leasekit.connect(url).__aenter__())
        self.resolution_ms = leasekit.capabilities_of(self.provider).ttl_resolution_ms

    def run(self, awaitable: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(awaitable)

    def lock(self, name: str, *args: Any, **kwargs: Any) -> _AsyncLock:
        return _AsyncLock(leasekit.Lock(self.provider, name, *args, **kwargs), self.run)

    def raw(self, method: str, *args: Any) -> Any:
        return self.run(getattr(self.provider, method)(*args))

    def sleep(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds))  # background renewals run meanwhile

    def start(self, lock: Any, method: str, **kwargs: Any) -> Callable[[], Any]:
        task = self.loop.create_task(getattr(lock.lock, method)(**kwargs))
        return lambda: self.run(task)

    def close(self) -> None:
        self.run(self.provider.aclose())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


class BlockingDriver(Driver):
    kind = "blocking"

    def __init__(self, url: str) -> None:
        self.leases = leasekit.sync.connect(url).open()
        self.resolution_ms = self.leases.capabilities.ttl_resolution_ms
        self.pool = concurrent.futures.ThreadPoolExecutor(4)

    def lock(self, name: str, *args: Any, **kwargs: Any) -> leasekit.sync.Lock:
        return leasekit.sync.Lock(self.leases, name, *args, **kwargs)

    def raw(self, method: str, *args: Any) -> Any:
        return self.leases.run(getattr(self.leases.provider, method), *args)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def start(self, lock: Any, method: str, **kwargs: Any) -> Callable[[], Any]:
        future = self.pool.submit(getattr(lock, method), **kwargs)
        return lambda: future.result(timeout=60)

    def close(self) -> None:
        self.pool.shutdown()
        self.leases.close()


@pytest.fixture(params=["async", "blocking"])
def driver(request: pytest.FixtureRequest, url: str) -> Iterator[Driver]:
    made: Driver = AsyncDriver(url) if request.param == "async" else BlockingDriver(url)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def name() -> str:
    return f"lock-{uuid.uuid4().hex[:10]}"


def short_s(driver: Driver) -> float:
    """A short lock timeout the backend can express (etcd: one whole second)."""
    return max(0.3, driver.resolution_ms / 1000)


# -- acquire, tokens, locked and owned --------------------------------------------------------


def test_lock(driver: Driver, name: str) -> None:
    lock = driver.lock(name)
    assert lock.acquire(blocking=False)
    assert driver.owner(name) == lock.local.token
    lock.release()
    assert driver.owner(name) is None


def test_lock_token(driver: Driver, name: str) -> None:
    lock = driver.lock(name)
    assert lock.acquire(blocking=False, token="test")
    assert driver.owner(name) == "test"
    assert lock.local.token == "test"
    lock.release()
    assert driver.owner(name) is None
    assert lock.local.token is None


def test_each_acquire_is_a_new_owner(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    first = lock.local.token
    lock.release()
    assert lock.acquire(blocking=False)
    assert lock.local.token != first
    # Not reentrant, as redis-py's: a second acquire is a new owner, refused.
    assert not lock.acquire(blocking=False)
    lock.release()


def test_locked(driver: Driver, name: str) -> None:
    lock = driver.lock(name)
    assert lock.locked() is False
    lock.acquire(blocking=False)
    assert lock.locked() is True
    lock.release()
    assert lock.locked() is False
    lock2 = driver.lock(name)
    assert lock.locked() is False
    assert lock2.locked() is False
    lock2.acquire(blocking=False)
    assert lock.locked() is True  # locked() is about the key, whoever holds it
    assert lock2.locked() is True
    lock2.release()
    assert lock.locked() is False
    assert lock2.locked() is False


def test_owned(driver: Driver, name: str) -> None:
    lock = driver.lock(name)
    assert lock.owned() is False
    lock.acquire(blocking=False)
    assert lock.owned() is True
    lock.release()
    assert lock.owned() is False
    lock2 = driver.lock(name)
    assert lock2.acquire(blocking=False)
    assert lock.owned() is False
    assert lock2.owned() is True
    lock2.release()


def test_competing_locks(driver: Driver, name: str) -> None:
    lock1 = driver.lock(name)
    lock2 = driver.lock(name)
    assert lock1.acquire(blocking=False)
    assert not lock2.acquire(blocking=False)
    lock1.release()
    assert lock2.acquire(blocking=False)
    assert not lock1.acquire(blocking=False)
    lock2.release()


# -- timeouts ---------------------------------------------------------------------------------


def test_timeout(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert 8000 < remaining <= 10_000
    lock.release()


def test_float_timeout(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=9.5)
    assert lock.acquire(blocking=False)
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert 8000 < remaining <= driver.ceil_ms(9500)
    lock.release()


def test_a_lock_with_a_timeout_expires_and_is_then_not_owned(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=short_s(driver), sleep=0.05)
    assert lock.acquire(blocking=False)
    other = driver.lock(name, sleep=0.05, blocking_timeout=30)
    assert other.acquire()  # waits until the store expires the first lock
    assert lock.owned() is False
    assert other.owned() is True
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert driver.owner(name) == other.local.token  # the failed release touched nothing
    other.release()


def test_no_timeout_holds_past_the_lease_ttl_by_renewing(driver: Driver, name: str) -> None:
    lease_ttl = max(1.0, 3 * driver.resolution_ms / 1000)
    lock = driver.lock(name, lease_ttl=lease_ttl)
    assert lock.acquire(blocking=False)
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert remaining <= driver.ceil_ms(math.ceil(lease_ttl * 1000))  # a lease, not forever
    driver.sleep(2 * lease_ttl)
    assert lock.owned() is True
    assert not driver.lock(name).acquire(blocking=False)
    lock.release()
    assert driver.owner(name) is None


def test_blocking_timeout(driver: Driver, name: str) -> None:
    lock1 = driver.lock(name)
    assert lock1.acquire(blocking=False)
    lock2 = driver.lock(name, blocking_timeout=0.2)
    start = time.monotonic()
    assert not lock2.acquire()
    assert time.monotonic() - start >= 0.2  # it waited (a lower bound, never a window)
    assert driver.owner(name) == lock1.local.token
    lock1.release()


def test_a_blocked_acquire_takes_the_lock_once_released(driver: Driver, name: str) -> None:
    holder = driver.lock(name)
    assert holder.acquire(blocking=False)
    waiter = driver.lock(name, sleep=0.05, thread_local=False)  # acquired in another thread
    result = driver.start(waiter, "acquire", blocking_timeout=60)
    driver.sleep(0.2)
    assert driver.owner(name) == holder.local.token
    holder.release()
    assert result() is True
    assert driver.owner(name) == waiter.local.token
    waiter.release()


def test_high_sleep_raises_error(driver: Driver, name: str) -> None:
    with pytest.raises(LockError):
        driver.lock(name, timeout=1, sleep=2)


# -- the context manager ------------------------------------------------------------------------


def test_context_manager(driver: Driver, name: str) -> None:
    with driver.lock(name, blocking_timeout=0.2) as lock:
        assert driver.owner(name) == lock.local.token
    assert driver.owner(name) is None


def test_context_manager_raises_when_locked_not_acquired(driver: Driver, name: str) -> None:
    other = driver.lock(name)
    assert other.acquire(blocking=False)
    with (
        pytest.raises(LockError, match="Unable to acquire"),
        driver.lock(name, blocking_timeout=0.1),
    ):
        pass
    assert driver.owner(name) == other.local.token
    other.release()


# -- release ------------------------------------------------------------------------------------


def test_releasing_unlocked_lock_raises_error(driver: Driver, name: str) -> None:
    lock = driver.lock(name)
    with pytest.raises(LockError) as raised:
        lock.release()
    assert not isinstance(raised.value, LockNotOwnedError)
    assert raised.value.lock_name == name


@pytest.mark.parametrize("timeout", [None, 10])
def test_releasing_lock_no_longer_owned_raises_error(
    driver: Driver, name: str, timeout: float | None
) -> None:
    lock = driver.lock(name, timeout=timeout)
    lock.acquire(blocking=False)
    assert driver.raw("transfer_lease", name, lock.local.token, "a", 60_000)  # as redis-py's SET
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert lock.local.token is None  # even though we errored, the token is cleared
    assert driver.owner(name) == "a"  # and the new holder keeps the lock
    driver.raw("release_lease", name, "a")


# -- extend and reacquire -------------------------------------------------------------------


def test_extend_lock(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert 8000 < remaining <= 10_000
    assert lock.extend(10)
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert 16_000 < remaining <= 20_000
    lock.release()


def test_extend_lock_float(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10.0)
    assert lock.acquire(blocking=False)
    assert lock.extend(10.0)
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert 16_000 < remaining <= 20_000
    lock.release()


def test_extend_lock_replace_ttl(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    assert lock.extend(30, replace_ttl=True)
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert 20_000 < remaining <= 30_000
    assert lock.extend(5, replace_ttl=True)
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert remaining <= 5000
    lock.release()


def test_extending_unlocked_lock_raises_error(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    with pytest.raises(LockError, match="unlocked"):
        lock.extend(10)


def test_extending_lock_with_no_timeout_raises_error(driver: Driver, name: str) -> None:
    lock = driver.lock(name)
    assert lock.acquire(blocking=False)
    with pytest.raises(LockError, match="no timeout"):
        lock.extend(10)
    lock.release()


def test_extending_lock_no_longer_owned_raises_error(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    assert driver.raw("transfer_lease", name, lock.local.token, "a", 60_000)
    with pytest.raises(LockNotOwnedError):
        lock.extend(10)
    assert driver.owner(name) == "a"
    driver.raw("release_lease", name, "a")


def test_reacquire_lock(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    assert driver.raw("renew_lease", name, lock.local.token, 5000)  # as redis-py's PEXPIRE
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert remaining <= 5000
    assert lock.reacquire()
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert 8000 < remaining <= 10_000
    lock.release()


def test_reacquiring_unlocked_lock_raises_error(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    with pytest.raises(LockError, match="unlocked"):
        lock.reacquire()


def test_reacquiring_lock_with_no_timeout_raises_error(driver: Driver, name: str) -> None:
    lock = driver.lock(name)
    assert lock.acquire(blocking=False)
    with pytest.raises(LockError, match="no timeout"):
        lock.reacquire()
    lock.release()


def test_reacquiring_lock_no_longer_owned_raises_error(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    assert driver.raw("transfer_lease", name, lock.local.token, "a", 60_000)
    with pytest.raises(LockNotOwnedError):
        lock.reacquire()
    assert driver.owner(name) == "a"
    driver.raw("release_lease", name, "a")


# -- thread_local -------------------------------------------------------------------------------


def in_thread(call: Callable[[], Any]) -> Any:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(timeout=60)


def release_elsewhere(lock: Any, driver: Driver) -> None:
    """Release ``lock`` from another thread (an asyncio lock on a loop of that thread)."""
    target = lock.lock if isinstance(lock, _AsyncLock) else lock
    if driver.kind == "async":
        in_thread(lambda: asyncio.run(target.release()))
    else:
        in_thread(target.release)


def test_thread_local_tokens_are_per_thread(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    assert in_thread(lambda: lock.local.token) is None
    with pytest.raises(LockError, match="unlocked"):
        release_elsewhere(lock, driver)  # raised before any I/O: the other thread holds nothing
    assert driver.owner(name) == lock.local.token
    lock.release()


def test_without_thread_local_another_thread_releases(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10, thread_local=False)
    assert lock.acquire(blocking=False)
    token = lock.local.token
    assert in_thread(lambda: lock.local.token) == token
    if driver.kind == "blocking":
        release_elsewhere(lock, driver)
        assert driver.owner(name) is None
        assert lock.local.token is None
    else:
        lock.release()  # an asyncio provider is used on its own loop only


def test_threads_contend_for_one_lock(url: str, name: str) -> None:
    driver = BlockingDriver(url)  # threads; an asyncio lock's tasks: test_competing_locks
    try:
        threads_contend(driver, name)
    finally:
        driver.close()


def threads_contend(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=30, sleep=0.02, blocking_timeout=60)
    inside = 0
    most = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, most
        with lock:  # one Lock object, shared: thread_local keeps each thread's token
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.01)
            with guard:
                inside -= 1

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(work) for _ in range(8)]:
            future.result(timeout=120)
    assert most == 1
    assert driver.owner(name) is None


# -- bad input: typed errors, nothing written ---------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"timeout": "10"}, "timeout"),
        ({"sleep": 0}, "sleep"),
        ({"blocking_timeout": -1}, "blocking_timeout"),
        ({"blocking": "yes"}, "blocking"),
        ({"thread_local": 1}, "thread_local"),
        ({"lease_ttl": 0}, "lease_ttl"),
    ],
)
def test_bad_arguments_raise_typed_errors(
    driver: Driver, name: str, kwargs: dict[str, Any], argument: str
) -> None:
    with pytest.raises(InvalidLeaseArgument) as raised:
        driver.lock(name, **kwargs)
    assert raised.value.argument == argument
    with pytest.raises(InvalidLeaseArgument, match="name"):
        driver.lock("")


def test_a_lock_of_the_other_kind_is_refused(url: str, name: str) -> None:
    with leasekit.sync.connect(url) as leases:
        with pytest.raises(InvalidLeaseArgument, match=r"leasekit\.sync\.Lock") as raised:
            leasekit.Lock(leases, name)  # type: ignore[arg-type]
        assert raised.value.argument == "provider"
        with pytest.raises(InvalidLeaseArgument, match="provider"):
            leasekit.Lock(object(), name)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"leasekit\.sync\.connect"):
            leasekit.sync.Lock(leases.provider, name)  # type: ignore[arg-type]


def test_bad_method_arguments_write_nothing(driver: Driver, name: str) -> None:
    lock = driver.lock(name, timeout=10)
    with pytest.raises(InvalidLeaseArgument, match="token"):
        lock.acquire(blocking=False, token="")
    with pytest.raises(InvalidLeaseArgument, match="blocking_timeout"):
        lock.acquire(blocking_timeout=-1)
    assert driver.owner(name) is None
    assert lock.acquire(blocking=False)
    with pytest.raises(InvalidLeaseArgument, match="additional_time"):
        lock.extend(-5)
    with pytest.raises(InvalidLeaseArgument, match="replace_ttl"):
        lock.extend(5, replace_ttl="yes")
    remaining = driver.remaining_ms(name)
    assert remaining is not None
    assert remaining <= 10_000  # nothing was extended
    lock.release()


# -- cancellation (asyncio) -------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [None, 10])
def test_a_cancelled_wait_leaves_nothing_held(url: str, name: str, timeout: float | None) -> None:
    # asyncio only: a thread cannot be cancelled (a blocking wait ends at blocking_timeout).
    driver = AsyncDriver(url)
    try:
        cancelled_wait(driver, name, timeout)
    finally:
        driver.close()


def cancelled_wait(driver: AsyncDriver, name: str, timeout: float | None) -> None:
    holder = driver.lock(name)
    assert holder.acquire(blocking=False)
    waiter = leasekit.Lock(driver.provider, name, timeout=timeout, sleep=0.05)

    async def wait_then_cancel() -> None:
        task = asyncio.ensure_future(waiter.acquire(blocking_timeout=60))
        await asyncio.sleep(0.2)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    driver.run(wait_then_cancel())
    assert waiter.local.token is None
    holder.release()
    driver.sleep(0.1)
    assert driver.owner(name) is None  # the cancelled waiter did not take it afterwards


# -- fork -------------------------------------------------------------------------------------


def test_a_forked_child_does_not_hold_the_parents_lock(url: str, name: str) -> None:
    if url.startswith("etcd"):
        pytest.skip("gRPC refuses to run in a child forked after it started (tests/test_fork.py)")
    from test_fork import collect, fork_child  # noqa: PLC0415 (the fork harness)

    driver = BlockingDriver(url)
    try:
        lock = driver.lock(name, timeout=30)
        assert lock.acquire(blocking=False)
        held = driver.lock(f"{name}-held")  # timeout=None: renewed by the parent's loop thread
        assert held.acquire(blocking=False)

        def child() -> dict[str, object]:
            out: dict[str, object] = {"owned": lock.owned(), "held_owned": held.owned()}
            for which, inherited in (("release", lock), ("held_release", held)):
                try:
                    inherited.release()
                    out[which] = "released"
                except LockError as exc:  # noqa: PERF203 (two calls, each checked)
                    out[which] = type(exc).__name__
            out["other"] = driver.lock(name).acquire(blocking=False)
            own = driver.lock(f"{name}-child", timeout=30)
            out["own"] = own.acquire(blocking=False)
            own.release()
            return out

        (result,) = collect([fork_child(child)])
        assert result == {
            "owned": False,
            "held_owned": False,
            "release": "LockError",  # the parent's token is not the child's
            "held_release": "LockError",
            "other": False,
            "own": True,
        }
        assert lock.owned()
        assert held.owned()
        lock.release()
        held.release()
        assert driver.owner(name) is None
    finally:
        driver.close()


# -- waiting is woken by the store ------------------------------------------------------------


class DeniedCounter:
    def __init__(self) -> None:
        self.denied: dict[str, int] = {}
        self.guard = threading.Lock()

    @leasekit.hookimpl
    def leasekit_denied(self, owner: str) -> None:
        with self.guard:
            self.denied[owner] = self.denied.get(owner, 0) + 1


@pytest.mark.parametrize("kind", ["async", "blocking"])
def test_a_waiter_is_woken_by_the_release_not_by_polling(url: str, name: str, kind: str) -> None:
    counter = DeniedCounter()
    leasekit.plugins.register(counter)
    try:
        driver: Driver = AsyncDriver(url) if kind == "async" else BlockingDriver(url)
        try:
            capabilities = (
                leasekit.capabilities_of(driver.provider)
                if isinstance(driver, AsyncDriver)
                else driver.leases.capabilities
            )
            if not capabilities.release_notifications:
                pytest.skip("the store sends no release notifications: waiters poll every sleep")
            holder = driver.lock(name, timeout=60)
            assert holder.acquire(blocking=False)
            # Polling every 20 ms for the second the holder keeps the lock would be
            # dozens of refused attempts; woken by the release, the waiter makes two
            # (the first look, and one more once subscribed) and then wins.
            waiter = driver.lock(name, sleep=0.02, thread_local=False)
            result = driver.start(waiter, "acquire", blocking_timeout=60)
            driver.sleep(1.0)
            holder.release()
            assert result() is True
            token = waiter.local.token
            assert driver.owner(name) == token
            assert counter.denied.get(token, 0) <= 3, counter.denied
            waiter.release()
        finally:
            driver.close()
    finally:
        leasekit.plugins.unregister(counter)
