"""leasekit.sync on etcd: the native blocking provider on grpc's blocking channels.

That the native path is taken (no loop thread), the contract's rows and fencing tokens
through it, that it shares its records with the async provider, that 16 threads on one
key make one owner, that a stopped server is a typed timeout within timeout_s, that
bad input is refused before any I/O, and that no etcd lease is left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
from servers import EtcdCluster, EtcdServer, missing_extra
from test_etcd import client_calls, delta, grpc_calls

import leasekit
import leasekit.sync
from leasekit import (
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseProviderClosed,
)
from leasekit.backend import SyncBackendProvider, sync_factory

try:
    import leasekit_etcd
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("etcd", "the etcd tests")

LONG_TTL_MS = 60_000
THREADS = 16


@pytest.fixture
def url(etcd_url: str, etcd_prefix: str) -> str:
    return f"{etcd_url}?prefix={etcd_prefix}"


def loop_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("leasekit-sync")}


def test_etcd_offers_a_native_provider(url: str) -> None:
    backend = leasekit_etcd.EtcdLeaseProvider
    assert sync_factory(backend) == backend.sync_from_url
    assert issubclass(leasekit_etcd.EtcdSyncLeaseProvider, SyncBackendProvider)
    before = loop_threads()
    with leasekit.sync.connect(url) as leases:
        assert leases.native
        assert leases.capabilities == backend.capabilities
        assert loop_threads() == before
        assert "EtcdSyncLeaseProvider" in repr(leases)
    with pytest.raises(LeaseProviderClosed):
        leases.get_lease_owner("k")


def test_every_row_of_the_contract(url: str) -> None:
    with leasekit_etcd.EtcdLeaseProvider.sync_from_url(url) as leases:
        first = leases.acquire_lease("k", "a", LONG_TTL_MS)
        assert (first.acquired, first.owner) == (True, "a")
        assert isinstance(first.token, int)
        again = leases.acquire_lease("k", "a", LONG_TTL_MS)
        assert again == first  # idempotent, same token
        denied = leases.acquire_lease("k", "b", LONG_TTL_MS)
        assert (denied.acquired, denied.owner, denied.token) == (False, "a", None)
        assert leases.get_lease_owner("k") == "a"
        assert not leases.renew_lease("k", "b", LONG_TTL_MS)
        assert leases.renew_lease("k", "a", LONG_TTL_MS)
        assert leases.renew_lease("k", "a", LONG_TTL_MS + 5000)  # a new TTL: a new etcd lease
        leases.release_lease("k", "b")  # not the holder: nothing changes
        assert leases.get_lease_owner("k") == "a"
        assert not leases.transfer_lease("k", "b", "c", LONG_TTL_MS)
        assert leases.transfer_lease("k", "a", "a", LONG_TTL_MS)  # same owner: a renewal
        assert leases.transfer_lease("k", "a", "b", LONG_TTL_MS)
        assert leases.get_lease_owner("k") == "b"
        [record] = leases.inspect("k")
        assert (record.key, record.owner) == ("k", "b")
        assert record.token is not None
        assert record.token > first.token
        leases.release_lease("k", "b")
        assert leases.get_lease_owner("k") is None
        later = leases.acquire_lease("k", "a", LONG_TTL_MS)
        assert later.acquired
        assert later.token is not None
        assert later.token > record.token
        leases.release_lease("k", "a")
        key = "thread\0one ünïcode"
        assert leases.acquire_lease(key, "o\0wner", LONG_TTL_MS).owner == "o\0wner"
        assert leases.get_lease_owner(key) == "o\0wner"
        leases.release_lease(key, "o\0wner")


def test_a_lease_expires_at_its_etcd_ttl(url: str) -> None:
    with leasekit.sync.connect(url) as leases:
        ttl_ms = leases.capabilities.min_ttl_ms
        assert leases.acquire_lease("short", "a", ttl_ms).acquired
        deadline = time.monotonic() + ttl_ms / 1000 + 5
        while leases.get_lease_owner("short") is not None:
            assert time.monotonic() < deadline, "the etcd lease never expired"
            time.sleep(0.2)
        assert not leases.renew_lease("short", "a", ttl_ms)
        assert leases.acquire_lease("short", "b", LONG_TTL_MS).acquired
        leases.release_lease("short", "b")


def test_sync_and_async_providers_share_one_keyspace(url: str) -> None:
    async def check() -> None:
        async with leasekit.connect(url) as provider:
            assert await provider.get_lease_owner("shared") == "sync-owner"
            assert await provider.transfer_lease("shared", "sync-owner", "async", LONG_TTL_MS)

    with leasekit.sync.connect(url) as leases:
        assert leases.acquire_lease("shared", "sync-owner", LONG_TTL_MS).acquired
        asyncio.run(check())
        assert leases.get_lease_owner("shared") == "async"
        assert not leases.renew_lease("shared", "sync-owner", LONG_TTL_MS)
        leases.release_lease("shared", "async")


def test_sixteen_threads_on_one_key_make_one_owner(url: str) -> None:
    with leasekit.sync.connect(url) as leases:
        for round_no in range(3):
            key = f"race-{round_no}"
            start = threading.Barrier(THREADS)

            def contend(index: int, key: str = key, start: threading.Barrier = start) -> Any:
                start.wait()
                return leases.acquire_lease(key, f"worker-{index}", LONG_TTL_MS)

            with ThreadPoolExecutor(THREADS) as pool:
                results = list(pool.map(contend, range(THREADS)))
            winners = [r.owner for r in results if r.acquired]
            assert len(winners) == 1, results
            assert {r.owner for r in results} == set(winners)
            assert leases.get_lease_owner(key) == winners[0]
            leases.release_lease(key, winners[0])


def test_no_etcd_lease_is_left_behind(private_etcd_server: EtcdServer) -> None:
    with leasekit.sync.connect(private_etcd_server.url) as leases:
        for index in range(5):
            key = f"k{index}"
            assert leases.acquire_lease(key, "a", LONG_TTL_MS).acquired
            assert private_etcd_server.lease_ids() != []  # the grant's own etcd lease
            assert not leases.acquire_lease(key, "b", LONG_TTL_MS).acquired
            assert leases.renew_lease(key, "a", LONG_TTL_MS + 5000)
            assert leases.transfer_lease(key, "a", "b", LONG_TTL_MS)
            leases.release_lease(key, "b")
    # close() drained the background revocations.
    assert private_etcd_server.lease_ids() == []


def test_a_warm_blocking_provider_acquires_a_free_key_in_one_round_trip(
    private_etcd_server: EtcdServer, etcd_prefix: str, wide_reuse_window: int
) -> None:
    """As the async provider: the etcd lease a release left empty is bound again by the
    next acquire, in its one transaction (before, each acquire granted one: 2 round
    trips, and a revocation after each release)."""
    server = private_etcd_server
    with leasekit_etcd.EtcdSyncLeaseProvider.from_url(server.url, prefix=etcd_prefix) as leases:
        assert leases.acquire_lease("k0", "a", 10_000).acquired
        leases.release_lease("k0", "a")
        [idle] = server.lease_ids()
        assert server.lease_ttl(idle)[1] == 10 + wide_reuse_window
        before = grpc_calls(server)
        for i in range(20):
            assert leases.acquire_lease(f"k{i % 3}", f"o{i}", 10_000).acquired
            assert server.lease_ids() == [idle]  # the record is on the idle lease
            leases.release_lease(f"k{i % 3}", f"o{i}")
        assert client_calls(delta(grpc_calls(server), before)) == {"Txn": 40}
        leases.flush()  # revokes the idle one
        assert server.lease_ids() == []
        assert leases.lease_ids() == []
    assert server.lease_ids() == []


def test_a_blocking_providers_idle_etcd_lease_is_revoked_once_it_can_no_longer_be_bound(
    private_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    """Its timer runs on the provider's background thread: the idle lease goes about a
    second after its grant, not at the next acquire, a flush or close."""
    server = private_etcd_server
    with leasekit_etcd.EtcdSyncLeaseProvider.from_url(server.url, prefix=etcd_prefix) as leases:
        assert leases.acquire_lease("k", "a", 10_000).acquired
        leases.release_lease("k", "a")
        [idle] = server.lease_ids()
        assert server.lease_ttl(idle)[1] == 11  # one second more than asked, for reuse
        deadline = time.monotonic() + 10  # a bound only a broken timer reaches
        while idle in server.lease_ids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.lease_ids() == []  # revoked by the provider, long before its TTL
        assert len(leases._pool) == 0
        assert leases.acquire_lease("k", "a", 10_000).acquired  # a fresh grant
        [fresh] = server.lease_ids()
        assert fresh != idle
        leases.release_lease("k", "a")
    assert server.lease_ids() == []


def test_the_lease_pools_timers_run_on_the_revocation_thread() -> None:
    """The pool itself, on the blocking driver's clock and thread: an idle lease is
    revoked once it can no longer be bound; one kept alive meanwhile only when its
    new window closes; one bound again in between not at all."""
    from leasekit_etcd._blocking import Revoker  # noqa: PLC0415
    from leasekit_etcd._pool import LeasePool  # noqa: PLC0415

    revoked: list[int] = []
    revoker = Revoker(cast("Any", None), timeout_s=1.0)  # timers only: no transport used
    pool = LeasePool(revoked.append, now=time.monotonic, call_at=revoker.call_at)
    now = time.monotonic()
    for lease in (1, 2, 3):  # 11 s leases, windows closing 0.05 s from now
        pool.granted(lease, 11, now - 0.85)
        assert pool.give_back(lease, now)
    pool.kept_alive(2, 11, now)  # its window now closes 0.9 s from now
    assert pool.take(11, 10, now) == 3  # bound again: not idle any more
    deadline = time.monotonic() + 10  # a bound only a broken timer reaches
    while len(revoked) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert revoked == [1, 2]
    assert len(pool) == 0
    revoker.drain()


def test_a_stopped_server_is_a_typed_timeout_within_the_bound_then_recovers(
    private_etcd_server: EtcdServer,
) -> None:
    timeout_s = 1.0
    with leasekit.sync.connect(private_etcd_server.url, timeout_s=timeout_s) as leases:
        assert leases.native
        assert leases.acquire_lease("k", "a", LONG_TTL_MS).acquired
        private_etcd_server.pause()
        try:
            for call in (
                lambda: leases.get_lease_owner("k"),
                lambda: leases.renew_lease("k", "a", LONG_TTL_MS),
                lambda: leases.transfer_lease("k", "a", "b", LONG_TTL_MS),
                lambda: leases.acquire_lease("other", "a", LONG_TTL_MS),
            ):
                started = time.monotonic()
                with pytest.raises(LeaseBackendTimeout) as caught:
                    call()
                # gRPC's own deadline ends it; the slack is for a loaded machine.
                assert time.monotonic() - started < timeout_s + 5
                assert caught.value.backend == "etcd"
        finally:
            private_etcd_server.resume()
        owner = leases.get_lease_owner("k")
        assert owner in ("a", "b")


def test_a_refused_connection_is_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(LeaseBackendUnreachable) as caught:
        leasekit.sync.connect(f"etcd://127.0.0.1:{port}").open()
    assert caught.value.backend == "etcd"


def test_bad_options_and_input_raise_before_any_io() -> None:
    # Nothing listens on port 9: any I/O would fail as unreachable, not as bad input.
    url = "etcd://127.0.0.1:9"
    with pytest.raises(InvalidLeaseArgument, match="prefix"):
        leasekit.sync.connect(url, prefix="")
    with pytest.raises(InvalidLeaseArgument, match="nonsense"):
        leasekit.sync.connect(url, nonsense=1)
    with pytest.raises(InvalidLeaseArgument, match="ca_file"):
        leasekit.sync.connect(url, ca_file="/nowhere.pem")
    leases = leasekit_etcd.EtcdLeaseProvider.sync_from_url(url)
    try:
        for call, argument in (
            (lambda: leases.acquire_lease("k", "a", 0), "ttl_ms"),
            (lambda: leases.acquire_lease("", "a", LONG_TTL_MS), "key"),
            (lambda: leases.renew_lease("k", "", LONG_TTL_MS), "owner"),
            (lambda: leases.transfer_lease("k", "a", "", LONG_TTL_MS), "to_owner"),
            (lambda: leases.release_lease("k" * 2000, "a"), "key"),
            (lambda: leases.get_lease_owner(b"k"), "key"),  # type: ignore[arg-type]
            (lambda: leases.inspect(limit=0), "limit"),
        ):
            with pytest.raises(InvalidLeaseArgument) as caught:
                call()
            assert caught.value.argument == argument
        assert not any(member.opened for member in leases._transport.members.members)
    finally:
        leases.close()


# Run in an interpreter of its own: this test process has started gRPC long ago.
FORK_SCRIPT = """
import json, os, sys
import leasekit.sync

leases = leasekit.sync.connect(sys.argv[1])  # no I/O yet: gRPC has not started
pid = os.fork()
if pid == 0:
    code = 1
    try:
        result = leases.acquire_lease("forked", "child", 60000)  # rebuilt in the child
        leases.release_lease("forked", "child")
        leases.close()
        print(json.dumps({"child_acquired": result.acquired}), flush=True)
        code = 0
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
with leases:  # the parent's provider, untouched by the child
    assert leases.get_lease_owner("forked") is None
    held = leases.acquire_lease("forked", "parent", 60000).acquired
    child = os.fork()
    if child == 0:
        try:
            leases.get_lease_owner("forked")
        except Exception as exc:
            print(json.dumps({"refused": type(exc).__name__, "why": str(exc)}), flush=True)
        os._exit(0)
    os.waitpid(child, 0)
    leases.release_lease("forked", "parent")
print(json.dumps({"child_status": status, "parent_held": held}), flush=True)
"""


def test_a_forked_child_rebuilds_a_provider_its_parent_never_used(url: str) -> None:
    """Before gRPC starts in the parent, a child's provider is rebuilt and works; after,
    a child refuses (gRPC cannot run in a child forked once it started)."""
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"},
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0] == {"child_acquired": True}
    assert lines[1]["refused"] == "LeaseProviderClosed"
    assert "forked" in lines[1]["why"]
    assert lines[2] == {"child_status": 0, "parent_held": True}


# -- failover on a three-member cluster ------------------------------------------------------

CLUSTER_TIMEOUT_S = 2.0
PATIENCE_S = CLUSTER_TIMEOUT_S + 10


def answered(call: Any) -> Any:
    """``call()``'s answer once the cluster gives one (a LeaseBackendError until then)."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        try:
            return call()
        except LeaseBackendError:  # noqa: PERF203 (retried until the cluster answers)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def cluster_url(cluster: EtcdCluster) -> str:
    endpoints = ",".join(f"{m.host}:{m.port}" for m in cluster.members)
    return f"etcd://{endpoints}?timeout_s={CLUSTER_TIMEOUT_S}"


@pytest.mark.slow  # elections and timeouts
def test_a_lease_is_held_through_a_leader_kill_and_a_frozen_member(
    private_etcd_cluster: EtcdCluster,
) -> None:
    with (
        leasekit.sync.connect(cluster_url(private_etcd_cluster)) as holder,
        leasekit.sync.connect(cluster_url(private_etcd_cluster)) as rival,
    ):
        assert holder.native
        granted = holder.acquire_lease("k", "holder", LONG_TTL_MS)
        assert granted.token is not None
        leader = private_etcd_cluster.wait_healthy()
        leader.kill()
        # The two left elect a new leader; meanwhile nobody else gets the key.
        assert not answered(lambda: rival.acquire_lease("k", "rival", LONG_TTL_MS)).acquired
        assert answered(lambda: holder.renew_lease("k", "holder", LONG_TTL_MS))
        assert answered(lambda: rival.get_lease_owner("k")) == "holder"
        leader.start()
        private_etcd_cluster.wait_healthy()
        # Freeze the member both providers are pinned to, or any: calls move on.
        frozen = private_etcd_cluster.members[0]
        frozen.pause()
        try:
            assert answered(lambda: holder.renew_lease("k", "holder", LONG_TTL_MS))
            for _ in range(3):
                denied = answered(lambda: rival.acquire_lease("k", "rival", LONG_TTL_MS))
                assert (denied.acquired, denied.owner) == (False, "holder")
            assert answered(lambda: holder.transfer_lease("k", "holder", "next", LONG_TTL_MS))
            moved = answered(lambda: rival.acquire_lease("k", "next", LONG_TTL_MS))
            assert moved.token is not None
            assert moved.token > granted.token
        finally:
            frozen.resume()
        private_etcd_cluster.wait_healthy()
        answered(lambda: rival.release_lease("k", "next"))
        assert answered(lambda: holder.get_lease_owner("k")) is None
