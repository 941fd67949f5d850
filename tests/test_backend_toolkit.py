"""The public backend toolkit (leasekit.backend): URLs, options, errors, deadlines, lifecycle.

The lifecycle tests drive ``BackendProvider`` with a small in-process "driver" whose
calls are coroutines that wait on events the test controls: what is under test is the
toolkit's own bookkeeping, not a store.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

import leasekit
from leasekit import (
    Capabilities,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseError,
    LeaseProviderClosed,
    LeaseResult,
)
from leasekit.backend import (
    BackendProvider,
    Deadlines,
    Endpoint,
    ErrorMap,
    FifoGate,
    Option,
    OptionSet,
    SupportsInspect,
    SupportsMigrate,
    coerce_bool,
    map_errors,
    parse_url,
    redact_url,
    stop_task,
    supports,
    timeout_option,
)

pytestmark = pytest.mark.anyio

# -- redact_url ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://user:secret@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:secret@host", "redis://:***@host"),
        ("redis://user@host", "redis://user@host"),
        ("postgresql://u:p%40ss@h/db?sslmode=require", "postgresql://u:***@h/db?sslmode=require"),
        ("etcd://u:pw@[::1]:2379,10.0.0.1:2380", "etcd://u:***@[::1]:2379,10.0.0.1:2380"),
        ("etcd://h:1?password=hunter2&prefix=x", "etcd://h:1?password=***&prefix=x"),
        ("redis:/user:secret@host", "redis:/user:***@host"),
        ("user:secret@host", "user:***@host"),
        ("rediss://a:b@c@d:1", "rediss://a:***@d:1"),
    ],
)
def test_redact_url_hides_every_password(url: str, expected: str) -> None:
    assert redact_url(url) == expected
    for secret in ("secret", "p%40ss", "hunter2", ":pw@"):
        assert secret not in redact_url(url)


def test_redact_url_of_a_non_string_shows_its_type_only() -> None:
    assert redact_url(b"redis://u:secret@h") == "<bytes>"


# -- parse_url -----------------------------------------------------------------------------


def test_parse_url_splits_an_endpoint_list_with_ipv6_members() -> None:
    parsed = parse_url(
        "etcd://root:p%40ss@10.0.0.1:2379,[::1]:2380,[fe80::1%25eth0],name?timeout_s=1#x",
        schemes=("etcd", "etcds"),
        default_port=2379,
    )
    assert parsed.scheme == "etcd"
    assert (parsed.username, parsed.password) == ("root", "p@ss")
    assert parsed.endpoints == (
        Endpoint("10.0.0.1", 2379),
        Endpoint("::1", 2380),
        Endpoint("fe80::1%25eth0", 2379),
        Endpoint("name", 2379),
    )
    assert [str(endpoint) for endpoint in parsed.endpoints][:2] == ["10.0.0.1:2379", "[::1]:2380"]
    assert parsed.query == (("timeout_s", "1"),)
    assert parsed.fragment == "x"
    assert "p%40ss" not in parsed.redacted


def test_parse_url_with_an_ipv6_list_works_on_debian_python() -> None:
    # The stricter netloc check of urlsplit (Debian's 3.11.2 with the security backport,
    # and upstream releases since) rejects this; our parser must not depend on it. Run it
    # under /usr/bin/python3 too when that exists.
    code = (
        "from leasekit.backend import parse_url;"
        "print(parse_url('etcd://10.0.0.1:2379,[::1]:2380', schemes=['etcd']).endpoints[1].port)"
    )
    pythons = [sys.executable] + (["/usr/bin/python3"] if _has_debian_python() else [])
    for python in pythons:
        out = subprocess.run(
            [python, "-c", code],
            capture_output=True,
            text=True,
            check=False,
            env={"PYTHONPATH": _repo_root()},
        )
        assert out.returncode == 0, (python, out.stderr)
        assert out.stdout.strip() == "2380"


def _has_debian_python() -> bool:
    return os.path.exists("/usr/bin/python3") and sys.executable != "/usr/bin/python3"


def _repo_root() -> str:
    return str(Path(leasekit.__file__).resolve().parent.parent)


def test_parse_url_sqlite_and_memory_shapes() -> None:
    assert parse_url("sqlite:///tmp/x.db", schemes=["sqlite"]).path == "/tmp/x.db"
    assert parse_url("sqlite:///tmp/x.db", schemes=["sqlite"]).endpoints == ()
    assert parse_url("memory://name", schemes=["memory"]).endpoints == (Endpoint("name"),)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://h", "must start with etcd://"),
        ("etcd://h:99999", "port must be a number"),
        ("etcd://h:abc", "port must be a number"),
        ("etcd://h:", "empty port"),
        ("etcd://[::1", "malformed IPv6"),
        ("etcd://::1:2379", "must be in brackets"),
        ("etcd://a,,b", "missing host"),
        ("etcd://u:secret@[::1]x", "unexpected"),
    ],
)
def test_parse_url_refuses_malformed_urls_naming_the_problem(url: str, words: str) -> None:
    with pytest.raises(InvalidLeaseArgument, match=words) as info:
        parse_url(url, schemes=["etcd"])
    assert info.value.argument == "url"
    assert "secret" not in str(info.value)


def test_parse_url_refuses_a_non_string() -> None:
    with pytest.raises(InvalidLeaseArgument, match="must be a str"):
        parse_url(42, schemes=["etcd"])


# -- options -------------------------------------------------------------------------------

OPTIONS = OptionSet(
    "demo",
    [
        timeout_option(),
        Option("cluster", bool, False),
        Option("pool_max_size", int, 10, minimum=1),
        Option("counter_ttl_ms", int, 1000, minimum=1, nullable=True),
        Option("prefix", str, "leasekit:"),
    ],
    driver={"client_name"},
)


@pytest.mark.parametrize("text", ["true", "TRUE", "yes", "on", "1"])
def test_booleans_are_read_one_way(text: str) -> None:
    assert coerce_bool("flag", text) is True
    assert OPTIONS.parse([("cluster", text)])["cluster"] is True


@pytest.mark.parametrize("text", ["false", "No", "off", "0"])
def test_false_booleans(text: str) -> None:
    assert OPTIONS.parse([("cluster", text)])["cluster"] is False


def test_options_defaults_query_and_keywords_winning() -> None:
    parsed = OPTIONS.parse(
        [("timeout_s", "2.5"), ("pool_max_size", "3"), ("client_name", "me")],
        {"pool_max_size": 7},
    )
    assert parsed.values == {
        "timeout_s": 2.5,
        "cluster": False,
        "pool_max_size": 7,
        "counter_ttl_ms": 1000,
        "prefix": "leasekit:",
    }
    assert parsed.driver == (("client_name", "me"),)
    assert OPTIONS.parse([("counter_ttl_ms", "none")])["counter_ttl_ms"] is None


@pytest.mark.parametrize(
    ("query", "overrides", "words"),
    [
        ([("cluster", "maybe")], {}, "cluster: must be true or false"),
        ([("pool_max_size", "1O")], {}, "pool_max_size: must be a whole number"),
        ([("pool_max_size", "0")], {}, "pool_max_size: must be >= 1"),
        ([("timeout_s", "0")], {}, "timeout_s: must be > 0"),
        ([("timeout_s", "nan")], {}, "timeout_s: must be a finite number"),
        ([("timeout_s", "x")], {}, "timeout_s: must be a number"),
        ([("bogus", "1")], {}, "unknown query parameter 'bogus'"),
        ([("cluster", "1"), ("cluster", "0")], {}, "given twice"),
        ([], {"bogus": 1}, "unknown demo option"),
        ([], {"cluster": "yes"}, "cluster: must be a bool"),
        ([], {"pool_max_size": True}, "pool_max_size: must be an int"),
        ([], {"prefix": 3}, "prefix: must be a str"),
    ],
)
def test_options_refuse_bad_values_naming_them(
    query: list[tuple[str, str]], overrides: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidLeaseArgument, match=words):
        OPTIONS.parse(query, overrides, url="demo://u:secret@h")


def test_option_errors_quote_the_url_without_its_password() -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        OPTIONS.parse([("bogus", "1")], url="demo://u:secret@h")
    assert "secret" not in str(info.value)
    assert "demo://u:***@h" in str(info.value)


# -- error mapping -------------------------------------------------------------------------


class DriverError(Exception):
    pass


class DriverRefused(DriverError):
    pass


def test_error_map_classifies_by_the_first_matching_class() -> None:
    errors = ErrorMap(
        {DriverRefused: LeaseBackendUnreachable, DriverError: LeaseBackendError}, backend="demo"
    )
    assert errors.classify(DriverRefused()) is LeaseBackendUnreachable
    assert errors.classify(DriverError()) is LeaseBackendError
    assert errors.classify(ConnectionRefusedError()) is LeaseBackendUnreachable
    assert errors.classify(socket.gaierror()) is LeaseBackendUnreachable
    assert errors.classify(TimeoutError()) is LeaseBackendTimeout
    error = errors.translate(DriverRefused("nope\nmore"), key="k", where=" (server h:1)")
    assert str(error) == "demo: DriverRefused: nope (server h:1)"
    assert error.key == "k"


class StatusError(Exception):
    """One class for every failure, told apart by a status code (as gRPC's are)."""

    def __init__(self, code: str) -> None:
        super().__init__(f"status {code}")
        self.code = code


class StatusErrorMap(ErrorMap):
    __slots__ = ()

    def classify(self, exc: BaseException) -> type[LeaseBackendError]:
        if isinstance(exc, StatusError):
            return {"deadline": LeaseBackendTimeout, "refused": LeaseBackendUnreachable}.get(
                exc.code, LeaseBackendError
            )
        return super().classify(exc)


async def test_a_subclass_classifies_by_more_than_the_class_everywhere() -> None:
    errors = StatusErrorMap({StatusError: LeaseBackendError}, backend="demo")
    assert errors.classify(StatusError("deadline")) is LeaseBackendTimeout
    assert errors.classify(ConnectionRefusedError()) is LeaseBackendUnreachable
    assert type(errors.translate(StatusError("refused"))) is LeaseBackendUnreachable
    assert type(errors.translate(StatusError("other"))) is LeaseBackendError

    class StatusProvider(BackendProvider):
        backend: ClassVar[str] = "demo"
        errors: ClassVar[ErrorMap] = StatusErrorMap(
            {StatusError: LeaseBackendError}, backend="demo"
        )

    async def fail(code: str) -> None:
        raise StatusError(code)

    provider = StatusProvider(timeout_s=1, owns_client=True)
    with pytest.raises(LeaseBackendTimeout, match="status deadline") as info:
        await provider._call(fail("deadline"), "k")
    assert isinstance(info.value.__cause__, StatusError)
    with pytest.raises(LeaseBackendUnreachable):
        await provider._call_detached(fail("refused"), "k")
    await provider.aclose()


def test_map_errors_chains_the_driver_exception() -> None:
    with (
        pytest.raises(LeaseBackendUnreachable) as info,
        map_errors({DriverRefused: LeaseBackendUnreachable}, backend="demo", key="k"),
    ):
        raise DriverRefused("refused")
    assert isinstance(info.value.__cause__, DriverRefused)
    assert info.value.backend == "demo"
    # The translated error still pickles (its cause does not travel; its text does).
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)


# -- the provider base ---------------------------------------------------------------------


_SET_BY_DRIVER: contextvars.ContextVar[str] = contextvars.ContextVar(
    "set_by_driver", default="caller"
)


class Gate:
    """A driver call that answers when the test says so (or never)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0
        self.finished = 0
        self.cancelled = 0

    async def call(self, value: object = "ok") -> object:
        self.started += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        if isinstance(value, BaseException):
            raise value
        return value


class GateProvider(BackendProvider):
    backend: ClassVar[str] = "gate"
    capabilities: Capabilities = Capabilities()
    errors: ClassVar[ErrorMap] = ErrorMap({DriverRefused: LeaseBackendUnreachable}, backend="gate")

    def __init__(self, gate: Gate, *, timeout_s: float = 5.0, owns_client: bool = True) -> None:
        super().__init__(timeout_s=timeout_s, owns_client=owns_client)
        self.gate = gate
        self.client_closed = 0
        self.connected = 0

    async def _connect(self) -> None:
        self.connected += 1

    async def _close_client(self) -> None:
        self.client_closed += 1

    def _describe(self) -> str:
        return f"url={redact_url('gate://u:secret@h')!r}"

    async def op(self, value: object = "ok") -> object:
        return await self._call(self.gate.call(value), "k")

    async def detached(self, value: object = "ok") -> object:
        return await self._call_detached(self.gate.call(value), "k")


async def test_call_maps_driver_errors_and_passes_results() -> None:
    gate = Gate()
    gate.release.set()
    async with GateProvider(gate) as provider:
        assert await provider.op("x") == "x"
        with pytest.raises(LeaseBackendUnreachable, match="gate: DriverRefused: down"):
            await provider.op(DriverRefused("down"))
        with pytest.raises(LeaseBackendUnreachable):
            await provider.detached(DriverRefused("down"))
        assert await provider.detached("y") == "y"
    assert provider.connected == 1
    assert provider.client_closed == 1


@pytest.mark.parametrize("mode", ["op", "detached"])
async def test_a_call_that_never_answers_times_out_as_lease_backend_timeout(mode: str) -> None:
    provider = GateProvider(Gate(), timeout_s=0.05)
    call = provider.op if mode == "op" else provider.detached
    with pytest.raises(LeaseBackendTimeout, match=r"no answer within 0\.05 s") as info:
        await call()
    assert info.value.key == "k"
    await provider.aclose()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 runs detached calls in a task")
async def test_a_detached_call_runs_in_the_callers_task_with_its_own_context() -> None:
    seen: list[object] = []

    async def driver() -> str:
        seen.append(asyncio.current_task())
        _SET_BY_DRIVER.set("driver")
        await asyncio.sleep(0)
        return "ok"

    async with GateProvider(Gate()) as provider:
        assert await provider._call_detached(driver(), "k") == "ok"
    # No task (and no loop iteration) of its own; the driver's context changes stay its own.
    assert seen == [asyncio.current_task()]
    assert _SET_BY_DRIVER.get() == "caller"


class _LoopWithItsOwnClock(asyncio.SelectorEventLoop):
    """A loop whose clock is not time.monotonic(): a day ahead of it."""

    def time(self) -> float:
        return super().time() + 86400.0


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 times waiters, not tasks")
def test_deadlines_read_the_clock_of_the_loop_they_run_on() -> None:
    async def opened(deadlines: Deadlines) -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        before = loop.time()
        watch = deadlines.open()
        after = loop.time()
        assert watch is not None
        assert watch.task is asyncio.current_task()
        deadlines.close(watch)
        return before, watch.deadline, after

    for loop in (asyncio.new_event_loop(), _LoopWithItsOwnClock()):
        deadlines = Deadlines(5.0)
        try:
            before, deadline, after = loop.run_until_complete(opened(deadlines))
        finally:
            loop.close()
        assert before + 5.0 <= deadline <= after + 5.0, type(loop).__name__


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 times waiters, not tasks")
def test_a_detached_call_times_out_on_a_loop_with_its_own_clock() -> None:
    async def late() -> None:
        provider = GateProvider(Gate(), timeout_s=0.05)
        with pytest.raises(LeaseBackendTimeout):
            await provider._call_detached(asyncio.Event().wait(), "k")
        await provider.aclose()

    loop = _LoopWithItsOwnClock()
    try:
        loop.run_until_complete(late())
    finally:
        loop.close()


def test_deadlines_time_nothing_outside_a_task() -> None:
    deadlines = Deadlines(5.0)
    assert deadlines.open() is None  # no running loop
    seen: list[object] = []
    loop = asyncio.new_event_loop()
    try:
        loop.call_soon(lambda: seen.append(deadlines.open()))  # a callback, not a task
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert seen == [None]


async def test_a_detached_call_that_ignores_cancellation_is_abandoned_at_the_deadline() -> None:
    provider = GateProvider(Gate(), timeout_s=0.05)
    unwound = asyncio.Event()
    release = asyncio.Event()

    async def stubborn() -> None:
        # What psycopg does when cancelled: ask the server to cancel, then wait for it.
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()
            unwound.set()
            raise

    with pytest.raises(LeaseBackendTimeout):
        await provider._call_detached(stubborn(), "k")
    assert not unwound.is_set()  # the caller went on while the driver still unwinds
    closing = asyncio.ensure_future(provider.aclose())
    await asyncio.sleep(0)
    assert not closing.done()  # aclose waits for the abandoned call
    release.set()
    await closing
    assert unwound.is_set()


async def test_a_detached_call_waits_for_the_abandoned_calls_on_its_key() -> None:
    # An abandoned call may still reach the store (a frozen server runs it on waking):
    # a later call on the same key is sent only once it has settled, within its own
    # deadline; calls on other keys do not wait.
    provider = GateProvider(Gate(), timeout_s=0.2)
    release = asyncio.Event()
    order: list[str] = []

    async def stubborn(name: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()
            order.append(name)
            raise

    async def quick(name: str) -> str:
        order.append(name)
        return name

    with pytest.raises(LeaseBackendTimeout):
        await provider._call_detached(stubborn("abandoned k"), "k")
    assert await provider._call_detached(quick("other key"), "j") == "other key"
    too_early = quick("k, too early")
    with pytest.raises(LeaseBackendTimeout):
        await provider._call_detached(too_early, "k")
    later = asyncio.ensure_future(provider._call_detached(quick("k, later"), "k"))
    await asyncio.sleep(0.05)
    assert not later.done()
    release.set()
    assert await later == "k, later"
    assert order == ["other key", "abandoned k", "k, later"]
    # The call given up before it was sent was closed unstarted, not dropped (a dropped
    # one would stay "created", and this test would not tell).
    assert inspect.getcoroutinestate(too_early) == inspect.CORO_CLOSED
    assert provider._abandoned_by_key == {}
    await provider.aclose()


async def test_a_detached_call_handles_the_failures_of_its_own_futures() -> None:
    async def driver() -> str:
        inner = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(inner.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await inner  # the driver's own cancellation, not the caller's
        failing = asyncio.get_running_loop().create_future()
        failing.set_exception(KeyError("inner"))
        try:
            await failing
        except KeyError:
            return "recovered"
        return "unreachable"

    async with GateProvider(Gate()) as provider:
        assert await provider._call_detached(driver(), "k") == "recovered"


async def test_a_cancelled_detached_call_propagates_and_unwinds_in_the_background() -> None:
    gate = Gate()
    provider = GateProvider(gate, timeout_s=5)
    task = asyncio.ensure_future(provider.detached())
    for _ in range(3):  # a task of the call's own, where Python 3.10 makes one
        await asyncio.sleep(0)
    assert gate.started == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await provider.aclose()  # the abandoned call was cancelled and is settled
    # Cancelled, not dropped: a dropped call is neither finished nor cancelled.
    assert (gate.finished, gate.cancelled) == (0, 1)


async def test_a_cancel_from_elsewhere_is_not_turned_into_a_timeout() -> None:
    provider = GateProvider(Gate(), timeout_s=5)
    task = asyncio.ensure_future(provider.op())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await provider.aclose()


async def test_aclose_lets_operations_in_flight_finish_then_refuses_new_ones() -> None:
    gate = Gate()
    provider = GateProvider(gate)
    calls = [asyncio.ensure_future(provider.op(i)) for i in range(50)]
    calls += [asyncio.ensure_future(provider.detached(i)) for i in range(50)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert gate.started == 100
    closing = asyncio.ensure_future(provider.aclose())
    await asyncio.sleep(0)
    assert provider.closed
    with pytest.raises(LeaseProviderClosed):
        await provider.op()
    assert provider.client_closed == 0  # not while calls are in flight
    gate.release.set()
    await closing
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert results == list(range(50)) * 2
    assert provider.client_closed == 1
    await provider.aclose()  # a second close is a no-op
    assert provider.client_closed == 1


async def test_aclose_with_calls_that_never_answer_settles_each_with_a_lease_error() -> None:
    provider = GateProvider(Gate(), timeout_s=0.2)
    calls = [asyncio.ensure_future(provider.op()) for _ in range(25)]
    calls += [asyncio.ensure_future(provider.detached()) for _ in range(25)]
    await asyncio.sleep(0)
    await provider.aclose()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(result, LeaseError) for result in results), results
    assert provider.client_closed == 1


async def test_background_work_is_drained_then_cancelled_by_aclose() -> None:
    provider = GateProvider(Gate(), timeout_s=0.1)
    finished: list[str] = []

    async def quick() -> None:
        await asyncio.sleep(0)
        finished.append("quick")

    async def forever() -> None:
        await asyncio.Event().wait()

    provider._spawn(quick())
    stuck = provider._spawn(forever())
    await provider.aclose()
    assert finished == ["quick"]
    assert stuck.cancelled()


async def test_a_callers_client_is_never_closed() -> None:
    provider = GateProvider(Gate(), owns_client=False)
    await provider.aclose()
    assert provider.client_closed == 0


async def test_a_failed_connect_closes_what_was_opened() -> None:
    class Refusing(GateProvider):
        async def _connect(self) -> None:
            raise DriverRefused("refused")

    provider = Refusing(Gate())
    with pytest.raises(LeaseBackendUnreachable):
        await provider.__aenter__()
    assert provider.closed
    assert provider.client_closed == 1


async def test_repr_has_no_secret_and_says_closed() -> None:
    provider = GateProvider(Gate())
    assert repr(provider) == "GateProvider(url='gate://u:***@h')"
    await provider.aclose()
    assert repr(provider).endswith(", closed)")


def test_no_coroutine_is_left_unawaited_after_close() -> None:
    async def main() -> None:
        provider = GateProvider(Gate())
        await provider.aclose()
        with pytest.raises(LeaseProviderClosed):
            await provider.op()
        with pytest.raises(LeaseProviderClosed):
            await provider.detached()

    asyncio.run(main())  # filterwarnings=error turns a RuntimeWarning into a failure


def test_supports_checks_the_extras_structurally() -> None:
    class Lister:
        async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[Any]:
            return []

    assert supports(Lister(), SupportsInspect)
    assert not supports(Lister(), SupportsMigrate)
    with pytest.raises(TypeError):
        supports(Lister(), int)


async def test_aclose_closes_the_release_listener_first_and_break_reaches_it() -> None:
    events: list[str] = []

    class Listener:
        async def aclose(self) -> None:
            events.append("listener closed")

        async def break_connection(self) -> None:
            events.append("broken")

    class Notifying(GateProvider):
        async def _close_client(self) -> None:
            events.append("client closed")

    provider = Notifying(Gate())
    provider._release_listener = Listener()
    await provider.break_notifications()
    await provider.aclose()
    await provider.aclose()
    assert events == ["broken", "listener closed", "client closed"]


# -- stop_task ----------------------------------------------------------------------------


async def test_stop_task_cancels_a_reader_and_waits_for_it_to_end() -> None:
    ended = asyncio.Event()

    async def reader() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()

    task = asyncio.get_running_loop().create_task(reader())
    await asyncio.sleep(0)
    await stop_task(task, 5.0)
    assert task.cancelled()
    assert ended.is_set()
    await stop_task(None, 5.0)  # nothing to stop


async def test_stop_task_gives_up_on_a_task_that_ignores_the_cancel() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    task = asyncio.get_running_loop().create_task(stubborn())
    await asyncio.sleep(0)
    await stop_task(task, 0.05)
    assert not task.done()  # left running, not waited for past the bound
    release.set()
    await task


# -- FifoGate -----------------------------------------------------------------------------


async def _queue(gate: FifoGate, names: list[str], served: list[str]) -> list[asyncio.Task[None]]:
    """One task per name waiting on ``gate`` in that order; each notes when it is served."""

    async def wait(name: str) -> None:
        await gate.acquire()
        served.append(name)

    tasks = []
    for name in names:
        tasks.append(asyncio.get_running_loop().create_task(wait(name)))
        await asyncio.sleep(0)  # queued before the next one starts
    return tasks


async def test_fifo_gate_serves_waiters_in_arrival_order_and_newcomers_queue() -> None:
    gate = FifoGate(2)
    await gate.acquire()
    await gate.acquire()  # both places held, without waiting
    served: list[str] = []
    tasks = await _queue(gate, ["w1", "w2", "w3"], served)
    assert (gate.held, gate.waiting) == (2, 3)
    gate.release()
    # A newcomer arriving right after a release queues behind the waiters: the freed
    # place went straight to w1, whether or not w1 has run yet.
    tasks += await _queue(gate, ["late"], served)
    gate.release()
    await asyncio.sleep(0)
    assert served == ["w1", "w2"]
    for _ in range(2):
        gate.release()
        await asyncio.sleep(0)
    assert served == ["w1", "w2", "w3", "late"]
    await asyncio.gather(*tasks)
    assert (gate.held, gate.waiting) == (2, 0)
    gate.release()
    gate.release()
    assert gate.held == 0
    with pytest.raises(RuntimeError, match="more often than acquired"):
        gate.release()


async def test_fifo_gate_try_acquire_takes_a_free_place_only_when_nobody_waits() -> None:
    gate = FifoGate(1)
    assert gate.try_acquire()
    assert not gate.try_acquire()
    served: list[str] = []
    (waiter,) = await _queue(gate, ["waiter"], served)
    gate.release()  # to the waiter, not to a newcomer's try_acquire()
    assert not gate.try_acquire()
    await waiter
    assert served == ["waiter"]
    gate.release()
    assert gate.try_acquire()
    gate.release()


async def test_fifo_gate_a_cancelled_waiter_gives_up_its_place() -> None:
    gate = FifoGate(1)
    async with gate:
        served: list[str] = []
        first, second, third = await _queue(gate, ["first", "second", "third"], served)
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert gate.waiting == 2
    await asyncio.sleep(0)
    assert served == ["first"]
    gate.release()
    await asyncio.gather(first, third)
    assert served == ["first", "third"]
    gate.release()
    assert (gate.held, gate.waiting) == (0, 0)


async def test_fifo_gate_a_place_handed_to_a_waiter_cancelled_meanwhile_passes_on() -> None:
    gate = FifoGate(1)
    await gate.acquire()
    served: list[str] = []
    first, second = await _queue(gate, ["first", "second"], served)
    gate.release()  # handed to first, which has not run yet ...
    first.cancel()  # ... and is cancelled before it does
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert served == ["second"]
    assert (gate.held, gate.waiting) == (1, 0)
    gate.release()
    assert gate.held == 0


async def test_fifo_gate_a_wait_bounded_by_a_timeout_leaves_the_queue() -> None:
    gate = FifoGate(1)
    await gate.acquire()
    with pytest.raises((TimeoutError, asyncio.TimeoutError)):
        await asyncio.wait_for(gate.acquire(), 0.01)
    assert (gate.held, gate.waiting) == (1, 0)
    gate.release()
    await asyncio.wait_for(gate.acquire(), 5)
    assert repr(gate) == "FifoGate(size=1, held=1, waiting=0)"


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "2"])
def test_fifo_gate_refuses_a_size_below_one(size: Any) -> None:
    with pytest.raises(ValueError, match="size must be an int of at least 1"):
        FifoGate(size)


# -- undoing a grant whose caller never learned of it -------------------------------------


class LostReplyProvider(BackendProvider):
    """Grants at once in a dict, answers when the test says so: a reply that can be lost.

    ``detached=True`` runs acquire through ``_call_detached`` (as PostgreSQL does),
    and then the backend offers ``release_grant``.
    """

    backend: ClassVar[str] = "lost-reply"
    capabilities: Capabilities = Capabilities(fencing=True)
    errors: ClassVar[ErrorMap] = ErrorMap({}, backend="lost-reply")

    def __init__(self, *, timeout_s: float = 5.0) -> None:
        super().__init__(timeout_s=timeout_s, owns_client=False)
        self.leases: dict[str, tuple[str, int]] = {}
        self.last_token = 0
        self.reply: asyncio.Future[None] | None = None
        self.log: list[tuple[str, str, str]] = []  # (what, key, owner), in store order
        self.granted = asyncio.Event()

    def _grant(self, key: str, owner: str) -> LeaseResult:
        held = self.leases.get(key)
        if held is not None and held[0] != owner:
            return LeaseResult(False, held[0], None)
        if held is None:
            self.last_token += 1
            held = self.leases[key] = (owner, self.last_token)
        self.log.append(("grant", key, owner))
        self.granted.set()
        return LeaseResult(True, owner, held[1])

    async def _acquire(self, key: str, owner: str) -> LeaseResult:
        result = self._grant(key, owner)  # lands in the store before the reply is awaited
        if self.reply is not None:
            await self.reply
        return result

    async def _release(self, key: str, owner: str, token: int | None = None) -> None:
        held = self.leases.get(key)
        if held is not None and held[0] == owner and token in (None, held[1]):
            del self.leases[key]
            self.log.append(("release" if token is None else "release_grant", key, owner))

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        if self._undos:
            await self._after_undo(key, owner)
        return await self._call(self._acquire(key, owner), key, owner)

    async def release_lease(self, key: str, owner: str) -> None:
        await self._call(self._release(key, owner), key)

    async def get_lease_owner(self, key: str) -> str | None:
        held = self.leases.get(key)
        return None if held is None else held[0]

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return key in self.leases and self.leases[key][0] == owner

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        raise NotImplementedError


class DetachedLostReplyProvider(LostReplyProvider):
    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        if self._undos:
            await self._after_undo(key, owner)
        return await self._call_detached(self._acquire(key, owner), key, owner)

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        await self._call(self._release(key, owner, token), key)


async def _undos_done(provider: BackendProvider) -> None:
    while provider._undos:
        await asyncio.wait(set(provider._undos.values()))


async def _cancelled_after_the_grant(provider: LostReplyProvider, key: str, owner: str) -> None:
    provider.reply = asyncio.get_running_loop().create_future()
    provider.granted.clear()
    task = asyncio.ensure_future(provider.acquire_lease(key, owner, 1000))
    await provider.granted.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    provider.reply = None


@pytest.mark.parametrize("kind", [LostReplyProvider, DetachedLostReplyProvider])
async def test_a_cancelled_grant_is_undone_in_the_background(kind: type[LostReplyProvider]) -> None:
    async with kind() as provider:
        await _cancelled_after_the_grant(provider, "k", "a")
        await _undos_done(provider)
        assert provider.leases == {}
        assert provider.log[-1] == ("release", "k", "a")


@pytest.mark.parametrize("kind", [LostReplyProvider, DetachedLostReplyProvider])
async def test_a_grant_after_a_cancelled_one_is_never_undone(kind: type[LostReplyProvider]) -> None:
    # The same owner acquires again at once: an idempotent re-acquire would keep the
    # token, so only the order tells the grants apart. The new grant waits for the undo.
    async with kind() as provider:
        await _cancelled_after_the_grant(provider, "k", "a")
        again = await provider.acquire_lease("k", "a", 1000)
        assert again.acquired
        await _undos_done(provider)
        assert provider.leases["k"] == ("a", again.token)
        assert provider.log[-1] == ("grant", "k", "a")
        assert ("release", "k", "a") in provider.log


async def test_a_detached_grant_whose_reply_had_arrived_is_undone_by_its_token() -> None:
    async with DetachedLostReplyProvider() as provider:
        reply = provider.reply = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(provider.acquire_lease("k", "a", 1000))
        await provider.granted.wait()
        reply.set_result(None)
        task.cancel()  # in the same loop turn: the reply is there, its reader is cancelled
        with pytest.raises(asyncio.CancelledError):
            await task
        await _undos_done(provider)
        assert provider.leases == {}
        assert provider.log[-1] == ("release_grant", "k", "a")


@pytest.mark.parametrize("kind", [LostReplyProvider, DetachedLostReplyProvider])
async def test_a_timed_out_grant_is_kept_until_undo_grant(kind: type[LostReplyProvider]) -> None:
    async with kind(timeout_s=0.05) as provider:
        provider.reply = asyncio.get_running_loop().create_future()
        with pytest.raises(LeaseBackendTimeout):
            await provider.acquire_lease("k", "a", 1000)
        assert provider.leases["k"][0] == "a"  # unknown to the caller, who may retry
        provider.undo_grant("k", "a")
        await _undos_done(provider)
        assert provider.leases == {}


async def test_aclose_drains_a_pending_undo() -> None:
    provider = LostReplyProvider()
    async with provider:
        await _cancelled_after_the_grant(provider, "k", "a")
    assert provider.closed
    assert provider.leases == {}


async def test_hold_undoes_a_timed_out_acquire() -> None:
    async with LostReplyProvider(timeout_s=0.05) as provider:
        provider.reply = asyncio.get_running_loop().create_future()
        with pytest.raises(LeaseBackendTimeout):
            async with leasekit.hold(provider, "k", "a", ttl_ms=1000):
                pytest.fail("the body must not run")
        await _undos_done(provider)
        assert provider.leases == {}


async def test_a_cancellation_the_driver_swallowed_is_raised_and_its_grant_undone() -> None:
    # As Python 3.11's asyncio.wait_for does when a result races the cancellation.
    class SwallowingProvider(LostReplyProvider):
        async def _acquire(self, key: str, owner: str) -> LeaseResult:
            result = self._grant(key, owner)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)
            return result

    async with SwallowingProvider() as provider:
        task = asyncio.ensure_future(provider.acquire_lease("k", "a", 1000))
        await provider.granted.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _undos_done(provider)
        assert provider.leases == {}


class SlowReleaseProvider(LostReplyProvider):
    """A :class:`LostReplyProvider` whose first ``slow`` releases never answer in time."""

    def __init__(self, *, slow: int) -> None:
        super().__init__(timeout_s=0.05)
        self.slow = slow

    async def _release(self, key: str, owner: str, token: int | None = None) -> None:
        if self.slow > 0:
            self.slow -= 1
            await asyncio.Event().wait()  # cut off at timeout_s
        await super()._release(key, owner, token)


async def test_an_undo_whose_release_times_out_sends_it_again() -> None:
    # A busy pool or a loaded store: the undo's first release times out. Given up then,
    # the key stayed held for its whole TTL (a CI run's PostgreSQL cancel check).
    async with SlowReleaseProvider(slow=2) as provider:
        await _cancelled_after_the_grant(provider, "k", "a")
        await _undos_done(provider)
        assert provider.leases == {}
        assert provider.slow == 0
