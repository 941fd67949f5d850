"""Release and grant notifications over Redis pub/sub: one subscriber connection per provider.

The release and transfer scripts publish on ``<lease name>:released`` (the lease's own
hash tag, so on Redis Cluster the sharded ``SPUBLISH`` stays in the lease's slot and
reaches only that shard's subscribers) with an empty payload: every waiter of the key
looks again. The acquire script publishes ``granted`` on the same channel when it takes
a free key (never on the holder's re-acquire): that hint wakes only the watchers that
asked for grants (``watch_owner``, ``leaders``), not the acquirers, who would only be
denied again. A listener from before grant hints existed takes one for a release hint:
a needless look, nothing worse. A provider that has waiters subscribes to the
channels of the keys they wait for, on one pub/sub connection shared by all of them
(:class:`RedisReleaseListener`); each message wakes that key's waiters through the
toolkit's :class:`~leasekit.backend.ReleaseHub`. Expiry sends nothing: waiters also
sleep only until the holder's remaining TTL (``PTTL``).

A subscription is confirmed by the server before ``watch`` returns, so a release
published after it is never missed. When the subscriber connection drops, every waiter
is woken (it may have missed a message): when redis-py reconnects and subscribes
again by itself, the repeated subscription confirmation says so; when it gives up, the
listener starts over on the next watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from leasekit.backend import ReleaseHub, ReleaseWatch, stop_task

__all__ = ["CHANNEL_SUFFIX", "GRANTED", "RedisReleaseListener", "channel_name"]

CHANNEL_SUFFIX = b":released"
GRANTED = b"granted"
"""The payload of a grant hint (the acquire script's)."""

_log = logging.getLogger("leasekit.redis")


def channel_name(lease: bytes) -> bytes:
    """The pub/sub channel the scripts publish on when the lease ``lease`` may be free."""
    return lease + CHANNEL_SUFFIX


class RedisReleaseListener:
    """One pub/sub connection, subscribed to the channels of the keys being waited for."""

    def __init__(self, client: Any, *, sharded: bool, timeout_s: float) -> None:
        self._client = client
        self._sharded = sharded
        self._timeout_s = timeout_s
        self.hub = ReleaseHub(on_last=self._drop)
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._channels: dict[bytes, str] = {}  # channel -> key, for the subscribed ones
        self._confirmed: dict[bytes, asyncio.Future[None]] = {}
        self._closed = False

    async def watch(self, key: str, lease: bytes, *, grants: bool = False) -> ReleaseWatch:
        """Watch ``key`` (whose lease name is ``lease``); returns once subscribed.

        ``grants``: grant hints wake the watch too (an owner watcher's).

        The first waiter of a key subscribes; the others who arrive before the server
        confirms it wait for the same confirmation (one ``SUBSCRIBE`` per channel: the
        channel and its confirmation are registered before anything is awaited).
        """
        watch = self.hub.watch(key, grants=grants)
        channel = channel_name(lease)
        try:
            pending = self._confirmed.get(channel)
            if channel not in self._channels:
                self._channels[channel] = key
                pending = asyncio.get_running_loop().create_future()
                self._confirmed[channel] = pending
                await asyncio.wait_for(self._subscribe(channel, pending), self._timeout_s)
            elif pending is not None:
                await asyncio.wait_for(asyncio.shield(pending), self._timeout_s)
        except BaseException:
            watch.close()
            raise
        return watch

    async def _subscribe(self, channel: bytes, confirmed: asyncio.Future[None]) -> None:
        try:
            if self._pubsub is None:
                self._pubsub = self._client.pubsub()
            if self._sharded:
                await self._pubsub.ssubscribe(channel)
            else:
                await self._pubsub.subscribe(channel)
            if self._reader is None or self._reader.done():
                self._reader = asyncio.get_running_loop().create_task(self._read())
            await asyncio.shield(confirmed)
        except BaseException:
            # Not subscribed: the next waiter starts over, and those sharing this
            # confirmation are told now rather than at their timeout.
            if self._confirmed.get(channel) is confirmed:
                del self._confirmed[channel]
                self._channels.pop(channel, None)
            if not confirmed.done():
                confirmed.set_exception(ConnectionError("subscribing to releases failed"))
                confirmed.add_done_callback(_ignore_outcome)
            raise

    def _resubscribe(self, channel: bytes) -> None:
        """An unsubscription crossed a newer subscription: subscribe the channel again."""
        pubsub = self._pubsub
        if pubsub is None or self._closed:
            return
        subscribe = pubsub.ssubscribe if self._sharded else pubsub.subscribe
        task = asyncio.get_running_loop().create_task(subscribe(channel))
        task.add_done_callback(_ignore_outcome)

    def _drop(self, key: str) -> None:
        """The last waiter of ``key`` left: unsubscribe its channel (in the background)."""
        for channel, known in list(self._channels.items()):
            if known == key:
                del self._channels[channel]
                self._confirmed.pop(channel, None)
                if self._pubsub is not None and not self._closed:
                    unsubscribe = (
                        self._pubsub.sunsubscribe if self._sharded else self._pubsub.unsubscribe
                    )
                    task = asyncio.get_running_loop().create_task(unsubscribe(channel))
                    task.add_done_callback(_ignore_outcome)

    async def _read(self) -> None:
        pubsub = self._pubsub
        try:
            while not self._closed:
                if self._sharded:
                    if not self._channels:
                        # Nothing subscribed: redis-py's cluster pub/sub drops its node
                        # connections, and its read then returns at once, so this loop
                        # would spin without ever yielding. The next watch starts a reader.
                        return
                    # redis-py's cluster pub/sub reads each node in turn: wait a little
                    # on each rather than forever on one.
                    message = await pubsub.get_sharded_message(timeout=0.5)
                else:
                    message = await pubsub.get_message(timeout=None)
                if message is None:
                    continue
                self._handle(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (the channel is lost: wake everyone, start over)
            _log.debug(
                "release notifications lost (%s: %s); waiters fall back", type(exc).__name__, exc
            )
            self._lost()

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        named = message.get("channel")
        channel: bytes = named.encode() if isinstance(named, str) else bytes(named or b"")
        if kind in ("subscribe", "ssubscribe"):
            confirmed = self._confirmed.pop(channel, None)
            if confirmed is not None and not confirmed.done():
                confirmed.set_result(None)
            elif channel in self._channels:
                # redis-py reconnected and subscribed again: messages published
                # in between were lost, so this key's waiters look again.
                self.hub.notify(self._channels[channel])
        elif kind in ("unsubscribe", "sunsubscribe"):
            key = self._channels.get(channel)
            if key is not None:
                # The last waiter left and a new one came before this reply: the
                # server no longer sends what the new one waits for.
                self._resubscribe(channel)
                self.hub.notify(key)
        elif kind in ("message", "smessage"):
            key = self._channels.get(channel)
            if key is not None:
                # A grant of the free key wakes owner watchers only; anything else
                # (release, transfer: an empty payload) wakes every waiter.
                data = message.get("data")
                if isinstance(data, str):
                    data = data.encode()  # a caller's client with decode_responses=True
                self.hub.notify(key, granted=data == GRANTED)

    def _lost(self) -> None:
        """The subscriber connection failed: forget it; every waiter looks again."""
        pubsub, self._pubsub = self._pubsub, None
        self._channels.clear()
        for confirmed in self._confirmed.values():
            if not confirmed.done():
                confirmed.set_exception(ConnectionError("the pub/sub connection was lost"))
                confirmed.add_done_callback(_ignore_outcome)
        self._confirmed.clear()
        self.hub.notify_all()
        if pubsub is not None:
            task = asyncio.get_running_loop().create_task(pubsub.aclose())
            task.add_done_callback(_ignore_outcome)

    async def break_connection(self) -> None:
        """Cut the subscriber connection, as a network failure would (for tests)."""
        pubsub = self._pubsub
        if pubsub is None:
            return
        # A cluster's pub/sub reads one connection per node (redis-py's ClusterPubSub).
        pubsubs = [pubsub, *getattr(pubsub, "node_pubsub_mapping", {}).values()]
        for each in pubsubs:
            if each.connection is not None:
                await each.connection.disconnect()

    async def aclose(self) -> None:
        """Stop listening; waiters are woken and fall back to the holder's TTL."""
        self._closed = True
        reader, self._reader = self._reader, None
        await stop_task(reader, self._timeout_s)
        self.hub.notify_all()
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pubsub.aclose(), self._timeout_s)


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
