"""Every Redis operation, without I/O: the command it sends and how it reads the reply.

One module, over 500 lines: every operation's commands and replies, written once for
both drivers and for single node, Sentinel and Cluster.

An operation is a :data:`leasekit.backend.Operation`: a generator that yields one
request (a :class:`ScriptCall` of a script in ``_lua``, or a plain command such as
``GET``), is sent the reply and returns the contract's value. Its factory validates
the arguments first (the core helpers, before any I/O), so neither provider repeats
the validation. The async provider drives an operation with
:func:`~leasekit.backend.drive_async` over ``_aio``, the blocking one with
:func:`~leasekit.backend.drive` over ``_blocking``: the scripts, their arguments and
the reading of replies exist here once. Data that no leasekit script wrote raises
:class:`~leasekit.LeaseBackendError` naming the prefix.

With ``min_replicas`` (:func:`context`), a script that grants, renews or transfers is
sent as an :class:`Acknowledged` request: the script and ``WAIT min_replicas
replica_timeout_ms`` pipelined behind it, still one round trip. If the script wrote and
fewer replicas acknowledged, the operation raises :class:`~leasekit.LeaseBackendTimeout`:
the write happened on the primary but may not survive its failover, so its outcome is
unknown, exactly as for a reply that never came.

Every operation is one round trip. A generator per operation (and its driver) costs
about 2 % of the 1-task acquire + release cycle's client instructions (cachegrind:
674k against 662k with the request builders and reply readers called directly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, TypeAlias

from leasekit import (
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseResult,
    validate_key,
    validate_metadata,
    validate_owner,
    validate_ttl_ms,
)
from leasekit.backend import LeaseRecord, Operation, RenewItem

from . import _keys, _lua, _options

__all__ = [
    "Acknowledged",
    "Command",
    "GarbledReply",
    "OpContext",
    "Pipelined",
    "Request",
    "ScriptCall",
    "acquire",
    "acquire_in_turn",
    "context",
    "inspect_batch",
    "owner",
    "read_lease_value",
    "record",
    "release",
    "release_grant",
    "remaining",
    "renew",
    "renew_many",
    "transfer",
]

Arg = bytes | int
Command: TypeAlias = tuple[Arg | str, ...]
"""A plain command, as redis-py's ``execute_command`` takes it: ``("GET", name)``."""


class GarbledReply(ValueError):
    """A reply (or a stored value) that no leasekit script produces."""


class ScriptCall(NamedTuple):
    """One script run: which script, its ``KEYS`` and its ``ARGV``.

    A named tuple rather than a frozen dataclass: one is built per operation, and a
    frozen dataclass takes several times longer to build. The transport sends
    :meth:`evalsha`, and :meth:`eval` when the server answers ``NOSCRIPT``.
    """

    script: _lua.Script
    keys: tuple[bytes, ...]
    args: tuple[Arg, ...]

    def evalsha(self) -> Command:
        """The ``EVALSHA`` command, what is sent first."""
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)

    def eval(self) -> Command:
        """The ``EVAL`` command, sent when the server answered ``NOSCRIPT``."""
        return ("EVAL", self.script.source, len(self.keys), *self.keys, *self.args)


class Pipelined(NamedTuple):
    """Commands sent together, non-transactionally; the reply is their replies in order.

    An error reply stands in its command's place (it is not raised).
    """

    commands: tuple[Command, ...]


class Acknowledged(NamedTuple):
    """A script and the ``WAIT`` behind it, pipelined on one connection: one round trip.

    The reply is ``(script's reply, replicas that acknowledged)``; an error reply of
    the script is raised, as for a :class:`ScriptCall` alone. ``WAIT`` counts the
    replicas that have every write this connection made so far, the script's included.
    """

    call: ScriptCall
    wait: Command


Request: TypeAlias = ScriptCall | Command | Pipelined | Acknowledged
"""What an operation yields for the transport to send."""


class OpContext(NamedTuple):
    """What a provider's operations share: its prefix, counter TTL and publish command.

    ``publish`` is the command the scripts tell waiters with (``PUBLISH``,
    ``SPUBLISH``, or ``b""`` for none), and ``acquire`` the acquire script that
    publishes with it. ``wait`` is the ``WAIT`` sent behind every grant, renewal and
    transfer, or ``None`` without ``min_replicas``.
    """

    prefix: str
    raw_prefix: bytes
    counter_ttl_ms: int | None
    publish: bytes
    acquire: _lua.Script = _lua.ACQUIRE
    wait: Command | None = None
    min_replicas: int = 0
    replica_timeout_ms: int = 0


def context(
    prefix: str,
    counter_ttl_ms: int | None,
    publish: bytes,
    min_replicas: int = 0,
    replica_timeout_ms: int = 0,
) -> OpContext:
    """The :class:`OpContext` of a provider with these (already checked) settings."""
    wait: Command | None = ("WAIT", min_replicas, replica_timeout_ms) if min_replicas else None
    return OpContext(
        prefix,
        prefix.encode(),
        counter_ttl_ms,
        publish,
        _lua.ACQUIRES[publish],
        wait,
        min_replicas,
        replica_timeout_ms,
    )


def _writing(ctx: OpContext, call: ScriptCall) -> ScriptCall | Acknowledged:
    """``call`` alone, or with the ``WAIT`` behind it when replicas must acknowledge."""
    return call if ctx.wait is None else Acknowledged(call, ctx.wait)


def _unpack(ctx: OpContext, reply: Any) -> tuple[Any, Any]:
    """The script's reply and the acknowledgements (``None`` without ``min_replicas``)."""
    if ctx.wait is None:
        return reply, None
    script_reply, acks = reply
    return script_reply, acks


def _check_acks(ctx: OpContext, key: str | None, acks: Any) -> None:
    """Raise the unknown outcome of a write that too few replicas acknowledged."""
    if ctx.wait is None:
        return
    wanted, timeout_ms = ctx.min_replicas, ctx.replica_timeout_ms
    if isinstance(acks, int) and not isinstance(acks, bool) and acks >= wanted:
        return
    counted = acks if isinstance(acks, int) else f"an error ({acks!r:.80})"
    raise LeaseBackendTimeout(
        f"the write was acknowledged by {counted} replica(s) within {timeout_ms} ms, "
        f"min_replicas={wanted}: it took effect on the primary, but a failover may lose "
        f"it, so its outcome is unknown",
        backend=_options.BACKEND,
        key=key,
    )


def _garbled(ctx: OpContext, key: str | None, exc: GarbledReply) -> LeaseBackendError:
    return _options.garbled(exc, prefix=ctx.prefix, key=key)


def _counter_px(ttl_ms: int, counter_ttl_ms: int | None) -> int:
    # The counter outlives the lease's current TTL by counter_ttl_ms; 0 means forever.
    return 0 if counter_ttl_ms is None else ttl_ms + counter_ttl_ms


def _names(prefix: bytes, key: str) -> tuple[bytes, bytes]:
    lease = _keys.lease_name(prefix, key)
    return lease, _keys.counter_name(lease)


def _raw(value: bytes | str) -> bytes:
    # A caller's client may decode replies (decode_responses=True).
    return value.encode() if isinstance(value, str) else value


# -- the contract -----------------------------------------------------------------------


def _owned_for(
    ctx: OpContext, script: _lua.Script, key: str, owner: str, ttl_ms: int
) -> ScriptCall:
    """``script`` on ``key`` for ``owner`` and ``ttl_ms`` (ACQUIRE, RENEW), arguments checked."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    return ScriptCall(
        script,
        _names(ctx.raw_prefix, key),
        (owner.encode(), ttl_ms, _counter_px(ttl_ms, ctx.counter_ttl_ms)),
    )


def acquire(
    ctx: OpContext, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
) -> Operation[Request, LeaseResult]:
    """``ACQUIRE``: the token (an int) when granted, else the holder (text), with its
    metadata (``[holder, metadata]``) when it stored some.

    ``metadata`` is stored with the grant (the holder's re-acquire replaces its own);
    without it the script is sent one argument shorter and stores none.
    """
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    names = _names(ctx.raw_prefix, key)
    counter_px = _counter_px(ttl_ms, ctx.counter_ttl_ms)
    if metadata is None:
        call = ScriptCall(ctx.acquire, names, (owner.encode(), ttl_ms, counter_px))
        return _acquire(ctx, call if ctx.wait is None else _writing(ctx, call), key, owner, None)
    data = _metadata(metadata)
    call = ScriptCall(ctx.acquire, names, (owner.encode(), ttl_ms, counter_px, data))
    return _acquire(ctx, _writing(ctx, call), key, owner, data)


LINE_SUFFIX = b":line"
PLACES_SUFFIX = b":places"


def acquire_in_turn(
    ctx: OpContext,
    key: str,
    owner: str,
    ttl_ms: int,
    *,
    place_ttl_ms: int,
    metadata: bytes | str | None = None,
) -> Operation[Request, LeaseResult]:
    """``ACQUIRE_IN_TURN``: ``acquire`` through the key's line of waiters (its replies,
    and an empty array when the key is free but another waiter goes first)."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    validate_ttl_ms(place_ttl_ms, "place_ttl_ms")
    lease = _keys.lease_name(ctx.raw_prefix, key)
    names = (lease, _keys.counter_name(lease), lease + LINE_SUFFIX, lease + PLACES_SUFFIX)
    counter_px = _counter_px(ttl_ms, ctx.counter_ttl_ms)
    args: tuple[Arg, ...] = (owner.encode(), ttl_ms, counter_px, ctx.publish, place_ttl_ms)
    data = None if metadata is None else _metadata(metadata)
    if data is not None:
        args += (data,)
    call = ScriptCall(_lua.ACQUIRE_IN_TURN, names, args)
    return _acquire_in_turn(ctx, _writing(ctx, call), key, owner, data)


def _acquire_in_turn(
    ctx: OpContext,
    request: ScriptCall | Acknowledged,
    key: str,
    owner: str,
    metadata: bytes | None,
) -> Operation[Request, LeaseResult]:
    reply, acks = _unpack(ctx, (yield request))
    if isinstance(reply, int) and not isinstance(reply, bool):
        _check_acks(ctx, key, acks)
        return LeaseResult(True, owner, reply, metadata)
    try:
        if reply == []:
            return LeaseResult(False, None, None)  # free, but not the caller's turn
        if isinstance(reply, list) and len(reply) == 2:
            holder, held_with = reply
            if isinstance(holder, bytes | str) and isinstance(held_with, bytes | str):
                return LeaseResult(False, _text(holder), None, _raw(held_with))
        if not isinstance(reply, bytes | str):
            raise GarbledReply(f"unexpected reply {reply!r:.80}")
        return LeaseResult(False, _text(reply), None)
    except GarbledReply as exc:
        raise _garbled(ctx, key, exc) from exc


def _metadata(metadata: bytes | str) -> bytes:
    """Checked metadata, as the bytes stored (refused before any I/O)."""
    data = validate_metadata(metadata)
    assert data is not None  # only None is checked into None
    return data


def _acquire(
    ctx: OpContext,
    request: ScriptCall | Acknowledged,
    key: str,
    owner: str,
    metadata: bytes | None,
) -> Operation[Request, LeaseResult]:
    reply = yield request
    if ctx.wait is not None:  # inline, not _unpack: every acquire's path
        reply, acks = reply
        if isinstance(reply, int) and not isinstance(reply, bool):
            _check_acks(ctx, key, acks)
    if isinstance(reply, int) and not isinstance(reply, bool):
        return LeaseResult(True, owner, reply, metadata)
    try:
        if isinstance(reply, list) and len(reply) == 2:
            holder, held_with = reply
            if isinstance(holder, bytes | str) and isinstance(held_with, bytes | str):
                return LeaseResult(False, _text(holder), None, _raw(held_with))
        if not isinstance(reply, bytes | str):
            raise GarbledReply(f"unexpected reply {reply!r:.80}")
        return LeaseResult(False, _text(reply), None)
    except GarbledReply as exc:
        raise _garbled(ctx, key, exc) from exc


def _text(reply: bytes | str) -> str:
    """An owner as a script returned it (text already, from a decoding client)."""
    if isinstance(reply, str):
        return reply
    try:
        return reply.decode()
    except UnicodeDecodeError:
        raise GarbledReply(f"unexpected reply {reply!r:.80}") from None


def owner(ctx: OpContext, key: str) -> Operation[Request, str | None]:
    """``GET`` of the lease: its holder, or ``None`` when the key is free."""
    validate_key(key)
    return _owner(ctx, ("GET", _keys.lease_name(ctx.raw_prefix, key)), key)


def _owner(ctx: OpContext, command: Command, key: str) -> Operation[Request, str | None]:
    reply = yield command
    if reply is None:
        return None
    try:
        if not isinstance(reply, bytes | str):
            raise GarbledReply(f"unexpected reply {reply!r:.80}")
        return read_lease_value(reply)[0]
    except GarbledReply as exc:
        raise _garbled(ctx, key, exc) from exc


def record(ctx: OpContext, key: str) -> Operation[Request, LeaseRecord | None]:
    """``RECORD``: the live lease's owner, token, metadata and ``PTTL`` in one step."""
    validate_key(key)
    call = ScriptCall(_lua.RECORD, (_keys.lease_name(ctx.raw_prefix, key),), ())
    return _record(ctx, call, key)


def _record(ctx: OpContext, call: ScriptCall, key: str) -> Operation[Request, LeaseRecord | None]:
    reply = yield call
    if reply is None:
        return None
    try:
        if not isinstance(reply, list) or len(reply) != 2:
            raise GarbledReply(f"unexpected reply {reply!r:.80}")
        value, left = reply
        if not isinstance(value, bytes | str) or not isinstance(left, int) or left == -1:
            # -1: a key without a TTL, which no leasekit script writes.
            raise GarbledReply(f"unexpected reply {reply!r:.80}")
        holder, token, metadata = read_lease_value(value)
    except GarbledReply as exc:
        raise _garbled(ctx, key, exc) from exc
    return LeaseRecord(key, holder, token, max(1, left), metadata)


def release(ctx: OpContext, key: str, owner: str) -> Operation[Request, bool]:
    """``RELEASE`` of ``owner``'s lease on ``key``: True when it took effect."""
    validate_key(key)
    validate_owner(owner)
    call = ScriptCall(
        _lua.RELEASE, (_keys.lease_name(ctx.raw_prefix, key),), (owner.encode(), ctx.publish)
    )
    return _flag(ctx, call, key)  # releases are not acknowledged (docs/backends/redis.md)


def release_grant(ctx: OpContext, key: str, owner: str, token: int) -> Operation[Request, None]:
    """``RELEASE_GRANT``: ``owner``'s lease on ``key`` if its token is ``token``."""
    validate_key(key)
    validate_owner(owner)
    lease = _keys.lease_name(ctx.raw_prefix, key)
    call = ScriptCall(_lua.RELEASE_GRANT, (lease,), (owner.encode(), b"%d" % token, ctx.publish))
    return _ignore(call)


def _ignore(request: Request) -> Operation[Request, None]:
    yield request


def renew(ctx: OpContext, key: str, owner: str, ttl_ms: int) -> Operation[Request, bool]:
    """``RENEW`` of ``owner``'s lease on ``key``: True when it took effect."""
    return _flag(ctx, _writing(ctx, _owned_for(ctx, _lua.RENEW, key, owner, ttl_ms)), key)


def transfer(
    ctx: OpContext,
    key: str,
    from_owner: str,
    to_owner: str,
    ttl_ms: int,
    *,
    metadata: bytes | str | None = None,
) -> Operation[Request, bool]:
    """``TRANSFER`` of ``key`` from one owner to another: True when it took effect.

    ``metadata`` replaces the holder's, for the new owner (``None``: none).
    """
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    args: tuple[Arg, ...] = (
        from_owner.encode(),
        to_owner.encode(),
        ttl_ms,
        _counter_px(ttl_ms, ctx.counter_ttl_ms),
        ctx.publish,
    )
    if metadata is not None:
        args += (_metadata(metadata),)
    call = ScriptCall(_lua.TRANSFER, _names(ctx.raw_prefix, key), args)
    return _flag(ctx, _writing(ctx, call), key)


def _flag(ctx: OpContext, request: Request, key: str) -> Operation[Request, bool]:
    # RELEASE, RENEW and TRANSFER answer 1 when they took effect, else 0; an
    # acknowledged one also the replicas' count, which a write must reach.
    reply = yield request
    if not isinstance(request, Acknowledged):
        return bool(reply == 1)
    reply, acks = reply
    if reply == 1:
        _check_acks(ctx, key, acks)
        return True
    return False


# -- beyond the contract ----------------------------------------------------------------


def renew_many(ctx: OpContext, items: Sequence[RenewItem]) -> Operation[Request, list[bool]]:
    """``RENEW_MANY`` of checked ``(key, owner, ttl_ms)`` items: one flag per item.

    On a cluster, only for items whose keys share one slot.
    """
    keys = tuple(_keys.lease_name(ctx.raw_prefix, key) for key, _, _ in items)
    args: list[Arg] = [-1 if ctx.counter_ttl_ms is None else ctx.counter_ttl_ms]
    for _, owner, ttl_ms in items:
        args += (owner.encode(), ttl_ms)
    call = ScriptCall(_lua.RENEW_MANY, keys, tuple(args))
    return _flags(ctx, _writing(ctx, call), items[0][0], len(items))


def _flags(
    ctx: OpContext, request: ScriptCall | Acknowledged, key: str, count: int
) -> Operation[Request, list[bool]]:
    # RENEW_MANY answers one "1" or "0" character per item.
    reply, acks = _unpack(ctx, (yield request))
    if isinstance(reply, str):
        reply = reply.encode()  # a caller's client with decode_responses=True
    if not isinstance(reply, bytes) or len(reply) != count or reply.strip(b"01"):
        exc = GarbledReply(f"expected {count} flags, got {reply!r:.80}")
        raise _garbled(ctx, key, exc) from exc
    if b"1" in reply:
        _check_acks(ctx, key, acks)
    return [flag == 0x31 for flag in reply]


def remaining(ctx: OpContext, key: str) -> Operation[Request, int | None]:
    """``PTTL`` of the lease: milliseconds left, ``None`` when the key is free."""
    validate_key(key)
    return _remaining(("PTTL", _keys.lease_name(ctx.raw_prefix, key)))


def _remaining(command: Command) -> Operation[Request, int | None]:
    reply = yield command
    if not isinstance(reply, int) or reply == -2:
        return None
    # A key without a TTL (-1) is not a lease leasekit wrote: look again in a second.
    return 1000 if reply == -1 else max(1, reply)


def inspect_batch(names: Sequence[tuple[str, bytes]]) -> Operation[Pipelined, list[LeaseRecord]]:
    """The live leases among ``(key, lease name)`` pairs: ``GET`` and ``PTTL`` of each.

    What is not a lease value (another program's key, one gone since it was listed)
    is left out: inspect reports, it does not judge.
    """
    commands: list[Command] = []
    for _, name in names:
        commands += (("GET", name), ("PTTL", name))
    replies: list[Any] = yield Pipelined(tuple(commands))
    records: list[LeaseRecord] = []
    for (key, _), value, left in zip(names, replies[::2], replies[1::2], strict=True):
        if not isinstance(value, bytes | str) or not isinstance(left, int) or left <= 0:
            continue  # not a lease value, or expired or released since it was listed
        try:
            holder, token, metadata = read_lease_value(value)
        except GarbledReply:
            continue
        records.append(LeaseRecord(key, holder, token, left, metadata))
    return records


def read_lease_value(value: bytes | str) -> tuple[str, int, bytes | None]:
    """Split a stored lease value into ``(owner, token, metadata)``.

    ``b"<token> <owner>"`` (no metadata: ``None``) or ``b"<token>:<n> <owner><metadata>"``,
    the metadata being the last ``n`` bytes (see ``_lua``).
    """
    raw = _raw(value)
    head, sep, rest = raw.partition(b" ")
    token, colon, size = head.partition(b":")
    metadata: bytes | None = None
    if colon:
        if not size.isdigit() or int(size) >= len(rest):
            raise GarbledReply(f"not a lease value: {value!r:.80}")
        cut = len(rest) - int(size)
        rest, metadata = rest[:cut], rest[cut:]
    if not sep or not rest or not token.isdigit():
        raise GarbledReply(f"not a lease value: {value!r:.80}")
    try:
        return rest.decode(), int(token), metadata
    except UnicodeDecodeError:
        raise GarbledReply(f"not a lease value: {value!r:.80}") from None
