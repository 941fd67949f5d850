"""Lease metrics: the Prometheus plugin scraped over HTTP, the same instruments in OpenTelemetry.

The lease work runs on SQLite (a real store, always available): acquires granted and
refused, a wait that times out, holds that renew, a hold whose lease is released behind
its back (lost, renew refused), and a Lock. The Prometheus test serves the metrics with
prometheus_client's own HTTP server on a free loopback port and reads them as Prometheus
would; counts are exact where the work fixes them, lower bounds where the store decides
(how many refusals a timed-out wait saw).
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import require_module

import leasekit
import leasekit.plugins
from leasekit import LeaseHeld

prometheus_client = require_module("prometheus_client", extra="prometheus")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def lease_work(url: str, renewal_count: Any) -> None:
    """The same work for both plugins; ``renewal_count()`` reads renewals recorded so far."""
    async with leasekit.connect(url) as provider:
        assert (await provider.acquire_lease("k", "a", 60_000)).acquired
        assert not (await provider.acquire_lease("k", "b", 60_000)).acquired
        with pytest.raises(LeaseHeld):
            await leasekit.wait_for(provider, "k", "b", 60_000, timeout_s=0.1, poll_s=0.02)
        async with leasekit.hold(provider, "h", "x", 600, renew_every_ms=100) as held:
            while renewal_count() < 2:  # noqa: ASYNC110 (until two renewals landed, however slowly)
                await asyncio.sleep(0.02)
            assert not held.lost.is_set()
        async with leasekit.hold(
            provider, "y", "h1", 600, renew_every_ms=100, on_lost="flag"
        ) as lost:
            await provider.release_lease("y", "h1")  # behind the hold's back
            await lost.lost.wait()
            assert lost.lost_reason == "renew_refused"
        async with leasekit.Lock(provider, "L", timeout=5):
            pass
        await provider.release_lease("k", "a")


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode("utf-8")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, frozenset({"backend": "sqlite", **labels}.items())]


@pytest.fixture
def registry() -> Iterator[Any]:
    made = prometheus_client.CollectorRegistry()
    plugin = leasekit.plugins.enable_prometheus(made)
    try:
        yield made
    finally:
        leasekit.plugins.unregister(plugin)
        plugin.close()


def test_prometheus_metrics_are_scraped_over_http(registry: Any, tmp_path: Path) -> None:
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        port = server.server_port

        def renewals() -> float:
            count = registry.get_sample_value(
                "leasekit_renewal_lag_seconds_count", {"backend": "sqlite"}
            )
            return count or 0.0

        asyncio.run(lease_work(f"sqlite:///{tmp_path}/leases.db", renewals))
        samples = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

    # Granted: k to a, the two holds, the Lock. Refused: b once, then the wait's tries.
    assert value(samples, "leasekit_acquires_total", outcome="acquired") == 4
    assert value(samples, "leasekit_acquires_total", outcome="denied") >= 3
    # Waits: the two holds and the Lock got theirs; wait_for gave up after >= 0.1 s.
    assert value(samples, "leasekit_wait_seconds_count", outcome="acquired") == 3
    assert value(samples, "leasekit_wait_seconds_count", outcome="timed_out") == 1
    assert value(samples, "leasekit_wait_seconds_sum", outcome="timed_out") >= 0.1
    # Holds ended by release: h (after two renewals), y (behind its back), L, k.
    assert value(samples, "leasekit_hold_seconds_count", end="released") == 4
    assert value(samples, "leasekit_hold_seconds_sum", end="released") >= 0.1
    assert (
        "leasekit_hold_seconds_count",
        frozenset({"backend": "sqlite", "end": "lost"}.items()),
    ) not in samples
    assert value(samples, "leasekit_leases_lost_total", reason="renew_refused") == 1
    assert value(samples, "leasekit_renewal_lag_seconds_count") >= 2
    assert value(samples, "leasekit_renewal_lag_seconds_sum") >= 0


def test_enable_prometheus_again_replaces_the_metrics(tmp_path: Path) -> None:
    made = prometheus_client.CollectorRegistry()
    first = leasekit.plugins.enable_prometheus(made)
    second = leasekit.plugins.enable_prometheus(made)  # no "Duplicated timeseries" error
    try:
        assert first not in leasekit.plugins.registered()
        assert second in leasekit.plugins.registered()

        async def work() -> None:
            async with leasekit.connect(f"sqlite:///{tmp_path}/leases.db") as provider:
                await provider.acquire_lease("k", "a", 1000)

        asyncio.run(work())
        assert (
            made.get_sample_value(
                "leasekit_acquires_total", {"backend": "sqlite", "outcome": "acquired"}
            )
            == 1
        )
    finally:
        leasekit.plugins.unregister(second)
        second.close()


def test_otel_records_the_same_instruments(tmp_path: Path) -> None:
    require_module("opentelemetry.sdk.metrics", extra="self-test")
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: PLC0415

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    plugin = leasekit.plugins.enable_otel(meter_provider=meters)

    def points() -> dict[str, list[Any]]:
        data = reader.get_metrics_data()
        assert data is not None
        return {
            metric.name: list(metric.data.data_points)
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            if scope.scope.name == "leasekit"
            for metric in scope.metrics
        }

    def renewals() -> float:
        return sum(p.count for p in points().get("lease.renewal.lag", []))

    try:
        asyncio.run(lease_work(f"sqlite:///{tmp_path}/leases.db", renewals))
        found = points()
    finally:
        leasekit.plugins.unregister(plugin)
        meters.shutdown()

    def by(name: str, attribute: str) -> dict[str, Any]:
        return {p.attributes[attribute]: p for p in found[name]}

    waits = by("lease.wait.duration", "lease.outcome")
    assert waits["acquired"].count == 3
    assert waits["timed_out"].count == 1
    assert waits["timed_out"].sum >= 0.1
    holds = by("lease.hold.duration", "lease.end")
    assert set(holds) == {"released"}
    assert holds["released"].count == 4
    lost = by("lease.lost", "lease.lost.reason")
    assert {reason: p.value for reason, p in lost.items()} == {"renew_refused": 1}
    assert sum(p.count for p in found["lease.renewal.lag"]) >= 2
    assert {p.attributes["lease.backend"] for p in found["lease.renewal.lag"]} == {"sqlite"}


def test_open_holds_are_bounded_and_a_reacquire_keeps_the_start() -> None:
    from leasekit._plugin_holdtimes import HoldTimes  # noqa: PLC0415

    holds = HoldTimes(limit=2)
    holds.start("memory", "k", "a")
    holds.start("memory", "k", "b")
    holds.start("memory", "k", "a")  # an idempotent re-acquire: the same hold
    assert len(holds) == 2
    holds.start("memory", "k", "c")  # over the limit: the oldest is forgotten
    assert len(holds) == 2
    assert holds.end("memory", "k", "a") is None
    held = holds.end("memory", "k", "b")
    assert held is not None
    assert held >= 0
    assert holds.end("memory", "k", "b") is None  # ended once
