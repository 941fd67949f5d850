"""The etcd backend on a single member: URLs and options, binary-safe names, fencing
across restarts, no leaked etcd leases, round trips per operation, and faults (a
paused, killed or restarted server).

Servers come from the harness in ``tests/servers.py`` via ``conftest.py``; the
three-member cluster tests are in ``test_etcd_cluster.py``, the conformance suite
(one member and three) in ``test_contract_etcd.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from faults import FreezableProxy
from scenarios import LONG_MS, exercise_every_operation
from servers import (
    EtcdServer,
    etcd_http,
    free_port,
    missing_extra,
    missing_server,
)

import leasekit

try:
    import aetcd
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("etcd", "the etcd tests")

from leasekit_etcd import EtcdLeaseProvider, LeaseRecord

pytestmark = pytest.mark.anyio

# A renew with a new TTL in every exercise: on etcd that moves the record to a new lease.
NEW_TTL_MS = LONG_MS + 5000


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture
async def provider(etcd_url: str, etcd_prefix: str) -> AsyncIterator[EtcdLeaseProvider]:
    async with EtcdLeaseProvider.from_url(etcd_url, prefix=etcd_prefix) as p:
        yield p


def grpc_calls(server: EtcdServer) -> dict[str, int]:
    """RPCs started on the server so far, by method (``{"Txn": 3, ...}``), from /metrics."""
    url = f"http://{server.host}:{server.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    calls: dict[str, int] = {}
    for match in re.finditer(
        r'^grpc_server_started_total\{grpc_method="(\w+)".*\} (\d+)', text, re.MULTILINE
    ):
        calls[match.group(1)] = calls.get(match.group(1), 0) + int(match.group(2))
    return calls


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    changed = {name: n - before.get(name, 0) for name, n in after.items()}
    return {name: n for name, n in changed.items() if n}


def client_calls(calls: dict[str, int]) -> dict[str, int]:
    """``calls`` less the reads the test harness itself makes (lease lists and TTLs)."""
    return {n: c for n, c in calls.items() if n not in ("LeaseLeases", "LeaseTimeToLive")}


# -- registry, URLs and options --------------------------------------------------------------


def test_entry_points_declare_both_schemes_with_the_etcd_extra() -> None:
    infos = {info.scheme: info for info in leasekit.available_backends()}
    for scheme in ("etcd", "etcds"):
        assert infos[scheme].target == "leasekit_etcd:EtcdLeaseProvider"
        assert infos[scheme].extras == ("etcd",)


def test_capabilities_are_what_etcd_gives() -> None:
    caps = EtcdLeaseProvider.capabilities
    assert caps.atomic_transfer
    assert caps.fencing
    assert caps.server_clock
    assert caps.shared_across_hosts
    assert caps.persistent
    assert caps.release_notifications
    assert caps.grant_notifications
    assert caps.metadata
    assert (caps.ttl_resolution_ms, caps.min_ttl_ms) == (1000, 2000)
    assert caps.effective_ttl_ms(1) == 2000
    assert caps.effective_ttl_ms(2001) == 3000


async def test_connect_builds_a_provider_without_io() -> None:
    # Port 1 answers nothing; building must not try.
    provider = leasekit.connect("etcd://127.0.0.1:1", require=("fencing", "atomic_transfer"))
    assert isinstance(provider, EtcdLeaseProvider)
    assert provider.prefix == "leasekit/"
    assert provider.timeout_s == 5.0
    assert provider.endpoints == ("127.0.0.1:1",)
    await provider.aclose()


async def test_url_query_and_keywords_set_options_keywords_winning() -> None:
    provider = leasekit.connect(
        "etcd://10.0.0.1:2379,10.0.0.2,[::1]:2380,etcd-3.internal:23790/"
        "?prefix=app%2Fleases%2F&timeout_s=0.25&connect_timeout_s=0.5",
        timeout_s=1.5,
    )
    assert isinstance(provider, EtcdLeaseProvider)
    assert provider.prefix == "app/leases/"
    assert provider.timeout_s == 1.5
    assert provider.connect_timeout_s == 0.5
    assert provider.endpoints == (
        "10.0.0.1:2379",
        "10.0.0.2:2379",
        "[::1]:2380",
        "etcd-3.internal:23790",
    )
    await provider.aclose()


async def test_etcds_reads_its_pem_files_and_refuses_them_without_tls(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    provider = leasekit.connect(f"etcds://127.0.0.1:1?ca_file={ca}")
    assert isinstance(provider, EtcdLeaseProvider)
    await provider.aclose()
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect(f"etcd://127.0.0.1:1?ca_file={ca}")
    assert info.value.argument == "ca_file"
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect("etcds://127.0.0.1:1", ca_file=str(tmp_path / "missing.pem"))
    assert info.value.argument == "ca_file"
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect(f"etcds://127.0.0.1:1?cert_file={ca}")
    assert info.value.argument == "cert"


@pytest.mark.parametrize(
    ("url", "options", "argument"),
    [
        ("etcd://h?colour=blue", {}, "url"),
        ("etcd://h/some/path", {}, "url"),
        ("etcd://h#frag", {}, "url"),
        ("etcd://", {}, "url"),
        ("etcd://h:notaport", {}, "url"),
        ("etcd://h:70000", {}, "url"),
        ("etcd://h1,,h2", {}, "url"),
        ("etcd://[::1", {}, "url"),
        ("etcd://h?timeout_s=1&timeout_s=2", {}, "url"),
        ("etcd://h", {"endpoints": ["h"]}, "options"),
        ("etcd://h", {"colour": "blue"}, "options"),
        ("etcd://h?timeout_s=soon", {}, "timeout_s"),
        ("etcd://h?timeout_s=0", {}, "timeout_s"),
        ("etcd://h", {"timeout_s": True}, "timeout_s"),
        ("etcd://h", {"connect_timeout_s": -1}, "connect_timeout_s"),
        ("etcd://h?prefix=", {}, "prefix"),
        ("etcd://h", {"prefix": b"app/"}, "prefix"),
        ("etcd://h", {"prefix": "x" * 257}, "prefix"),
        ("etcd://:pw@h", {}, "username"),
        ("etcd://h", {"username": "root"}, "password"),
    ],
)
def test_bad_urls_and_options_name_the_problem(
    url: str, options: dict[str, Any], argument: str
) -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect(url, **options)
    assert info.value.argument == argument


@pytest.mark.parametrize(
    ("url", "endpoints"),
    [
        ("etcd://[::1]", ("[::1]:2379",)),
        ("etcd://[fd00::1]:2380,10.0.0.1", ("[fd00::1]:2380", "10.0.0.1:2379")),
        ("etcd://root:pw@10.0.0.1:2379,[::1]:2380", ("10.0.0.1:2379", "[::1]:2380")),
    ],
)
def test_endpoint_lists_with_ipv6_members_parse(url: str, endpoints: tuple[str, ...]) -> None:
    provider = EtcdLeaseProvider.from_url(url)
    assert provider.endpoints == endpoints
    assert "pw" not in repr(provider)


def test_the_benchmark_reads_an_endpoint_list_with_ipv6_members() -> None:
    from leasekit_etcd._bench import _endpoint  # noqa: PLC0415 (the benchmark's own parser)

    endpoint = _endpoint("etcd://u:p%40ss@10.0.0.1,[::1]:2380?prefix=x%2F")
    assert (endpoint.host, endpoint.port, endpoint.username, endpoint.password) == (
        "10.0.0.1",
        2379,
        "u",
        "p@ss",
    )
    assert endpoint.prefix == "x/"


def test_from_url_refuses_other_schemes() -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument, match=r"etcd://"):
        EtcdLeaseProvider.from_url("http://127.0.0.1:2379")


def test_errors_never_show_the_password() -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument) as info:
        leasekit.connect("etcd://root:s3cret@h:2379?colour=blue")
    assert "s3cret" not in str(info.value)
    assert "root:***@h:2379" in str(info.value)


def test_a_client_and_endpoints_together_are_refused() -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument, match="either"):
        EtcdLeaseProvider()
    with pytest.raises(leasekit.InvalidLeaseArgument, match=r"aetcd\.Client"):
        EtcdLeaseProvider(object())


async def test_an_unreachable_server_is_unreachable_within_the_timeout() -> None:
    url = f"etcd://127.0.0.1:{free_port()}"
    provider = EtcdLeaseProvider.from_url(url, timeout_s=1)
    started = time.monotonic()
    with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
        async with provider:
            pass
    assert time.monotonic() - started < 1 + 10
    assert info.value.backend == "etcd"
    with pytest.raises(leasekit.LeaseProviderClosed):  # a failed ``async with`` closes it
        await provider.acquire_lease("k", "a", LONG_MS)
    provider = EtcdLeaseProvider.from_url(url, timeout_s=1)
    with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
        await provider.acquire_lease("k", "a", LONG_MS)
    assert info.value.key == "k"
    await provider.aclose()


# -- clients and closing -------------------------------------------------------------------


async def test_a_callers_aetcd_client_is_used_and_never_closed(
    etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    client = aetcd.Client(host=etcd_server.host, port=etcd_server.port)
    async with EtcdLeaseProvider(client, prefix=etcd_prefix) as provider:
        assert provider.endpoints == (f"{etcd_server.host}:{etcd_server.port}",)
        await exercise_every_operation(provider, "k", renew_ttl_ms=NEW_TTL_MS)
    with pytest.raises(leasekit.LeaseProviderClosed):
        await provider.get_lease_owner("k")
    await client.put(etcd_prefix.encode() + b"still-open", b"yes")  # still usable
    assert (await client.get(etcd_prefix.encode() + b"still-open")).value == b"yes"
    await client.close()


async def test_closing_closes_its_channels_and_later_calls_raise(
    etcd_url: str, etcd_prefix: str
) -> None:
    provider = EtcdLeaseProvider.from_url(etcd_url, prefix=etcd_prefix)
    async with provider:
        await exercise_every_operation(provider, "k", renew_ttl_ms=NEW_TTL_MS)
    for call in (
        provider.get_lease_owner("k"),
        provider.acquire_lease("k", "a", LONG_MS),
        provider.inspect(),
    ):
        with pytest.raises(leasekit.LeaseProviderClosed):
            await call
    await provider.aclose()  # idempotent
    assert "closed" in repr(provider)


async def test_the_sync_facade_drives_the_backend(etcd_url: str, etcd_prefix: str) -> None:
    def blocking() -> None:
        with leasekit.sync.connect(etcd_url, prefix=etcd_prefix) as leases:
            assert leases.acquire_lease("k", "a", LONG_MS).acquired
            assert leases.get_lease_owner("k") == "a"
            leases.release_lease("k", "a")

    await anyio.to_thread.run_sync(blocking)


# -- names: binary-safe, one record per lease, listed ----------------------------------------

AWKWARD_KEYS = [
    "plain",
    "resource\0thread",
    "\0",
    "\x01",
    "\x01\x01",
    "\0\x01\x02",
    "a\x01",
    "a/b",
    "a",
    "ab",
    "space and\ttab\nnewline",
    "emoji 🎉 and 中文",
    "\U0010ffff",
    "x" * 1024,
]


@pytest.mark.parametrize("key", AWKWARD_KEYS, ids=range(len(AWKWARD_KEYS)))
async def test_awkward_keys_and_owners_round_trip_as_one_record(
    provider: EtcdLeaseProvider, key: str
) -> None:
    owner = f"own{key[:50]}\0\x01🎉"
    await exercise_every_operation(provider, key, renew_ttl_ms=NEW_TTL_MS)
    result = await provider.acquire_lease(key, owner, LONG_MS)
    assert result.acquired
    assert await provider.get_lease_owner(key) == owner
    [record] = await provider.inspect(key)
    assert (record.key, record.owner, record.token) == (key, owner, result.token)
    # One etcd key per lease, its value the owner, its create revision the token.
    client = aetcd.Client(*_address(provider))
    found = await client.get_prefix(provider.prefix.encode())
    [(value, meta)] = [(kv.value, kv) for kv in found]
    assert value == owner.encode()
    assert meta.create_revision == result.token
    assert meta.lease != 0
    await client.close()


async def test_awkward_keys_stay_distinct_and_list_in_key_order(
    provider: EtcdLeaseProvider,
) -> None:
    for i, key in enumerate(AWKWARD_KEYS):
        assert (await provider.acquire_lease(key, f"o{i}", LONG_MS)).acquired
    for i, key in enumerate(AWKWARD_KEYS):
        assert await provider.get_lease_owner(key) == f"o{i}"
    records = await provider.inspect()
    assert [(r.key, r.owner) for r in records] == sorted(
        ((key, f"o{i}") for i, key in enumerate(AWKWARD_KEYS)),
        key=lambda pair: pair[0].encode(),
    )


async def test_inspect_filters_by_prefix_orders_and_limits(provider: EtcdLeaseProvider) -> None:
    for i in range(5):
        await provider.acquire_lease(f"job/{i}", f"w{i}", LONG_MS)
    await provider.acquire_lease("job\0/x", "nul", LONG_MS)
    await provider.acquire_lease("other", "o", LONG_MS)
    await provider.acquire_lease("job/gone", "g", LONG_MS)
    await provider.release_lease("job/gone", "g")
    records = await provider.inspect("job/")
    assert [(r.key, r.owner) for r in records] == [(f"job/{i}", f"w{i}") for i in range(5)]
    assert all(isinstance(r, LeaseRecord) and 0 < r.remaining_ms <= LONG_MS for r in records)
    for r in records:
        assert r.token == (await provider.acquire_lease(r.key, r.owner, LONG_MS)).token
    assert [r.key for r in await provider.inspect("job\0")] == ["job\0/x"]
    assert [r.key for r in await provider.inspect(limit=2)] == ["job\0/x", "job/0"]
    assert len(await provider.inspect()) == 7
    for bad in ("", 5):
        with pytest.raises(leasekit.InvalidLeaseArgument):
            await provider.inspect(bad)  # type: ignore[arg-type]
    with pytest.raises(leasekit.InvalidLeaseArgument):
        await provider.inspect(limit=0)


async def test_other_providers_prefixes_are_invisible(etcd_url: str, etcd_prefix: str) -> None:
    async with (
        EtcdLeaseProvider.from_url(etcd_url, prefix=etcd_prefix + "a/") as a,
        EtcdLeaseProvider.from_url(etcd_url, prefix=etcd_prefix + "b/") as b,
    ):
        assert (await a.acquire_lease("k", "x", LONG_MS)).acquired
        assert (await b.acquire_lease("k", "y", LONG_MS)).acquired
        assert [r.owner for r in await a.inspect()] == ["x"]
        assert [r.owner for r in await b.inspect()] == ["y"]


async def test_foreign_data_under_the_prefix_is_a_backend_error(
    provider: EtcdLeaseProvider,
) -> None:
    client = aetcd.Client(*_address(provider))
    await client.put(provider.prefix.encode() + b"garbled\0someone", b"not the owner")
    with pytest.raises(leasekit.LeaseBackendError, match="unexpected data") as info:
        await provider.get_lease_owner("garbled")
    assert info.value.key == "garbled"
    with pytest.raises(leasekit.LeaseBackendError, match="unexpected data"):
        await provider.acquire_lease("garbled", "a", LONG_MS)
    with pytest.raises(leasekit.LeaseBackendError, match="unexpected data"):
        await provider.get_lease_record("garbled")
    assert await provider.inspect() == []
    await client.delete_prefix(provider.prefix.encode())
    await client.close()


async def test_a_record_stored_before_metadata_existed_reads_as_one_without(
    provider: EtcdLeaseProvider,
) -> None:
    """What an earlier leasekit wrote (the value is the owner alone) keeps working: read,
    denied, renewed, given metadata by its holder, released."""
    client = aetcd.Client(*_address(provider))
    lease = await client.lease(60)
    await client.put(provider.prefix.encode() + b"old\0alice", b"alice", lease=lease)
    assert await provider.acquire_lease("old", "bob", LONG_MS) == leasekit.LeaseResult(
        False, "alice", None, None
    )
    record = await provider.get_lease_record("old")
    assert record is not None
    assert (record.owner, record.metadata) == ("alice", None)
    assert 0 < record.remaining_ms <= 60_000
    assert await provider.renew_lease("old", "alice", 60_000)
    granted = await provider.acquire_lease("old", "alice", 60_000, metadata="here")
    assert (granted.acquired, granted.token, granted.metadata) == (True, record.token, b"here")
    [listed] = await provider.inspect()
    assert (listed.owner, listed.metadata) == ("alice", b"here")
    await provider.release_lease("old", "alice")
    assert await provider.get_lease_record("old") is None
    await client.close()  # the etcd lease: revoked by the provider once left empty


def _address(provider: EtcdLeaseProvider) -> tuple[str, int]:
    host, _, port = provider.endpoints[0].rpartition(":")
    return host, int(port)


# -- round trips and etcd leases -------------------------------------------------------------

# What each operation costs, in RPCs by method (docs/backends/etcd.md states the same):
# the round trips the caller waits for, then the revocations that follow in the
# background (of etcd leases that no record is bound to any more, or never was).
ROUND_TRIPS: list[tuple[str, dict[str, int], dict[str, int]]] = [
    ("acquire free", {"LeaseGrant": 1, "Txn": 1}, {}),
    ("acquire denied, first time", {"LeaseGrant": 1, "Txn": 1}, {"LeaseRevoke": 1}),
    ("acquire denied again", {"Range": 1}, {}),
    ("re-acquire, same TTL", {"Range": 1, "LeaseKeepAlive": 1}, {}),
    ("re-acquire, new TTL", {"Range": 1, "LeaseKeepAlive": 1, "LeaseGrant": 1, "Txn": 1},
     {"LeaseRevoke": 1}),
    ("re-acquire, other metadata", {"Range": 1, "LeaseGrant": 1, "Txn": 1}, {"LeaseRevoke": 1}),
    ("get_lease_owner", {"Range": 1}, {}),
    ("get_lease_record", {"Range": 1, "LeaseTimeToLive": 1}, {}),
    ("renew, same TTL", {"Range": 1, "LeaseKeepAlive": 1}, {}),
    ("renew, new TTL", {"Range": 1, "LeaseKeepAlive": 1, "LeaseGrant": 1, "Txn": 1},
     {"LeaseRevoke": 1}),
    ("renew refused", {"Range": 1}, {}),
    ("transfer", {"LeaseGrant": 1, "Txn": 1}, {"LeaseRevoke": 1}),
    ("transfer refused", {"LeaseGrant": 1, "Txn": 1}, {"LeaseRevoke": 1}),
    ("release refused", {"Txn": 1}, {}),
    ("release", {"Txn": 1}, {"LeaseRevoke": 1}),
    ("acquire once held, now free", {"Range": 1, "LeaseGrant": 1, "Txn": 1}, {}),
]  # fmt: skip


async def test_round_trips_per_operation(private_etcd_server: EtcdServer, etcd_prefix: str) -> None:
    url = private_etcd_server.url
    async with (
        EtcdLeaseProvider.from_url(url, prefix=etcd_prefix) as p,
        EtcdLeaseProvider.from_url(url, prefix=etcd_prefix) as other,
    ):
        await exercise_every_operation(p, "warm-up", renew_ttl_ms=NEW_TTL_MS)
        await exercise_every_operation(other, "warm-up", renew_ttl_ms=NEW_TTL_MS)
        await p.flush()
        await other.flush()
        steps = {
            "acquire free": lambda: p.acquire_lease("k", "a", 10_000),
            "acquire denied, first time": lambda: other.acquire_lease("k", "b", 10_000),
            "acquire denied again": lambda: other.acquire_lease("k", "b", 10_000),
            "re-acquire, same TTL": lambda: p.acquire_lease("k", "a", 10_000),
            "re-acquire, new TTL": lambda: p.acquire_lease("k", "a", 20_000),
            "re-acquire, other metadata": lambda: p.acquire_lease("k", "a", 20_000, metadata="m"),
            "get_lease_owner": lambda: p.get_lease_owner("k"),
            "get_lease_record": lambda: p.get_lease_record("k"),
            "renew, same TTL": lambda: p.renew_lease("k", "a", 20_000),
            "renew, new TTL": lambda: p.renew_lease("k", "a", 10_000),
            "renew refused": lambda: p.renew_lease("k", "b", 10_000),
            "transfer": lambda: p.transfer_lease("k", "a", "b", 10_000),
            "transfer refused": lambda: p.transfer_lease("k", "a", "c", 10_000),
            "release refused": lambda: p.release_lease("k", "a"),
            "release": lambda: p.release_lease("k", "b"),
            "acquire once held, now free": lambda: other.acquire_lease("k", "b", 10_000),
        }
        measured = []
        for name, *_ in ROUND_TRIPS:
            before = grpc_calls(private_etcd_server)
            await steps[name]()
            # Read at once, without yielding to the event loop: a background revocation
            # is a task that has not started yet, so this counts only what was waited for.
            returned = grpc_calls(private_etcd_server)
            await p.flush()
            await other.flush()
            settled = grpc_calls(private_etcd_server)
            measured.append((name, delta(returned, before), delta(settled, returned)))
    assert measured == ROUND_TRIPS


async def test_a_warm_provider_acquires_a_free_key_in_one_round_trip(
    private_etcd_server: EtcdServer, etcd_prefix: str, wide_reuse_window: int
) -> None:
    """The etcd lease a release left empty is bound again by the next acquire, in its
    one transaction: a cycle is two transactions, no grant and no revocation."""
    server = private_etcd_server
    async with EtcdLeaseProvider.from_url(server.url, prefix=etcd_prefix) as p:
        assert (await p.acquire_lease("k0", "a", 10_000)).acquired
        await p.release_lease("k0", "a")
        [idle] = server.lease_ids()
        assert server.lease_ttl(idle)[1] == 10 + wide_reuse_window
        before = grpc_calls(server)
        for i in range(20):
            result = await p.acquire_lease(f"k{i % 3}", f"o{i}", 10_000)
            assert result.acquired
            assert server.lease_ids() == [idle]  # the record is on the idle lease
            await p.release_lease(f"k{i % 3}", f"o{i}")
        await asyncio.sleep(0)  # let any background revocation start
        assert client_calls(delta(grpc_calls(server), before)) == {"Txn": 40}
        # A different TTL takes a lease of its own, and never a longer one than asked.
        before = grpc_calls(server)
        assert (await p.acquire_lease("k0", "a", 20_000)).acquired
        assert delta(grpc_calls(server), before) == {"LeaseGrant": 1, "Txn": 1}
        [longer] = [lease for lease in server.lease_ids() if lease != idle]
        assert server.lease_ttl(longer)[1] == 20 + wide_reuse_window
        await p.release_lease("k0", "a")
        await p.flush()  # revokes the idle ones
        assert server.lease_ids() == []
    assert server.lease_ids() == []


async def test_reuse_leases_false_grants_the_exact_ttl_and_revokes_each_lease(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    server = private_etcd_server
    url = f"{server.url}?reuse_leases=false"
    async with leasekit.connect(url, prefix=etcd_prefix) as p:
        assert (await p.acquire_lease("k", "a", 10_000)).acquired
        [lease] = server.lease_ids()
        assert server.lease_ttl(lease)[1] == 10
        await p.release_lease("k", "a")
        await p.flush()
        assert server.lease_ids() == []  # revoked, not kept
        before = grpc_calls(server)
        assert (await p.acquire_lease("k", "b", 10_000)).acquired
        await p.release_lease("k", "b")
        await p.flush()
        calls = client_calls(delta(grpc_calls(server), before))
        assert calls == {"LeaseGrant": 1, "Txn": 2, "LeaseRevoke": 1}
        assert server.lease_ids() == []


async def test_an_idle_etcd_lease_is_revoked_once_it_can_no_longer_be_bound(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    """Reuse never shortens a lease: an idle etcd lease is bound again only while it
    surely has the whole TTL ahead of it. Past that it is revoked on its own (not left
    until the next acquire, a flush or aclose), and the next acquire grants a fresh
    one, with the full TTL."""
    server = private_etcd_server
    async with EtcdLeaseProvider.from_url(server.url, prefix=etcd_prefix) as p:
        assert (await p.acquire_lease("k", "a", 10_000)).acquired
        await p.release_lease("k", "a")
        [idle] = server.lease_ids()
        assert server.lease_ttl(idle)[1] == 11  # one second more than asked, for reuse
        for _ in range(200):
            if idle not in server.lease_ids():
                break
            await asyncio.sleep(0.05)
        assert server.lease_ids() == []  # revoked by the provider, long before its TTL
        assert len(p._pool) == 0
        before = grpc_calls(server)
        assert (await p.acquire_lease("k", "a", 10_000)).acquired
        await p.flush()
        # A grant and the transaction; nothing was left to revoke.
        assert client_calls(delta(grpc_calls(server), before)) == {"LeaseGrant": 1, "Txn": 1}
        [fresh] = server.lease_ids()
        assert fresh != idle
        assert server.lease_ttl(fresh)[0] >= 10
        await p.release_lease("k", "a")
    assert server.lease_ids() == []


async def test_a_renewal_moving_onto_an_idle_lease_revoked_by_hand_takes_a_fresh_one(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    """A renewal with a new TTL moves the record onto an idle etcd lease of that TTL; if
    etcd no longer has it, the move is refused with nothing written and made again on
    a fresh grant: the renewal succeeds and the token stays."""
    server = private_etcd_server
    async with EtcdLeaseProvider.from_url(server.url, prefix=etcd_prefix) as p:
        assert (await p.acquire_lease("other", "o", 20_000)).acquired
        await p.release_lease("other", "o")
        [idle] = server.lease_ids()  # an idle lease for 20 s records
        granted = await p.acquire_lease("k", "a", 10_000)
        assert granted.acquired
        server.revoke_lease(idle)
        assert await p.renew_lease("k", "a", 20_000)
        assert await p.acquire_lease("k", "a", 20_000) == granted  # same token
        leases = server.lease_ids()
        assert idle not in leases
        # The record's fresh 21 s lease, and the 11 s one it moved off, now idle.
        assert sorted(server.lease_ttl(lease)[1] for lease in leases) == [11, 21]
        await p.release_lease("k", "a")
        await p.flush()
        assert server.lease_ids() == []


async def test_a_ttl_under_ten_seconds_gets_an_exact_etcd_lease_of_its_own(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    """Below 10 s a second more would be over a tenth of the TTL: no reuse there."""
    server = private_etcd_server
    async with EtcdLeaseProvider.from_url(server.url, prefix=etcd_prefix) as p:
        assert (await p.acquire_lease("k", "a", 9_000)).acquired
        [lease] = server.lease_ids()
        assert server.lease_ttl(lease)[1] == 9
        await p.release_lease("k", "a")
        await p.flush()
        assert server.lease_ids() == []  # revoked, not kept
        before = grpc_calls(server)
        assert (await p.acquire_lease("k", "b", 9_000)).acquired
        assert client_calls(delta(grpc_calls(server), before)) == {"LeaseGrant": 1, "Txn": 1}
        await p.release_lease("k", "b")
    assert server.lease_ids() == []


async def test_an_idle_etcd_lease_revoked_behind_the_providers_back_is_replaced(
    private_etcd_server: EtcdServer, etcd_prefix: str, wide_reuse_window: int
) -> None:
    """etcd refuses a transaction naming a lease it does not have, writing nothing; the
    acquire (and a transfer) then grants a fresh lease and succeeds."""
    server = private_etcd_server
    async with EtcdLeaseProvider.from_url(server.url, prefix=etcd_prefix) as p:
        assert (await p.acquire_lease("k", "a", 10_000)).acquired
        await p.release_lease("k", "a")
        [idle] = server.lease_ids()
        server.revoke_lease(idle)
        before = grpc_calls(server)
        result = await p.acquire_lease("k", "b", 10_000)
        assert result.acquired
        assert delta(grpc_calls(server), before) == {"Txn": 2, "LeaseGrant": 1}
        assert await p.get_lease_owner("k") == "b"
        [bound] = server.lease_ids()
        assert await p.transfer_lease("k", "b", "c", 10_000)  # on a fresh grant
        server.revoke_lease(bound)  # b's lease, idle after the transfer
        assert await p.transfer_lease("k", "c", "d", 10_000)
        assert await p.get_lease_owner("k") == "d"
        await p.release_lease("k", "d")
    assert server.lease_ids() == []


async def test_no_etcd_lease_is_left_behind(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    """Many cycles of every operation, refused ones included, end with no etcd lease."""
    async with EtcdLeaseProvider.from_url(private_etcd_server.url, prefix=etcd_prefix) as p:
        assert await p.lease_ids() == []
        for i in range(25):
            await exercise_every_operation(p, f"k{i % 5}", renew_ttl_ms=NEW_TTL_MS)
            assert (await p.acquire_lease("held", "h", 10_000 + 1000 * (i % 3))).acquired
            assert not (await p.acquire_lease("held", f"x{i}", 10_000)).acquired
            assert not await p.transfer_lease("held", f"x{i}", "y", 10_000)
            assert await p.renew_lease("held", "h", 5_000 + 1000 * (i % 4))
        assert len(await p.lease_ids()) == 1  # "held", on exactly one etcd lease
        await p.release_lease("held", "h")
        assert await p.lease_ids() == []
        # Racing acquirers: each loser revokes the etcd lease it granted.
        for round_ in range(10):
            results = await asyncio.gather(
                *(p.acquire_lease(f"race{round_}", f"r{i}", 10_000) for i in range(8))
            )
            [winner] = [r.owner for r in results if r.acquired]
            assert winner is not None
            await p.release_lease(f"race{round_}", winner)
        assert await p.lease_ids() == []
    assert private_etcd_server.lease_ids() == []


async def test_the_pool_revokes_an_idle_lease_when_its_window_closes_later_if_kept_alive() -> None:
    """The pool's timer, on its own: an idle lease is revoked once it can no longer be
    bound; one kept alive meanwhile (its window moved on) only when its new window
    closes; one bound again in between not at all."""
    from leasekit_etcd._aio import call_at  # noqa: PLC0415
    from leasekit_etcd._pool import LeasePool  # noqa: PLC0415

    revoked: list[int] = []
    loop = asyncio.get_running_loop()
    pool = LeasePool(revoked.append, now=loop.time, call_at=call_at)
    now = loop.time()
    for lease in (1, 2, 3):  # 11 s leases, windows closing 0.05 s from now
        pool.granted(lease, 11, now - 0.85)
        assert pool.give_back(lease, now)
    pool.kept_alive(2, 11, now)  # its window now closes 0.9 s from now
    assert pool.take(11, 10, now) == 3  # bound again: not idle any more
    for _ in range(100):
        if revoked:
            break
        await asyncio.sleep(0.02)
    assert revoked == [1]
    for _ in range(200):
        if len(revoked) > 1:
            break
        await asyncio.sleep(0.02)
    assert revoked == [1, 2]
    assert len(pool) == 0


def test_an_idle_lease_given_back_on_a_second_event_loop_gets_a_timer_there() -> None:
    """A timer set on an event loop that has closed never fires: a lease given back
    on the next loop gets a timer of its own there instead of waiting on it."""
    from leasekit_etcd._aio import call_at  # noqa: PLC0415
    from leasekit_etcd._pool import LeasePool  # noqa: PLC0415

    revoked: list[int] = []
    pool = LeasePool(revoked.append, now=lambda: asyncio.get_running_loop().time(), call_at=call_at)

    async def give_back(window_s: float) -> None:
        now = asyncio.get_running_loop().time()
        pool.granted(1, 11, now - 0.9 + window_s)
        assert pool.give_back(1, now)

    asyncio.run(give_back(60.0))  # its timer is due in a minute, on a loop now closed
    assert pool.take(11, 10, time.monotonic()) == 1

    async def again() -> None:
        await give_back(0.05)
        for _ in range(100):
            if revoked:
                break
            await asyncio.sleep(0.02)

    asyncio.run(again())
    assert revoked == [1]


def test_bindings_name_each_lease_for_at_most_one_record_and_forget_the_oldest() -> None:
    """What a release whose outcome is lost revokes: never a lease that another record
    was bound to since, nor one left empty or revoked."""
    from leasekit_etcd._pool import Bindings  # noqa: PLC0415

    bindings = Bindings(size=2)
    bindings.bound(b"r1", 1)
    bindings.bound(b"r2", 1)  # lease 1 was left empty, then bound to r2
    assert bindings.pop(b"r1") is None
    bindings.keep_if_on(b"r2", 2)  # read on another lease: forgotten
    assert bindings.pop(b"r2") is None
    bindings.bound(b"r3", 3)
    bindings.drop_lease(3)  # left empty, or revoked
    assert bindings.pop(b"r3") is None
    for lease, record in enumerate((b"a", b"b", b"c"), start=10):
        bindings.bound(record, lease)
    assert len(bindings) == 2
    assert (bindings.pop(b"a"), bindings.pop(b"b"), bindings.pop(b"c")) == (None, 11, 12)


async def test_a_cancelled_release_leaves_neither_the_key_held_nor_an_empty_etcd_lease(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    """A release whose caller is cancelled 0-4 ms in: its transaction may have been
    sent, may land later, or may never be sent. The provider then revokes the etcd
    lease it bound the record to, in the background: that ends the record if the
    release did not land, and the empty lease if it did.

    Before the fix, a cancelled release that landed left its etcd lease bound to no key
    for its whole TTL (about half of them), and one cancelled before it was sent left
    the key held.
    """
    server = private_etcd_server
    rounds = 40
    async with EtcdLeaseProvider.from_url(server.url, prefix=etcd_prefix) as p:
        for i in range(rounds):
            key = f"k{i}"
            assert (await p.acquire_lease(key, "a", LONG_MS)).acquired
            release = asyncio.ensure_future(p.release_lease(key, "a"))
            await asyncio.sleep(0.004 * i / rounds)
            release.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await release
        await p.flush()
        assert [r.key for r in await p.inspect()] == []
        assert server.lease_ids() == []


async def test_release_frees_a_record_another_provider_moved_for_the_same_owner(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    """Two providers, one owner: each one's release frees the key, whichever etcd lease
    the other last put the record on.

    The last case is why release is a transaction and not a bare revoke of the etcd
    lease the provider bound: another process has moved the record onto a new etcd
    lease and not yet revoked the old one (it is between its two round trips, or its
    revoke failed). Revoking that old lease would succeed, delete nothing, and leave
    the key held.
    """
    url = private_etcd_server.url
    async with (
        EtcdLeaseProvider.from_url(url, prefix=etcd_prefix) as p,
        EtcdLeaseProvider.from_url(url, prefix=etcd_prefix) as q,
        aetcd.Client(host=private_etcd_server.host, port=private_etcd_server.port) as raw,
    ):
        # q re-acquires with a new TTL: the record moves onto q's new etcd lease.
        assert (await p.acquire_lease("k", "o", LONG_MS)).acquired
        assert (await q.acquire_lease("k", "o", LONG_MS + 5000)).acquired
        await p.release_lease("k", "o")
        assert await q.get_lease_owner("k") is None
        # q hands the key away and back: "o" holds it on a lease p never saw.
        assert (await p.acquire_lease("k", "o", LONG_MS)).acquired
        assert await q.transfer_lease("k", "o", "x", LONG_MS)
        assert await q.transfer_lease("k", "x", "o", LONG_MS)
        await p.release_lease("k", "o")
        assert await q.get_lease_owner("k") is None
        # A second process moved the record and has not revoked the old lease yet.
        token = (await p.acquire_lease("k", "o", LONG_MS)).token
        [record] = (await raw.get_prefix(etcd_prefix.encode())).kvs
        bound_by_p = record.lease
        moved_to = await raw.lease(LONG_MS // 1000 + 5)
        moved, _ = await raw.transaction(
            compare=[raw.transactions.value(record.key) == b"o"],
            success=[raw.transactions.put(record.key, b"o", lease=moved_to.id)],
            failure=[],
        )
        assert moved
        assert bound_by_p in await p.lease_ids()  # alive, and bound to nothing
        assert await p.acquire_lease("k", "o", LONG_MS + 5000) == leasekit.LeaseResult(
            True, "o", token
        )
        await p.release_lease("k", "o")
        assert await q.get_lease_owner("k") is None
        assert (await raw.get_prefix(etcd_prefix.encode())).kvs == []
        await raw.revoke_lease(bound_by_p)  # the second process catches up
    assert private_etcd_server.lease_ids() == []


# -- persistence, restarts, faults -------------------------------------------------------------


async def test_a_restart_keeps_leases_and_tokens_keep_increasing(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    async with EtcdLeaseProvider.from_url(
        private_etcd_server.url, prefix=etcd_prefix, timeout_s=10
    ) as provider:
        before = await provider.acquire_lease("k", "a", LONG_MS)
        assert before.token is not None
        private_etcd_server.restart()  # kill -9, same data dir, same port
        # The channel reconnects on its own; etcd restored the lease with its TTL.
        assert await provider.get_lease_owner("k") == "a"
        assert not (await provider.acquire_lease("k", "b", LONG_MS)).acquired
        assert await provider.acquire_lease("k", "a", LONG_MS) == before
        await provider.release_lease("k", "a")
        after = await provider.acquire_lease("k", "b", LONG_MS)
        assert after.token is not None
        assert after.token > before.token
        await exercise_every_operation(provider, "after-restart", renew_ttl_ms=NEW_TTL_MS)


async def test_a_paused_server_is_a_backend_error_within_the_timeout_then_recovers(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    timeout_s = 1.0
    # Calls made while the server is frozen ask for short leases: a grant that timed out
    # here may still be applied when the server wakes, with an ID the client never
    # learned, so nobody can revoke it; it must end at its TTL, no later.
    frozen_ttl_ms = 2_000
    async with EtcdLeaseProvider.from_url(
        private_etcd_server.url, prefix=etcd_prefix, timeout_s=timeout_s
    ) as provider:
        assert (await provider.acquire_lease("k", "a", LONG_MS)).acquired
        private_etcd_server.pause()
        try:
            for call in (
                provider.acquire_lease("k", "a", frozen_ttl_ms),
                provider.get_lease_owner("k"),
                provider.transfer_lease("k", "a", "b", frozen_ttl_ms),
                provider.release_lease("k", "b"),
            ):
                started = time.monotonic()
                with pytest.raises(leasekit.LeaseBackendTimeout) as info:
                    await call
                elapsed = time.monotonic() - started
                assert elapsed < timeout_s + 10, elapsed
                assert info.value.key == "k"
        finally:
            private_etcd_server.resume()
        # The re-acquire and the transfer may or may not have run once the server woke;
        # either is fine, but the key is never free while "a"'s long lease lives.
        assert await provider.get_lease_owner("k") in ("a", "b")
        await exercise_every_operation(provider, "after-pause", renew_ttl_ms=NEW_TTL_MS)
    # What the failed operations granted was revoked (in the background) by aclose, or
    # ends at its short TTL: soon, at most the holder's lease of "k" is left.
    polls = int((2 * frozen_ttl_ms / 1000 + 10) / 0.2)
    for _ in range(polls):
        if len(private_etcd_server.lease_ids()) <= 1:
            break
        await anyio.sleep(0.2)
    assert len(private_etcd_server.lease_ids()) <= 1


async def test_aclose_against_a_frozen_server_leaves_no_idle_etcd_lease_behind(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    """Idle etcd leases kept for reuse are revoked once they can no longer be bound,
    not left for ``aclose``: an ``aclose`` that cannot reach a frozen server (its
    revocations abandoned at ``timeout_s``) then orphans none of them.

    Before the fix, every lease a release left idle stayed in the provider, bound to
    nothing, until the next acquire of the same TTL, a flush or aclose; frozen, aclose
    gave up on revoking them, and each was left bound to no key for its whole TTL.
    """
    server = private_etcd_server
    provider = EtcdLeaseProvider.from_url(server.url, prefix=etcd_prefix, timeout_s=1.0)
    keys = [f"k{i}" for i in range(20)]
    results = await asyncio.gather(*(provider.acquire_lease(k, "a", LONG_MS) for k in keys))
    assert all(result.acquired for result in results)
    await asyncio.gather(*(provider.release_lease(k, "a") for k in keys))
    assert len(server.lease_ids()) == len(keys)  # idle, bound to nothing, for reuse
    # Each can be bound again for under a second after its grant; then it is revoked
    # (before the fix, never: they stay until aclose).
    for _ in range(100):
        if not server.lease_ids():
            break
        await asyncio.sleep(0.1)
    server.pause()
    try:
        await provider.aclose()
    finally:
        server.resume()
    assert server.lease_ids() == []  # before the fix: all 20, for their whole TTL


@pytest.mark.slow
async def test_what_a_frozen_aclose_leaves_ends_on_its_own_at_its_granted_ttl(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    """16 tasks cycle acquire, transfer and release; the server freezes; ``aclose``
    gives up on what it cannot reach; the server wakes. Whatever is left (records
    whose transaction landed late, leases idle, detached or granted with their
    revocation abandoned or their reply lost) carries at most the TTL granted, one
    second more than asked, and is gone once that has run out: nothing keeps it alive.
    (About 12 s: the TTL must be 10 s or more for leases to be reused.)"""
    server = private_etcd_server
    ttl_ms = 10_000
    provider = EtcdLeaseProvider.from_url(server.url, prefix=etcd_prefix, timeout_s=1.0)
    await provider.get_lease_owner("warm-up")

    async def cycle(i: int) -> None:
        with contextlib.suppress(leasekit.LeaseError):
            while True:
                if (await provider.acquire_lease(f"k{i}", "a", ttl_ms)).acquired:
                    await provider.transfer_lease(f"k{i}", "a", "b", ttl_ms)
                    await provider.release_lease(f"k{i}", "b")

    tasks = [asyncio.ensure_future(cycle(i)) for i in range(16)]
    await asyncio.sleep(0.3)
    server.pause()
    try:
        await provider.aclose()
        await asyncio.gather(*tasks)
    finally:
        server.resume()
    left = server.lease_ids()
    assert all(server.lease_ttl(lease)[1] <= ttl_ms // 1000 + 1 for lease in left)
    # Each ends at most 11 s after etcd applied its grant, which was at the latest
    # when the server woke; the leader looks for expired leases every 500 ms.
    for _ in range(150):
        if not server.lease_ids():
            break
        await asyncio.sleep(0.1)
    assert server.lease_ids() == []


async def test_a_killed_server_is_a_backend_error_and_a_restart_recovers(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    async with EtcdLeaseProvider.from_url(
        private_etcd_server.url, prefix=etcd_prefix, timeout_s=1
    ) as provider:
        await exercise_every_operation(provider, "k", renew_ttl_ms=NEW_TTL_MS)
        private_etcd_server.kill()
        # A read is safe to repeat, so it looks past the connection the kill broke and
        # finds nobody listening; then a write finds the same at once.
        for call in (
            lambda: provider.get_lease_owner("k"),
            lambda: provider.acquire_lease("k", "a", LONG_MS),
        ):
            started = time.monotonic()
            with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
                await call()
            assert time.monotonic() - started < 1 + 10
            assert info.value.key == "k"
            assert info.value.__cause__ is not None
        private_etcd_server.start()
        await exercise_every_operation(provider, "k", renew_ttl_ms=NEW_TTL_MS)


# -- authentication and TLS --------------------------------------------------------------------


async def test_user_and_password_authenticate(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    host, port = private_etcd_server.host, private_etcd_server.port
    for path, body in [
        ("/v3/auth/user/add", {"name": "root", "password": "pw"}),
        ("/v3/auth/role/add", {"name": "root"}),
        ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
        ("/v3/auth/enable", {}),
    ]:
        etcd_http(host, port, path, body)
    url = f"etcd://root:pw@{host}:{port}"
    async with EtcdLeaseProvider.from_url(url, prefix=etcd_prefix) as provider:
        await exercise_every_operation(provider, "k", renew_ttl_ms=NEW_TTL_MS)
    for bad in (f"etcd://root:wrong@{host}:{port}", f"etcd://{host}:{port}"):
        provider = EtcdLeaseProvider.from_url(bad, prefix=etcd_prefix, timeout_s=2)
        with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
            await provider.acquire_lease("k", "a", LONG_MS)
        assert "pw" not in str(info.value)
        assert "wrong" not in str(info.value)
        await provider.aclose()


def _make_certificates(directory: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1, made with the openssl command line."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed (apt-get install openssl)")
    paths = {name: directory / f"{name}.pem" for name in ("ca", "ca-key", "server", "server-key")}
    ext = directory / "san.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=leasekit-ca",
        "-keyout", str(paths["ca-key"]), "-out", str(paths["ca"]))  # fmt: skip
    csr = directory / "server.csr"
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", str(paths["server-key"]), "-out", str(csr))  # fmt: skip
    run("x509", "-req", "-in", str(csr), "-CA", str(paths["ca"]),
        "-CAkey", str(paths["ca-key"]), "-CAcreateserial", "-days", "1",
        "-extfile", str(ext), "-out", str(paths["server"]))  # fmt: skip
    return paths


async def test_etcds_speaks_tls_with_a_private_ca(tmp_path: Path, etcd_prefix: str) -> None:
    binary = EtcdServer.find()
    if binary is None:
        missing_server("etcd is not installed", EtcdServer.install_hint)
    certs = _make_certificates(tmp_path)

    class TlsEtcd(EtcdServer):
        @property
        def client_url(self) -> str:
            return f"https://{self.host}:{self.port}"

        def probe(self) -> bool:
            return "serving client traffic" in self.log_tail(200)

    extra = ["--cert-file", str(certs["server"]), "--key-file", str(certs["server-key"])]
    with TlsEtcd(binary, tmp_path / "etcd", extra_args=extra) as server:
        url = f"etcds://{server.host}:{server.port}?ca_file={certs['ca']}"
        async with EtcdLeaseProvider.from_url(url, prefix=etcd_prefix) as provider:
            await exercise_every_operation(provider, "k", renew_ttl_ms=NEW_TTL_MS)
        # Without the private CA the server's certificate is not trusted.
        provider = EtcdLeaseProvider.from_url(
            f"etcds://{server.host}:{server.port}", prefix=etcd_prefix, timeout_s=1
        )
        with pytest.raises(leasekit.LeaseBackendUnreachable):
            await provider.get_lease_owner("k")
        await provider.aclose()


# -- closing with operations in flight, refused and frozen servers, secrets ------------------


def etcdctl_lease_ids(server: EtcdServer) -> list[str]:
    """The etcd leases the server has, as ``etcdctl lease list`` prints them."""
    etcdctl = shutil.which("etcdctl")
    if etcdctl is None:
        missing_server("etcdctl is not installed", EtcdServer.install_hint)
    listing = subprocess.run(
        [etcdctl, "--endpoints", server.client_url, "lease", "list"],
        check=True,
        capture_output=True,
        text=True,
        env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
    ).stdout
    return [line.strip() for line in listing.splitlines()[1:] if line.strip()]


@pytest.mark.parametrize("in_flight_s", [None, 0.0, 0.005, 0.02])
async def test_aclose_with_operations_in_flight_settles_every_caller_and_leaks_no_lease(
    private_etcd_server: EtcdServer, etcd_prefix: str, in_flight_s: float | None
) -> None:
    """100 acquires, then aclose: before any of them started (None: each is refused
    with LeaseProviderClosed), as they start, or midway between grant and transaction."""
    url = private_etcd_server.url
    provider = EtcdLeaseProvider.from_url(url, prefix=etcd_prefix)
    await provider.get_lease_owner("warm-up")  # the channel is connected
    keys = [f"k{i}" for i in range(100)]
    calls = [asyncio.ensure_future(provider.acquire_lease(key, "a", LONG_MS)) for key in keys]
    if in_flight_s is not None:
        await asyncio.sleep(in_flight_s)
    await provider.aclose()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for outcome in outcomes:
        # A result, or a leasekit error: never a CancelledError that nobody asked for.
        assert isinstance(outcome, leasekit.LeaseResult | leasekit.LeaseError), repr(outcome)
    acquired = [
        key for key, o in zip(keys, outcomes, strict=True) if isinstance(o, leasekit.LeaseResult)
    ]
    assert all(o.acquired for o in outcomes if isinstance(o, leasekit.LeaseResult))
    async with EtcdLeaseProvider.from_url(url, prefix=etcd_prefix) as other:
        assert [r.key for r in await other.inspect()] == sorted(acquired, key=str.encode)
        for key in acquired:
            await other.release_lease(key, "a")
        await other.flush()
    # Every etcd lease granted was bound to a record its caller got back, or revoked.
    assert etcdctl_lease_ids(private_etcd_server) == []


def test_a_call_cut_off_at_close_leaves_nothing_for_the_next_event_loop(
    etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    """A call still on the wire when the provider closes (aclose waits for it until its
    deadline cancels it) must not have gRPC deliver its last event after the provider's
    event loop is gone: gRPC would forward it to the closed loop from the next loop that
    runs gRPC, and that loop reports "Event loop is closed". (Its own event loops.)"""
    proxy = FreezableProxy(etcd_server.host, etcd_server.port)

    reported: list[dict[str, Any]] = []

    def report(_: object, context: dict[str, Any]) -> None:
        reported.append(context)

    async def first() -> None:
        asyncio.get_running_loop().set_exception_handler(report)
        proxy.thaw()
        url = f"etcd://{proxy.host}:{proxy.port}"
        provider = EtcdLeaseProvider.from_url(url, prefix=etcd_prefix, timeout_s=0.3)
        async with provider:
            await provider.get_lease_owner("k")  # connected
            proxy.freeze()
            call = asyncio.ensure_future(provider.get_lease_owner("k"))
            await asyncio.sleep(0.05)  # on the wire, into the frozen proxy
        with pytest.raises(leasekit.LeaseError):
            await call

    async def second() -> None:
        asyncio.get_running_loop().set_exception_handler(report)
        async with EtcdLeaseProvider.from_url(etcd_server.url, prefix=etcd_prefix) as provider:
            for _ in range(10):  # gRPC's poller hands over whatever it still holds
                await provider.get_lease_owner("k")
                await asyncio.sleep(0.01)

    # Whether gRPC's poller delivers the event before the loop closes is a race: five
    # rounds catch a provider that does not wait for it in most runs.
    for _ in range(5):
        # Closed as soon as the provider is: no turn of the loop after aclose returns.
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(first())
        finally:
            loop.close()
            proxy.thaw()
    proxy.close()
    asyncio.run(second())
    assert reported == []


@pytest.mark.parametrize("members", [1, 2])
async def test_refused_connections_on_every_member_fail_fast_as_unreachable(
    members: int,
) -> None:
    timeout_s = 5.0
    hosts = ",".join(f"127.0.0.1:{free_port()}" for _ in range(members))
    loop = asyncio.get_running_loop()
    provider = EtcdLeaseProvider.from_url(f"etcd://{hosts}", timeout_s=timeout_s)
    started = loop.time()
    with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
        async with provider:
            pass
    assert loop.time() - started < timeout_s
    assert info.value.backend == "etcd"
    provider = EtcdLeaseProvider.from_url(f"etcd://{hosts}", timeout_s=timeout_s)
    for call in (
        lambda: provider.acquire_lease("k", "a", LONG_MS),
        lambda: provider.get_lease_owner("k"),
        lambda: provider.release_lease("k", "a"),
    ):
        started = loop.time()
        with pytest.raises(leasekit.LeaseBackendUnreachable) as info:
            await call()
        assert loop.time() - started < timeout_s
        assert info.value.key == "k"
    await provider.aclose()


async def test_async_with_on_a_server_that_never_answers_ends_by_the_timeout() -> None:
    """The failed check closes the provider, and closing lets gRPC settle after the call
    it cut off (0.25 s): the check stops that much earlier, so ``async with`` as a whole
    raises by ``timeout_s`` (before the fix: about ``timeout_s`` + 0.2 s, which a bound
    that holds on a loaded machine cannot tell apart: this checks the call is bounded)."""
    timeout_s = 1.0
    loop = asyncio.get_running_loop()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes each handshake; nobody ever answers
        port = silent.getsockname()[1]
        provider = EtcdLeaseProvider.from_url(f"etcd://127.0.0.1:{port}", timeout_s=timeout_s)
        started = loop.time()
        with pytest.raises(leasekit.LeaseBackendTimeout, match="no answer within 1 s"):
            async with provider:
                pass
        # A loaded machine runs the timer late: as generous as the PostgreSQL and MySQL
        # files, and still far short of a call that is never bounded.
        assert loop.time() - started < timeout_s + 5.0
    assert provider.closed


async def test_a_frozen_server_times_out_within_the_timeout(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    timeout_s = 1.0
    # A loaded machine runs the timer late; a backstop or a second attempt would show
    # as a whole timeout more.
    within_s = timeout_s + 0.5 * timeout_s
    loop = asyncio.get_running_loop()
    async with EtcdLeaseProvider.from_url(
        private_etcd_server.url, prefix=etcd_prefix, timeout_s=timeout_s
    ) as provider:
        private_etcd_server.pause()
        try:
            fresh = EtcdLeaseProvider.from_url(
                private_etcd_server.url, prefix=etcd_prefix, timeout_s=timeout_s
            )
            started = loop.time()
            with pytest.raises(leasekit.LeaseBackendTimeout):
                async with fresh:
                    pass
            assert loop.time() - started < within_s
            for call in (
                lambda: provider.get_lease_owner("k"),
                lambda: provider.acquire_lease("k", "a", 2_000),
                lambda: provider.release_lease("k", "a"),
            ):
                started = loop.time()
                with pytest.raises(leasekit.LeaseBackendTimeout) as info:
                    await call()
                assert loop.time() - started < within_s
                assert info.value.key == "k"
        finally:
            private_etcd_server.resume()


async def test_no_error_and_no_repr_shows_the_password() -> None:
    url = f"etcd://root:s3cret@127.0.0.1:{free_port()},[::1]:{free_port()}"
    provider = EtcdLeaseProvider.from_url(url, timeout_s=2)
    assert "s3cret" not in repr(provider)
    with pytest.raises(leasekit.LeaseBackendError) as info:
        await provider.acquire_lease("k", "a", LONG_MS)
    assert "s3cret" not in str(info.value)
    assert "s3cret" not in repr(info.value)
    await provider.aclose()
    assert "s3cret" not in repr(provider)


@pytest.mark.parametrize("seconds", [2, pytest.param(10, marks=pytest.mark.slow)])
async def test_500_concurrent_tasks_on_one_provider_see_no_error(
    etcd_url: str, etcd_prefix: str, seconds: float
) -> None:
    """One gRPC channel per member multiplexes every call: no pool to run out of."""
    errors: list[BaseException] = []
    cycles = 0

    async def churn(task: int, until: float) -> None:
        nonlocal cycles
        loop = asyncio.get_running_loop()
        while True:  # at least one cycle each, however late the task starts
            key = f"churn{task % 50}"
            try:
                result = await provider.acquire_lease(key, f"t{task}", LONG_MS)
                if result.acquired:
                    await provider.release_lease(key, f"t{task}")
                cycles += 1
            except leasekit.LeaseError as exc:
                errors.append(exc)
            if loop.time() >= until:
                return

    # What is tested is that nothing runs out (no pool, no stream limit): a generous
    # timeout, so that a loaded machine's slow answers are not counted as errors.
    async with EtcdLeaseProvider.from_url(etcd_url, prefix=etcd_prefix, timeout_s=60) as provider:
        until = asyncio.get_running_loop().time() + seconds
        await asyncio.gather(*(churn(task, until) for task in range(500)))
    assert errors == []
    assert cycles >= 500
