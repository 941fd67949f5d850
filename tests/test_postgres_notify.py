"""The PostgreSQL release listener: one LISTEN connection feeding the toolkit's hub.

Driven here with raw ``pg_notify`` calls on a real server, so the listener's own
behaviour (listening before watch returns, fan-out, a dropped connection) is checked
apart from the statements.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from servers import missing_extra

try:
    import psycopg
except ImportError:  # pragma: no cover
    missing_extra("postgres", "tests/test_postgres_notify.py")

from leasekit_postgres._notify import PostgresReleaseListener, channel_for, decode_payload
from leasekit_postgres._sql import GRANT_PREFIX

pytestmark = pytest.mark.anyio
BOUND_S = 20.0
CHANNEL = channel_for("leasekit_notify_test")


@pytest.fixture
async def sender(postgres_url: str) -> AsyncIterator[psycopg.AsyncConnection[object]]:
    conn = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
    yield conn
    await conn.close()


def _listener(postgres_url: str) -> PostgresReleaseListener:
    async def connect() -> psycopg.AsyncConnection[object]:
        return await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)

    return PostgresReleaseListener(connect, CHANNEL, timeout_s=5)


async def _notify(conn: psycopg.AsyncConnection[object], key: str) -> None:
    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, key.encode().hex()))


def test_payloads_round_trip_any_key() -> None:
    for key in ["k", "a\0b", "é€𝄞", "x" * 1024]:
        assert decode_payload(key.encode().hex()) == (key, False)
        assert decode_payload(GRANT_PREFIX + key.encode().hex()) == (key, True)
    assert decode_payload("not hex") is None
    assert decode_payload(GRANT_PREFIX + "zz") is None
    assert decode_payload("ff") is None  # not UTF-8


async def test_a_notify_after_watch_returns_wakes_only_that_keys_waiters(
    postgres_url: str, sender: psycopg.AsyncConnection[object]
) -> None:
    listener = _listener(postgres_url)
    try:
        watch = await listener.watch("a\0key")
        other = await listener.watch("other")
        await _notify(sender, "a\0key")
        assert await watch.wait(BOUND_S)
        assert not await other.wait(0.2)
    finally:
        await listener.aclose()


async def test_a_dropped_connection_wakes_waiters_and_the_next_watch_listens_again(
    postgres_url: str, sender: psycopg.AsyncConnection[object]
) -> None:
    listener = _listener(postgres_url)
    try:
        watch = await listener.watch("k")
        await listener.break_connection()
        assert await watch.wait(BOUND_S)
        again = await listener.watch("k")
        await _notify(sender, "k")
        assert await again.wait(BOUND_S)
    finally:
        await listener.aclose()
