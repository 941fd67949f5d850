"""Release and grant notifications over PostgreSQL ``LISTEN``/``NOTIFY``: one connection
per provider.

The statements that release or transfer a lease call ``pg_notify`` in the same
statement (no extra round trip), on one channel per lease table, with the key as
payload (hex: a payload is text and may not hold NUL). The acquire statement does too
when the key changed hands (a grant hint: ``GRANT_PREFIX`` and the key in hex), which
wakes only the watchers that asked for grants (``watch_owner``, ``leaders``). A
notification is delivered when its statement commits, in commit order, to every
session listening.

:class:`PostgresReleaseListener` holds the one listening connection of a provider,
outside its pool (a pooled connection cannot keep a ``LISTEN``), opened on the first
wait and kept while the provider lives. Each notification wakes that key's waiters
through the toolkit's :class:`~leasekit.backend.ReleaseHub`. When the connection
drops, every waiter is woken (it may have missed a notification) and the next wait
listens again on a new connection.

Behind a transaction-mode pgbouncer ``LISTEN`` does not work (the server session
changes under the client): turn notifications off there (``notifications=false``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from leasekit.backend import ReleaseHub, ReleaseWatch, stop_task

from ._sql import GRANT_PREFIX, channel_for

__all__ = ["PostgresReleaseListener", "channel_for", "decode_payload"]

_log = logging.getLogger("leasekit.postgres")


def decode_payload(payload: str) -> tuple[str, bool] | None:
    """The lease key a notification names and whether it is a grant hint, or ``None``
    if the payload is not one of ours.

    A release hint is the key in hex; a grant hint is :data:`GRANT_PREFIX` and then the
    same (the acquire statement sends it when the key changed hands).
    """
    granted = payload.startswith(GRANT_PREFIX)
    try:
        key = bytes.fromhex(payload[1:] if granted else payload).decode("utf-8")
    except ValueError:  # UnicodeDecodeError is a ValueError
        return None
    return key, granted


class PostgresReleaseListener:
    """One ``LISTEN`` connection, fanning release notifications out to waiters."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Any]],
        channel: str,
        *,
        timeout_s: float,
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._timeout_s = timeout_s
        self.hub = ReleaseHub()
        self._conn: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock | None = None
        self._closed = False

    async def watch(self, key: str, *, grants: bool = False) -> ReleaseWatch:
        """Watch ``key`` (with ``grants``, for grant hints too); returns once the
        connection is listening."""
        watch = self.hub.watch(key, grants=grants)
        try:
            await asyncio.wait_for(self._listen(), self._timeout_s)
        except BaseException:
            watch.close()
            raise
        return watch

    async def _listen(self) -> None:
        if self._reader is not None and not self._reader.done():
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._reader is not None and not self._reader.done():
                return
            conn = await self._connect()
            try:
                # The channel is an identifier built from the validated table name.
                await conn.execute(f'LISTEN "{self._channel}"')
            except BaseException:
                await conn.close()
                raise
            self._conn = conn
            self._reader = asyncio.get_running_loop().create_task(self._read(conn))

    async def _read(self, conn: Any) -> None:
        try:
            async for notify in conn.notifies():
                hint = decode_payload(notify.payload)
                if hint is not None:
                    self.hub.notify(hint[0], granted=hint[1])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (the channel is lost: wake everyone, start over)
            _log.debug(
                "release notifications lost (%s: %s); waiters fall back", type(exc).__name__, exc
            )
        finally:
            if self._conn is conn:
                self._conn = None
            self.hub.notify_all()
            with contextlib.suppress(Exception):
                await conn.close()

    async def break_connection(self) -> None:
        """Cut the listening connection, as a network failure would (for tests)."""
        conn = self._conn
        if conn is not None:
            conn.pgconn.finish()  # the socket goes; the reader sees the connection fail

    async def aclose(self) -> None:
        """Stop listening and close the connection; waiters are woken."""
        self._closed = True
        reader, self._reader = self._reader, None
        await stop_task(reader, self._timeout_s)
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), self._timeout_s)
        self.hub.notify_all()
