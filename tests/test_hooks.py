"""Event hooks: the emitting provider, hold()'s events, plugin loading, logging and OpenTelemetry.

Plugins are process-wide, so every test leaves none registered (checked by an autouse
fixture); loading from entry points runs in a fresh interpreter.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest
from faults import ScriptedProvider, documented_output, eventually, run_example, shared_url
from servers import require_module

import leasekit
import leasekit.plugins
from leasekit import (
    LeasekitWarning,
    LeaseLost,
    LeaseProviderClosed,
    ManagedLeaseProvider,
    MemoryLeaseProvider,
)

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
LONG_TTL_MS = 60_000


class Recorder:
    """Records every event as a tuple; latencies separately, to check their type."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.latencies: list[float | None] = []

    @leasekit.hookimpl
    def leasekit_acquired(
        self, key: str, owner: str, backend: str, token: int | None, latency_s: float
    ) -> None:
        self.events.append(("acquired", key, owner, backend, token))
        self.latencies.append(latency_s)

    @leasekit.hookimpl
    def leasekit_denied(
        self, key: str, owner: str, holder: str | None, backend: str, latency_s: float
    ) -> None:
        self.events.append(("denied", key, owner, holder, backend))
        self.latencies.append(latency_s)

    @leasekit.hookimpl
    def leasekit_renewed(self, key: str, owner: str, backend: str, latency_s: float) -> None:
        self.events.append(("renewed", key, owner, backend))
        self.latencies.append(latency_s)

    @leasekit.hookimpl
    def leasekit_lost(
        self, key: str, owner: str, backend: str, reason: str, latency_s: float | None
    ) -> None:
        self.events.append(("lost", key, owner, backend, reason))
        self.latencies.append(latency_s)

    @leasekit.hookimpl
    def leasekit_released(self, key: str, owner: str, backend: str, latency_s: float) -> None:
        self.events.append(("released", key, owner, backend))
        self.latencies.append(latency_s)

    @leasekit.hookimpl
    def leasekit_transferred(
        self, key: str, owner: str, to_owner: str, backend: str, latency_s: float
    ) -> None:
        self.events.append(("transferred", key, owner, to_owner, backend))
        self.latencies.append(latency_s)

    @leasekit.hookimpl
    def leasekit_failed(
        self, operation: str, key: str, owner: str | None, error: BaseException
    ) -> None:
        self.events.append(("failed", operation, key, owner, type(error).__name__))

    def kinds(self) -> list[str]:
        return [event[0] for event in self.events]


async def hold_until_cancelled(lease: leasekit.LeaseHold) -> None:
    async with lease:
        await eventually(lambda: False, "the loss to cancel this")


@pytest.fixture(autouse=True)
def no_plugin_left_behind() -> Iterator[None]:
    assert leasekit.plugins.registered() == [], "a previous test leaked a plugin"
    yield
    leftovers = leasekit.plugins.registered()
    for plugin in leftovers:
        leasekit.plugins.unregister(plugin)
    assert leftovers == []


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    plugin = Recorder()
    leasekit.plugins.register(plugin)
    yield plugin
    leasekit.plugins.unregister(plugin)


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return shared_url(request.param, str(tmp_path), f"hooks-{uuid.uuid4().hex}")


@pytest.fixture
async def hooked(url: str, recorder: Recorder) -> AsyncIterator[ManagedLeaseProvider]:
    async with leasekit.connect(url) as provider:
        yield provider


# -- connect(): zero cost without plugins, one event per operation with them ----------------


def test_without_plugins_connect_returns_the_backends_own_provider() -> None:
    provider = leasekit.connect("memory://")
    assert type(provider) is MemoryLeaseProvider


async def test_with_a_plugin_connect_returns_an_emitting_provider(
    hooked: ManagedLeaseProvider, url: str
) -> None:
    scheme = url.partition(":")[0]
    assert type(hooked).__name__ == "HookedLeaseProvider"
    assert leasekit.is_lease_provider(hooked)
    assert hooked.capabilities == leasekit.capabilities_of(hooked.wrapped)  # type: ignore[attr-defined]
    assert hooked.backend == scheme  # type: ignore[attr-defined]
    # Backend extras are forwarded: SQLite's path, memory's store name.
    extra = "path" if scheme == "sqlite" else "name"
    assert getattr(hooked, extra) == getattr(hooked.wrapped, extra)  # type: ignore[attr-defined]
    async with hooked as entered:
        assert entered is hooked


async def test_every_operation_emits_its_event(
    hooked: ManagedLeaseProvider, recorder: Recorder, url: str
) -> None:
    backend = url.partition(":")[0]
    first = await hooked.acquire_lease("k", "a", LONG_TTL_MS)
    await hooked.acquire_lease("k", "b", LONG_TTL_MS)
    assert await hooked.get_lease_owner("k") == "a"  # reads are not events
    assert await hooked.renew_lease("k", "a", LONG_TTL_MS)
    assert not await hooked.renew_lease("k", "b", LONG_TTL_MS)
    assert await hooked.transfer_lease("k", "a", "b", LONG_TTL_MS)
    assert not await hooked.transfer_lease("k", "a", "c", LONG_TTL_MS)
    await hooked.release_lease("k", "b")
    assert recorder.events == [
        ("acquired", "k", "a", backend, first.token),
        ("denied", "k", "b", "a", backend),
        ("renewed", "k", "a", backend),
        ("lost", "k", "b", backend, "renew_refused"),
        ("transferred", "k", "a", "b", backend),
        ("lost", "k", "a", backend, "transfer_refused"),
        ("released", "k", "b", backend),
    ]
    assert all(isinstance(s, float) and s >= 0 for s in recorder.latencies)


async def test_failures_are_events_and_bad_arguments_are_not(url: str, recorder: Recorder) -> None:
    provider = leasekit.connect(url)
    async with provider:
        with pytest.raises(leasekit.InvalidLeaseArgument):
            await provider.acquire_lease("", "a", 1000)
    with pytest.raises(LeaseProviderClosed):
        await provider.acquire_lease("k", "a", 1000)
    with pytest.raises(LeaseProviderClosed):
        await provider.get_lease_owner("k")
    assert recorder.events == [
        ("failed", "acquire", "k", "a", "LeaseProviderClosed"),
        ("failed", "owner", "k", None, "LeaseProviderClosed"),
    ]


async def test_events_follow_registration_not_connection(recorder: Recorder) -> None:
    async with leasekit.connect("memory://") as provider:
        leasekit.plugins.unregister(recorder)
        await provider.acquire_lease("k", "a", 1000)  # wrapped, but nobody listens
        leasekit.plugins.register(recorder)
        await provider.release_lease("k", "a")
    assert recorder.kinds() == ["released"]


async def test_a_plugin_that_raises_is_reported_and_changes_nothing() -> None:
    class Faulty:
        @leasekit.hookimpl
        def leasekit_acquired(self, key: str) -> None:
            raise RuntimeError("observer bug")

    plugin = leasekit.plugins.register(Faulty())
    try:
        async with leasekit.connect("memory://") as provider:
            with pytest.warns(LeasekitWarning, match="leasekit_acquired raised RuntimeError"):
                result = await provider.acquire_lease("k", "a", 1000)
            assert result.acquired
            assert await provider.get_lease_owner("k") == "a"
    finally:
        leasekit.plugins.unregister(plugin)


# -- hold() -------------------------------------------------------------------------------


async def test_hold_emits_its_lifecycle_once_per_event(
    hooked: ManagedLeaseProvider, recorder: Recorder, url: str
) -> None:
    backend = url.partition(":")[0]
    async with leasekit.hold(hooked, "k", "a", LONG_TTL_MS, renew_every_ms=5) as lease:
        await eventually(lambda: recorder.kinds().count("renewed") >= 2, "renewed events")
    kinds = recorder.kinds()
    assert kinds[0] == "acquired"
    assert kinds[-1] == "released"
    assert set(kinds[1:-1]) == {"renewed"}
    assert recorder.events[0] == ("acquired", "k", "a", backend, lease.token)
    assert recorder.events[-1] == ("released", "k", "a", backend)


async def test_hold_on_an_unwrapped_provider_emits_too(recorder: Recorder) -> None:
    provider = MemoryLeaseProvider()  # made without connect(): never wrapped
    async with leasekit.hold(provider, "k", "a", LONG_TTL_MS) as lease:
        await lease.transfer_to("b")
    assert recorder.events[0][:4] == ("acquired", "k", "a", "memory")
    assert recorder.events[1] == ("transferred", "k", "a", "b", "memory")
    assert len(recorder.events) == 2


async def test_hold_reports_failed_renewals_and_the_expiry(recorder: Recorder) -> None:
    # A loop stalled for the whole TTL makes no renewal at all; that try shows nothing
    # about failed renewals, so it runs again (a stall is never the test's failure).
    for _ in range(3):
        recorder.events.clear()
        scripted = ScriptedProvider(MemoryLeaseProvider())
        scripted.renew_mode = "fail"
        with pytest.raises(LeaseLost):
            await hold_until_cancelled(leasekit.hold(scripted, "k", "a", 1000, renew_every_ms=50))
        if scripted.renew_calls > 0:
            break
    assert scripted.renew_calls > 0, "the hold never tried to renew in three tries"
    kinds = recorder.kinds()
    # Every renewal failed and was reported as it failed, all before the loss.
    assert kinds == ["acquired"] + ["failed"] * scripted.renew_calls + ["lost"], kinds
    assert set(recorder.events[1:-1]) == {("failed", "renew", "k", "a", "LeaseBackendError")}
    assert recorder.events[-1] == ("lost", "k", "a", "ScriptedProvider", "expired")
    assert recorder.latencies[-1] is None


async def test_denied_hold_emits_denied(hooked: ManagedLeaseProvider, recorder: Recorder) -> None:
    await hooked.acquire_lease("k", "b", LONG_TTL_MS)
    with pytest.raises(leasekit.LeaseHeld):
        async with leasekit.hold(hooked, "k", "a", LONG_TTL_MS):
            pass
    assert recorder.kinds() == ["acquired", "denied"]


# -- registering --------------------------------------------------------------------------


def test_register_checks_hooks_against_the_specs() -> None:
    class Typo:
        @leasekit.hookimpl
        def leasekit_aquired(self, key: str) -> None: ...

    class UnknownArgument:
        @leasekit.hookimpl
        def leasekit_acquired(self, key: str, colour: str) -> None: ...

    class Unmarked:
        def leasekit_acquired(self, key: str) -> None: ...

    with pytest.raises(pluggy.PluginValidationError, match="unknown hook 'leasekit_aquired'"):
        leasekit.plugins.register(Typo())
    with pytest.raises(pluggy.PluginValidationError, match="colour"):
        leasekit.plugins.register(UnknownArgument())
    with pytest.raises(leasekit.InvalidLeaseArgument, match="hookimpl"):
        leasekit.plugins.register(Unmarked())
    assert leasekit.plugins.registered() == []


def test_register_twice_is_an_error_and_unregister_is_forgiving(recorder: Recorder) -> None:
    with pytest.raises(ValueError, match="already registered"):
        leasekit.plugins.register(recorder)
    leasekit.plugins.unregister(Recorder())  # never registered: nothing happens
    assert leasekit.plugins.registered() == [recorder]


def test_hookimpl_and_the_manager_are_pluggys() -> None:
    assert leasekit.hookimpl is leasekit.hookspecs.hookimpl
    manager = leasekit.plugins.plugin_manager()
    assert manager.project_name == "leasekit"
    specs = {name for name in dir(manager.hook) if name.startswith("leasekit_")}
    assert specs == {
        "leasekit_acquired",
        "leasekit_denied",
        "leasekit_failed",
        "leasekit_lost",
        "leasekit_released",
        "leasekit_renewal_lag",
        "leasekit_renewed",
        "leasekit_transferred",
        "leasekit_waited",
    }


# -- the logging plugin -------------------------------------------------------------------


@pytest.fixture
def logging_plugin() -> Iterator[leasekit.plugins.LoggingPlugin]:
    plugin = leasekit.plugins.enable_logging()
    yield plugin
    leasekit.plugins.unregister(plugin)


async def test_enable_logging_logs_events_with_structured_extras(
    logging_plugin: leasekit.plugins.LoggingPlugin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="leasekit")
    async with leasekit.connect("memory://") as provider:
        await provider.acquire_lease("thread\x00a", "worker-1", 1000)
        await provider.renew_lease("thread\x00a", "worker-1", 1000)
        await provider.renew_lease("thread\x00a", "worker-2", 1000)
    records = [r for r in caplog.records if r.name == "leasekit"]
    assert [(r.levelno, r.lease_event) for r in records] == [  # type: ignore[attr-defined]
        (logging.INFO, "acquired"),
        (logging.DEBUG, "renewed"),
        (logging.WARNING, "lost"),
    ]
    acquired = records[0]
    assert acquired.lease_key == "thread\x00a"  # type: ignore[attr-defined]
    assert acquired.lease_owner == "worker-1"  # type: ignore[attr-defined]
    assert acquired.lease_backend == "memory"  # type: ignore[attr-defined]
    assert isinstance(acquired.lease_token, int)  # type: ignore[attr-defined]
    assert isinstance(acquired.lease_latency_s, float)  # type: ignore[attr-defined]
    message = acquired.getMessage()
    assert message.startswith("lease acquired key='thread\\x00a' owner='worker-1' backend=memory")
    assert records[2].lease_reason == "renew_refused"  # type: ignore[attr-defined]


def test_enable_logging_is_idempotent_and_reconfigures(
    logging_plugin: leasekit.plugins.LoggingPlugin,
) -> None:
    again = leasekit.plugins.enable_logging(logging.WARNING, logger="myapp.leases")
    assert again is logging_plugin
    assert leasekit.plugins.registered() == [logging_plugin]
    assert (again.level, again.logger.name) == (logging.WARNING, "myapp.leases")


async def test_the_logging_plugin_takes_over_holds_own_warnings(
    logging_plugin: leasekit.plugins.LoggingPlugin, caplog: pytest.LogCaptureFixture
) -> None:
    # hold() logs failures itself only when no plugin is registered: one record each.
    caplog.set_level(logging.WARNING, logger="leasekit")
    scripted = ScriptedProvider(MemoryLeaseProvider())
    scripted.renew_mode = "refuse"
    with pytest.raises(LeaseLost):
        await hold_until_cancelled(leasekit.hold(scripted, "k", "a", 1000, renew_every_ms=5))
    lost = [r for r in caplog.records if "lost" in r.getMessage()]
    assert len(lost) == 1
    assert lost[0].lease_event == "lost"  # type: ignore[attr-defined]


# -- the OpenTelemetry plugin ----------------------------------------------------------------


async def test_otel_plugin_counts_operations_and_records_latency() -> None:
    require_module("opentelemetry.sdk.metrics", extra="self-test")
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
    from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
        Histogram,
        InMemoryMetricReader,
        Sum,
    )

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    plugin = leasekit.plugins.enable_otel(meter_provider=meters)
    try:
        async with leasekit.connect("memory://") as provider:
            await provider.acquire_lease("k", "a", 1000)
            await provider.acquire_lease("k", "b", 1000)
            await provider.acquire_lease("k", "b", 1000)
            await provider.release_lease("k", "a")
        with pytest.raises(LeaseProviderClosed):
            await provider.renew_lease("k", "a", 1000)
        data = reader.get_metrics_data()
    finally:
        leasekit.plugins.unregister(plugin)
        meters.shutdown()
    assert data is not None
    metrics = {
        metric.name: metric.data
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        if scope.scope.name == "leasekit"
        for metric in scope.metrics
    }
    counter, histogram = metrics["lease.operations"], metrics["lease.operation.duration"]
    assert isinstance(counter, Sum)
    assert isinstance(histogram, Histogram)
    counts = {}
    for point in counter.data_points:
        assert point.attributes is not None
        labels = point.attributes
        key = (labels["lease.operation"], labels["lease.outcome"], labels.get("error.type"))
        counts[key] = point.value
    assert counts == {
        ("acquire", "acquired", None): 1,
        ("acquire", "denied", None): 2,
        ("release", "released", None): 1,
        ("renew", "error", "LeaseProviderClosed"): 1,
    }
    assert sum(point.count for point in histogram.data_points) == 5
    assert {(p.attributes or {}).get("lease.backend") for p in histogram.data_points} == {"memory"}


# -- loading: entry points, laziness (fresh interpreters) -----------------------------------


def run_python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **env}
    environment.pop(leasekit.plugins.AUTOLOAD_ENV, None)
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def plugin_site(tmp_path: Path) -> Path:
    """A directory holding an installed distribution with one good and one broken plugin."""
    site = tmp_path / "site"
    dist = site / "fake_plugins-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugins\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[leasekit.plugins]\ngood = good_plugin:Printer\nbroken = broken_plugin\n"
    )
    (site / "good_plugin.py").write_text(
        textwrap.dedent(
            """
            import leasekit

            class Printer:
                @leasekit.hookimpl
                def leasekit_acquired(self, key, owner):
                    print(f"good plugin saw {owner} acquire {key}")
            """
        )
    )
    (site / "broken_plugin.py").write_text("raise RuntimeError('broken on import')\n")
    return site


PROBE = """
    import asyncio, sys, leasekit

    async def main():
        async with leasekit.connect("memory://") as provider:
            await provider.acquire_lease("k", "a", 1000)
            async with leasekit.hold(provider, "h", "a", 1000):
                pass
            await leasekit.wait_for(provider, "w", "a", 1000, 0)

    asyncio.run(main())
    print("pluggy loaded:", "pluggy" in sys.modules)
"""


def test_entry_point_plugins_load_and_a_broken_one_is_isolated(
    plugin_site: Path, tmp_path: Path
) -> None:
    done = run_python(PROBE, tmp_path, PYTHONPATH=str(plugin_site))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "good plugin saw a acquire k",
        "good plugin saw a acquire h",
        "good plugin saw a acquire w",
        "pluggy loaded: True",
    ]
    assert "LeasekitWarning: skipping leasekit plugin 'broken'" in done.stderr
    assert "'fake-plugins'" in done.stderr
    assert "broken on import" in done.stderr


def test_entry_point_plugins_load_for_hold_without_connect(
    plugin_site: Path, tmp_path: Path
) -> None:
    code = """
        import asyncio, leasekit

        async def main():
            async with leasekit.hold(leasekit.MemoryLeaseProvider(), "h", "a", 1000):
                pass

        asyncio.run(main())
    """
    done = run_python(code, tmp_path, PYTHONPATH=str(plugin_site))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["good plugin saw a acquire h"]
    assert "skipping leasekit plugin 'broken'" in done.stderr


def test_autoload_can_be_disabled(plugin_site: Path, tmp_path: Path) -> None:
    done = run_python(
        PROBE,
        tmp_path,
        PYTHONPATH=str(plugin_site),
        **{leasekit.plugins.AUTOLOAD_ENV: "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["pluggy loaded: False"]
    assert done.stderr == ""


def test_without_plugins_pluggy_is_never_imported(tmp_path: Path) -> None:
    done = run_python(PROBE, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["pluggy loaded: False"]


def test_the_otel_plugin_stays_unimported_until_enabled(tmp_path: Path) -> None:
    done = run_python(
        """
        import sys, leasekit, leasekit.plugins
        leasekit.plugins.enable_logging()
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- the benchmark script runs (its numbers are for people, not for asserts) ----------------


def test_the_overhead_benchmark_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "hooks_overhead.py"), "--ops", "200"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for label in ("no plugin", "no-op plugin", "logging plugin"):
        assert any(line.startswith(label) and "ops/s" in line for line in lines), lines


# -- the documented example -----------------------------------------------------------------


def test_the_documented_example_prints_what_the_page_shows(tmp_path: Path) -> None:
    assert run_example("hooks_example.py", tmp_path) == documented_output(
        "hooks.md", "hooks_example.py"
    )
