"""Each operation as data, without I/O: the command to send and how to read its reply.

A request builder turns validated arguments into the Redis command (a
:class:`ScriptCall` for the scripts in ``_lua``, a plain ``GET`` for the owner
lookup); a reply reader turns what Redis answered into the contract's value, or
raises :class:`GarbledReply` for data no leasekit script wrote. Nothing here knows a
connection, so the same operation can be driven by redis-py's asyncio client, its
blocking one, or a pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from leasekit import LeaseResult

from . import _keys, _lua

__all__ = [
    "GarbledReply",
    "ScriptCall",
    "acquire_request",
    "owner_request",
    "read_acquire",
    "read_flag",
    "read_flags",
    "read_lease_value",
    "read_owner",
    "release_grant_request",
    "release_request",
    "renew_many_request",
    "renew_request",
    "transfer_request",
]

Arg = bytes | int


class GarbledReply(ValueError):
    """A reply (or a stored value) that no leasekit script produces."""


class ScriptCall(NamedTuple):
    """One script run: which script, its ``KEYS`` and its ``ARGV``.

    A named tuple rather than a frozen dataclass: one is built per operation, and a
    frozen dataclass takes several times longer to build.
    """

    script: _lua.Script
    keys: tuple[bytes, ...]
    args: tuple[Arg, ...]

    def evalsha(self) -> tuple[Arg | str, ...]:
        """The ``EVALSHA`` command, what is sent first."""
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)

    def eval(self) -> tuple[Arg | str, ...]:
        """The ``EVAL`` command, sent when the server answered ``NOSCRIPT``."""
        return ("EVAL", self.script.source, len(self.keys), *self.keys, *self.args)


def _counter_px(ttl_ms: int, counter_ttl_ms: int | None) -> int:
    # The counter outlives the lease's current TTL by counter_ttl_ms; 0 means forever.
    return 0 if counter_ttl_ms is None else ttl_ms + counter_ttl_ms


def _names(prefix: bytes, key: str) -> tuple[bytes, bytes]:
    lease = _keys.lease_name(prefix, key)
    return lease, _keys.counter_name(lease)


def acquire_request(
    prefix: bytes, key: str, owner: str, ttl_ms: int, *, counter_ttl_ms: int | None
) -> ScriptCall:
    """``ACQUIRE`` for ``owner`` on ``key``; read the reply with :func:`read_acquire`."""
    return ScriptCall(
        _lua.ACQUIRE,
        _names(prefix, key),
        (owner.encode(), ttl_ms, _counter_px(ttl_ms, counter_ttl_ms)),
    )


def release_request(prefix: bytes, key: str, owner: str, *, publish: bytes = b"") -> ScriptCall:
    """``RELEASE`` of ``owner``'s lease on ``key``; the reply carries nothing to read.

    ``publish`` is the command that tells waiters (``PUBLISH``, ``SPUBLISH``, or none).
    """
    return ScriptCall(_lua.RELEASE, (_keys.lease_name(prefix, key),), (owner.encode(), publish))


def release_grant_request(
    prefix: bytes, key: str, owner: str, token: int, *, publish: bytes = b""
) -> ScriptCall:
    """``RELEASE_GRANT``: ``owner``'s lease on ``key`` if its token is ``token``."""
    lease = _keys.lease_name(prefix, key)
    return ScriptCall(_lua.RELEASE_GRANT, (lease,), (owner.encode(), b"%d" % token, publish))


def renew_request(
    prefix: bytes, key: str, owner: str, ttl_ms: int, *, counter_ttl_ms: int | None
) -> ScriptCall:
    """``RENEW`` of ``owner``'s lease on ``key``; read the reply with :func:`read_flag`."""
    return ScriptCall(
        _lua.RENEW,
        _names(prefix, key),
        (owner.encode(), ttl_ms, _counter_px(ttl_ms, counter_ttl_ms)),
    )


def transfer_request(
    prefix: bytes,
    key: str,
    from_owner: str,
    to_owner: str,
    ttl_ms: int,
    *,
    counter_ttl_ms: int | None,
    publish: bytes = b"",
) -> ScriptCall:
    """``TRANSFER`` of ``key`` from one owner to another; read it with :func:`read_flag`."""
    return ScriptCall(
        _lua.TRANSFER,
        _names(prefix, key),
        (
            from_owner.encode(),
            to_owner.encode(),
            ttl_ms,
            _counter_px(ttl_ms, counter_ttl_ms),
            publish,
        ),
    )


def remaining_request(prefix: bytes, key: str) -> tuple[str, bytes]:
    """The ``PTTL`` of the lease on ``key``; read the reply with :func:`read_remaining`."""
    return ("PTTL", _keys.lease_name(prefix, key))


def read_remaining(reply: object) -> int | None:
    """``PTTL``'s reply: milliseconds left, ``None`` when the key is free (-2).

    A key without a TTL (-1) is not a lease leasekit wrote: look again in a second.
    """
    if not isinstance(reply, int) or reply == -2:
        return None
    return 1000 if reply == -1 else max(1, reply)


def owner_request(prefix: bytes, key: str) -> tuple[str, bytes]:
    """The ``GET`` of the lease on ``key``; read the reply with :func:`read_owner`."""
    return ("GET", _keys.lease_name(prefix, key))


def _raw(value: bytes | str) -> bytes:
    # A caller's client may decode replies (decode_responses=True).
    return value.encode() if isinstance(value, str) else value


def read_acquire(reply: object, owner: str) -> LeaseResult:
    """The script answers with the token (an int) when granted, else the holder (text)."""
    if isinstance(reply, int) and not isinstance(reply, bool):
        return LeaseResult(True, owner, reply)
    if not isinstance(reply, bytes | str):
        raise GarbledReply(f"unexpected reply {reply!r:.80}")
    try:
        return LeaseResult(False, _raw(reply).decode(), None)
    except UnicodeDecodeError:
        raise GarbledReply(f"unexpected reply {reply!r:.80}") from None


def read_flag(reply: object) -> bool:
    """RENEW and TRANSFER answer 1 when they took effect, else 0."""
    return bool(reply == 1)


def read_lease_value(value: bytes | str) -> tuple[str, int]:
    """Split a stored lease value ``b"<token> <owner>"`` into ``(owner, token)``."""
    token, sep, owner = _raw(value).partition(b" ")
    if not sep or not owner or not token.isdigit():
        raise GarbledReply(f"not a lease value: {value!r:.80}")
    try:
        return owner.decode(), int(token)
    except UnicodeDecodeError:
        raise GarbledReply(f"not a lease value: {value!r:.80}") from None


def read_owner(reply: object) -> str | None:
    """The holder from a ``GET`` of the lease, or ``None`` when the key is free."""
    if reply is None:
        return None
    if not isinstance(reply, bytes | str):
        raise GarbledReply(f"unexpected reply {reply!r:.80}")
    return read_lease_value(reply)[0]


def renew_many_request(
    prefix: bytes, items: Sequence[tuple[str, str, int]], *, counter_ttl_ms: int | None
) -> ScriptCall:
    """``RENEW_MANY`` of checked ``(key, owner, ttl_ms)`` items; read it with :func:`read_flags`.

    On a cluster, only for items whose keys share one slot.
    """
    keys = tuple(_keys.lease_name(prefix, key) for key, _, _ in items)
    args: list[Arg] = [-1 if counter_ttl_ms is None else counter_ttl_ms]
    for _, owner, ttl_ms in items:
        args += (owner.encode(), ttl_ms)
    return ScriptCall(_lua.RENEW_MANY, keys, tuple(args))


def read_flags(reply: object, count: int) -> list[bool]:
    """RENEW_MANY answers one ``1`` or ``0`` character per item."""
    if isinstance(reply, str):
        reply = reply.encode()  # a caller's client with decode_responses=True
    if not isinstance(reply, bytes) or len(reply) != count or reply.strip(b"01"):
        raise GarbledReply(f"expected {count} flags, got {reply!r:.80}")
    return [flag == 0x31 for flag in reply]
