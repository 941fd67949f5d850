# A module over 500 lines: one backend feature (replication) tested end to end, fast and slow.
"""The PostgreSQL backend with replication: multi-host URLs, a synchronous standby, and
fencing tokens that never go back after a promotion (issue 24).

Fast tests run on the shared server: option checks, the refusal without a synchronous
standby, tokens after a simulated promotion of a lagging standby (the sequence set back,
the last rows gone, as on a standby that missed them), a connection that reaches a
read-only server, and both providers on a multi-host URL whose first host is down.

The ``slow`` tests start a primary and a streaming standby (``tests/servers.py``:
:class:`~servers.PostgresReplicatedPair`), kill the primary after a burst of grants,
promote the standby and go on through the same multi-host URL: a few failovers per
mode, the full measurement is ``benchmarks/failover_postgres.py``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from scenarios import LONG_MS
from servers import PostgresReplicatedPair, PostgresServer, free_port, missing_extra, missing_server

import leasekit
import leasekit.sync

try:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import ConnectionPool
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("postgres", "the PostgreSQL tests")

from leasekit_postgres import PostgresLeaseProvider, PostgresSyncLeaseProvider
from leasekit_postgres._commit import CommitWatch
from leasekit_postgres._options import pool_settings
from leasekit_postgres._sql import SCHEMA_VERSION

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
BIGINT_MAX = 2**63 - 1


def identifier(name: str) -> sql.Identifier:
    return sql.Identifier(*name.split("."))


def admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def with_query(url: str, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


def eventually(predicate: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    """Wait until ``predicate()`` is true; fail after a limit only a hung test reaches."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def dead_host() -> str:
    """``127.0.0.1:port`` where nothing listens: libpq's connection there is refused."""
    return f"127.0.0.1:{free_port()}"


def multi_host(url: str, first: str) -> str:
    """``url`` with ``first`` (``host:port``) named before its own host."""
    scheme, rest = url.split("://", 1)
    user, hostpart = rest.split("@", 1)
    return f"{scheme}://{user}@{first},{hostpart}"


# -- options, no I/O ----------------------------------------------------------------------


def test_a_multi_host_url_is_accepted_and_connects_only_to_a_writable_server() -> None:
    settings = pool_settings("postgresql://app@db1:5433,db2:5434/app", {})
    params = conninfo_to_dict(settings.conninfo)
    assert params["host"] == "db1,db2"
    assert params["port"] == "5433,5434"
    assert params["target_session_attrs"] == "read-write"


def test_an_explicit_target_session_attrs_is_kept_and_one_host_gets_none() -> None:
    url = "postgresql://app@db1,db2/app?target_session_attrs=primary"
    params = conninfo_to_dict(pool_settings(url, {}).conninfo)
    assert params["target_session_attrs"] == "primary"
    one = conninfo_to_dict(pool_settings("postgresql://app@db1/app", {}).conninfo)
    assert "target_session_attrs" not in one


@pytest.mark.parametrize("level", ["remote_write", "on", "remote_apply"])
def test_synchronous_commit_goes_into_the_connections_startup_options(level: str) -> None:
    settings = pool_settings(f"postgresql://app@db1,db2/app?synchronous_commit={level}", {})
    options = conninfo_to_dict(settings.conninfo)["options"]
    assert f"-c synchronous_commit={level}" in options
    assert "-c statement_timeout=5000" in options
    assert settings.provider["synchronous_commit"] == level


@pytest.mark.parametrize("level", ["off", "local", "ON", "", "remote"])
def test_a_synchronous_commit_level_that_waits_for_no_standby_is_refused(level: str) -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument, match="synchronous_commit") as caught:
        pool_settings("postgresql://app@db1,db2/app", {"synchronous_commit": level})
    assert caught.value.argument == "synchronous_commit"
    if not level:
        return  # in a URL, an empty value means unset
    with pytest.raises(leasekit.InvalidLeaseArgument, match="remote_apply"):
        PostgresLeaseProvider.from_url(f"postgresql://app@db/app?synchronous_commit={level}")
    with pytest.raises(leasekit.InvalidLeaseArgument, match="synchronous_commit"):
        leasekit.sync.connect(f"postgresql://app@db/app?synchronous_commit={level}")


def test_synchronous_commit_must_be_text() -> None:
    with pytest.raises(leasekit.InvalidLeaseArgument, match="synchronous_commit"):
        pool_settings("postgresql://app@db/app", {"synchronous_commit": True})


def test_a_commit_watch_turns_only_a_generic_warning_into_an_unknown_outcome() -> None:
    watch = CommitWatch()
    watch.notice(SimpleNamespace(severity_nonlocalized="NOTICE", sqlstate="00000"))
    watch.notice(SimpleNamespace(severity_nonlocalized="WARNING", sqlstate="25P01"))
    watch.check(" (server s)")  # neither counts
    watch.notice(SimpleNamespace(severity_nonlocalized="WARNING", sqlstate="01000"))
    with pytest.raises(leasekit.LeaseBackendTimeout, match=r"did not acknowledge.*\(server s\)"):
        watch.check(" (server s)", "k")
    watch.check(" (server s)")  # reported once


# -- the refusal without a synchronous standby -----------------------------------------------


async def test_synchronous_commit_without_a_synchronous_standby_refuses_to_start(
    postgres_url: str, postgres_table: str
) -> None:
    url = with_query(postgres_url, synchronous_commit="remote_apply")
    provider = PostgresLeaseProvider.from_url(url, table=postgres_table)
    with pytest.raises(leasekit.LeaseBackendError, match="synchronous_standby_names is empty"):
        async with provider:
            pass
    provider = PostgresLeaseProvider.from_url(url, table=postgres_table)
    with pytest.raises(leasekit.LeaseBackendError, match="synchronous_standby_names is empty"):
        await provider.acquire_lease("k", "a", LONG_MS)
    await provider.aclose()
    # Nothing was written: not even the schema.
    with admin(postgres_url) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (postgres_table,)).fetchone()
    assert found == (None,)


def test_the_blocking_provider_refuses_too(postgres_url: str, postgres_table: str) -> None:
    url = with_query(postgres_url, synchronous_commit="on", table=postgres_table)
    provider = PostgresSyncLeaseProvider.from_url(url)
    assert provider.synchronous_commit == "on"
    with pytest.raises(leasekit.LeaseBackendError, match="no commit waits"):
        provider.acquire_lease("k", "a", LONG_MS)
    provider.close()
    refused = pytest.raises(leasekit.LeaseBackendError, match="no commit waits")
    with refused, leasekit.sync.connect(url):
        pass


# -- tokens after a promotion ----------------------------------------------------------------


def promote_a_lagging_standby(url: str, table: str, last_value: int, rows: list[Any]) -> None:
    """Make the server look like a standby promoted after it missed the latest commits.

    The sequence goes back to ``last_value`` (what the standby had replayed: ``nextval``
    is WAL-logged ahead in batches, and it missed the latest batch), and the lease
    table holds only ``rows``, the rows as the standby had them.
    """
    with admin(url) as conn:
        conn.execute(
            sql.SQL("SELECT setval(%s, %s)"),
            (f"{table}_token_seq", last_value),
        )
        conn.execute(sql.SQL("DELETE FROM {}").format(identifier(table)))
        for row in rows:
            conn.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s)").format(identifier(table)),
                row,
            )


async def test_tokens_never_go_back_after_a_lagging_standby_is_promoted(
    postgres_url: str, postgres_table: str
) -> None:
    """Fails on sequence-only tokens: the promoted server reissues token 2, then 3, ..."""
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) as provider:
        first = await provider.acquire_lease("k", "a", 1)
        assert first.token is not None
        with admin(postgres_url) as conn:
            seq = f"{postgres_table}_token_seq"
            (last_value,) = conn.execute(
                sql.SQL("SELECT last_value FROM {}").format(identifier(seq))
            ).fetchone() or (0,)
            standby_rows = conn.execute(
                sql.SQL("SELECT * FROM {}").format(identifier(postgres_table))
            ).fetchall()
        # What the standby misses: takeovers of k, and a brand-new key, past a batch of 32.
        issued: dict[str, int] = {"k": first.token}
        for i in range(40):
            await asyncio.sleep(0.002)  # each lease of 1 ms expires
            result = await provider.acquire_lease("k", f"o{i}", 1)
            assert result.token is not None
            assert result.token > issued["k"]
            issued["k"] = result.token
        fresh = await provider.acquire_lease("new", "x", LONG_MS)
        assert fresh.token is not None
        issued["new"] = fresh.token
        promote_a_lagging_standby(postgres_url, postgres_table, last_value, standby_rows)
        await asyncio.sleep(0.002)
        after_k = await provider.acquire_lease("k", "after", LONG_MS)  # a takeover
        after_new = await provider.acquire_lease("new", "after", LONG_MS)  # an insert
    assert after_k.acquired
    assert after_new.acquired
    assert after_k.token is not None
    assert after_new.token is not None
    assert after_k.token > issued["k"], (after_k.token, issued["k"])
    assert after_new.token > issued["new"], (after_new.token, issued["new"])
    assert max(after_k.token, after_new.token) <= BIGINT_MAX


async def test_tokens_are_unique_across_keys_and_increase_per_key(
    postgres_url: str, postgres_table: str
) -> None:
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) as provider:
        results = await asyncio.gather(
            *(provider.acquire_lease(f"k{i}", "a", LONG_MS) for i in range(50))
        )
        tokens = [r.token for r in results]
        assert len(set(tokens)) == 50
        moved = await provider.transfer_lease("k0", "a", "b", LONG_MS)
        assert moved
        again = await provider.acquire_lease("k0", "b", LONG_MS)
    assert again.token is not None
    assert results[0].token is not None
    assert again.token > results[0].token


async def test_a_version_1_table_is_migrated_and_its_tokens_go_on_increasing(
    postgres_url: str, postgres_table: str
) -> None:
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) as provider:
        old = await provider.acquire_lease("k", "a", 1)
    meta = identifier(f"{postgres_table}_meta")
    with admin(postgres_url) as conn:
        conn.execute(sql.SQL("UPDATE {} SET value = 1").format(meta))
        # A token as leasekit 1 drew it, from the sequence alone: small.
        conn.execute(sql.SQL("UPDATE {} SET token = 41").format(identifier(postgres_table)))
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table) as provider:
        await asyncio.sleep(0.002)
        new = await provider.acquire_lease("k", "b", LONG_MS)
    with admin(postgres_url) as conn:
        version = conn.execute(sql.SQL("SELECT value FROM {}").format(meta)).fetchone()
    assert version == (SCHEMA_VERSION,)
    assert old.token is not None
    assert new.token is not None
    assert new.token > 41


# -- a connection on a read-only server --------------------------------------------------------


def sessions(url: str, application_name: str) -> int:
    with admin(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    return 0 if row is None else int(row[0])


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "blocking"])
async def test_a_write_on_a_read_only_server_is_unreachable_and_its_connection_dropped(
    postgres_url: str, postgres_table: str, blocking: bool
) -> None:
    """A standby, as a connection without target_session_attrs may reach one.

    ``default_transaction_read_only`` makes the server refuse writes the way a standby
    does (``ReadOnlySqlTransaction``).
    """
    async with PostgresLeaseProvider.from_url(postgres_url, table=postgres_table):
        pass  # the schema, created while writable
    name = f"leasekit-ro-{uuid.uuid4().hex[:8]}"
    url = with_query(
        postgres_url,
        table=postgres_table,
        application_name=name,
        options="-c%20default_transaction_read_only%3Don",
        pool_min_size="0",
        pool_max_size="1",
    )
    if blocking:
        with leasekit.sync.connect(url) as sync_provider:
            with pytest.raises(leasekit.LeaseBackendUnreachable, match="read-only"):
                sync_provider.acquire_lease("k", "a", LONG_MS)
            assert sync_provider.get_lease_owner("k") is None  # reads still work
            with pytest.raises(leasekit.LeaseBackendUnreachable, match="read-only"):
                sync_provider.transfer_lease("k", "a", "b", LONG_MS)
            eventually(lambda: sessions(postgres_url, name) <= 1, "the connection dropped")
    else:
        provider = PostgresLeaseProvider.from_url(url)
        async with provider:
            with pytest.raises(leasekit.LeaseBackendUnreachable, match="read-only"):
                await provider.acquire_lease("k", "a", LONG_MS)
            # Dropped, not given back to the pool: no session of ours is left.
            eventually(lambda: sessions(postgres_url, name) == 0, "the connection dropped")
            assert provider.client.get_stats().get("connections_num", 0) >= 2  # type: ignore[union-attr]


# -- multi-host URLs -------------------------------------------------------------------------


async def test_the_async_provider_on_a_multi_host_url_whose_first_host_is_down(
    postgres_url: str, postgres_table: str
) -> None:
    url = multi_host(postgres_url, dead_host())
    async with PostgresLeaseProvider.from_url(url, table=postgres_table) as provider:
        granted = await provider.acquire_lease("k", "a", LONG_MS)
        assert granted.acquired
        assert await provider.get_lease_owner("k") == "a"


def test_the_blocking_provider_on_a_multi_host_url_whose_first_host_is_down(
    postgres_url: str, postgres_table: str
) -> None:
    url = with_query(multi_host(postgres_url, dead_host()), table=postgres_table)
    with leasekit.sync.connect(url) as provider:
        assert provider.acquire_lease("k", "a", LONG_MS).acquired
        assert provider.get_lease_owner("k") == "a"
        provider.release_lease("k", "a")
        assert provider.get_lease_owner("k") is None


def test_a_multi_host_provider_works_in_a_forked_child(
    postgres_url: str, postgres_table: str
) -> None:
    url = with_query(multi_host(postgres_url, dead_host()), table=postgres_table)
    with leasekit.sync.connect(url) as provider:
        assert provider.acquire_lease("parent", "p", LONG_MS).acquired
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork() in a process with threads: that is the point.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover (the child's coverage is not collected)
            code = 1
            try:
                if provider.acquire_lease("child", "c", LONG_MS).acquired:
                    code = 0 if provider.get_lease_owner("parent") == "p" else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise AssertionError("the forked child hung")
            time.sleep(0.02)
        assert os.waitstatus_to_exitcode(status) == 0
        assert provider.get_lease_owner("child") == "c"
        assert provider.acquire_lease("parent", "p", LONG_MS).acquired  # still usable


def test_a_multi_host_url_with_no_live_host_is_unreachable_within_the_timeout() -> None:
    first, second = dead_host(), dead_host()
    url = f"postgresql://postgres@{first},{second}/postgres?timeout_s=2"
    unreachable = pytest.raises(leasekit.LeaseBackendUnreachable, match=f"server {first},{second}/")
    with unreachable, leasekit.sync.connect(url):
        pass
    provider = PostgresLeaseProvider.sync_from_url(url)
    with pytest.raises(leasekit.LeaseBackendUnreachable, match="refused"):
        provider.acquire_lease("k", "a", LONG_MS)
    provider.close()


# -- failovers (slow: a primary and a standby) ---------------------------------------------------


def failover_bench() -> Any:
    """``benchmarks/failover_postgres.py`` as a module: the tests run its failovers."""
    path = ROOT / "benchmarks" / "failover_postgres.py"
    spec = importlib.util.spec_from_file_location("failover_postgres", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["failover_postgres"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async-behind", "sync"])
def test_failovers_lose_no_token_and_with_a_synchronous_standby_no_grant(
    mode: str, tmp_path: Path
) -> None:
    """Two failovers through one provider on the multi-host URL (about 10 s a mode).

    ``async-behind``: the standby received nothing of the burst, so every grant of it
    is lost, and the sequence it promotes with is behind (sequence-only tokens went
    back here); ``sync``: nothing is lost. No token goes back in either.
    """
    binary = PostgresServer.find()
    if binary is None:
        missing_server("PostgreSQL is not installed", PostgresServer.install_hint)
    bench = failover_bench()
    tally = asyncio.run(bench.run_mode(mode, binary, tmp_path, 2, 40))
    assert tally.failovers == 2
    assert tally.grants == 80
    assert tally.regressions == 0
    # The URL followed each promotion: the first call after it answered (within timeout_s).
    assert len(tally.reconnect_s) == 2
    if mode == "sync":
        assert tally.lost == 0
    else:
        assert tally.lost_per_failover == [40, 40]


def cancel_when_waiting_for_the_standby(url: str) -> None:
    """``pg_cancel_backend`` the session whose commit waits for the synchronous standby."""
    with admin(url) as conn:
        deadline = time.monotonic() + 10
        while True:
            row = conn.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ).fetchone()
            if row is not None:
                return
            if time.monotonic() > deadline:
                raise AssertionError("no session waited for the synchronous standby")
            time.sleep(0.02)


@pytest.mark.slow
def test_on_a_synchronous_pair_a_callers_pool_needs_the_level_and_an_unacknowledged_commit_fails(
    tmp_path: Path,
) -> None:
    """One pair (about 10 s): the level check, a failover under the blocking provider, then
    commits the standby never acknowledges.

    With the standby gone, a commit waits for it (statement_timeout does not cover that
    wait): the call ends at timeout_s. Cancelled meanwhile (``pg_cancel_backend``),
    PostgreSQL answers "acquired" with a warning, the commit kept on the primary alone:
    the provider reports the unknown outcome instead.
    """
    binary = PostgresServer.find()
    if binary is None:
        missing_server("PostgreSQL is not installed", PostgresServer.install_hint)
    pair = PostgresReplicatedPair(binary, tmp_path, synchronous=True)
    level_on = {"autocommit": True, "options": "-c synchronous_commit=on"}
    with (
        pair,
        ConnectionPool(pair.url, kwargs={"autocommit": True}, open=True) as pool,
        ConnectionPool(pair.url, kwargs=level_on, open=True) as level_on_pool,
    ):
        provider = PostgresSyncLeaseProvider(pool, synchronous_commit="remote_apply")
        with pytest.raises(leasekit.LeaseBackendError, match="run with synchronous_commit=on"):
            provider.acquire_lease("k", "a", LONG_MS)
        provider.close()
        accepted = PostgresSyncLeaseProvider(
            level_on_pool, synchronous_commit="on", timeout_s=1.0, sweep_grace_s=60
        )
        first = accepted.acquire_lease("k", "a", LONG_MS)
        assert first.acquired
        assert first.token is not None
        # The blocking provider through a failover: the grant survived (the standby had
        # it), the first call after the promotion finds the new primary, and once a new
        # standby is there, writes go on with a greater token.
        pair.fail_over()
        assert accepted.get_lease_owner("k") == "a"
        pair.rebuild()
        accepted.release_lease("k", "a")
        second = accepted.acquire_lease("k", "b", LONG_MS)
        assert second.token is not None
        assert second.token > first.token
        pair.standby.kill()
        with pytest.raises(leasekit.LeaseBackendTimeout, match="no answer within 1 s"):
            accepted.acquire_lease("k1", "b", LONG_MS)
        accepted.close()
        with admin(pair.primary.url) as conn:  # the abandoned call's session waits still
            conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE wait_event = 'SyncRep'"
            )
        patient = PostgresSyncLeaseProvider(level_on_pool, synchronous_commit="on", timeout_s=30)
        canceller = threading.Thread(
            target=cancel_when_waiting_for_the_standby, args=(pair.primary.url,)
        )
        canceller.start()
        try:
            with pytest.raises(leasekit.LeaseBackendTimeout, match="did not acknowledge"):
                patient.acquire_lease("k2", "b", LONG_MS)
        finally:
            canceller.join()
        # It stands on the primary (a read waits for no standby): the outcome was unknown.
        assert patient.get_lease_owner("k2") == "b"
        patient.close()


def test_leasekit_backends_names_the_multi_host_url() -> None:
    infos = {info.scheme: info for info in leasekit.available_backends(check=True)}
    forms = infos["postgresql"].url_forms
    assert any("h1:5432,h2:5432" in form for form in forms)
    assert any("synchronous_commit" in form for form in forms)
    assert infos["memory"].url_forms == ()
