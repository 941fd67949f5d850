"""etcd key names for lease records: one key per holder, binary-safe and reversible.

A live lease on key ``k`` held by ``o`` is the etcd key
``<prefix><escaped k>\\x00<o>``, whose value is ``o`` (UTF-8) and which is bound to an
etcd lease. A holder that stored metadata with its grant has the value
``<o>\\x00<metadata>`` instead (:func:`record_value`): the owner is known from the
name, so whatever follows it is unambiguous, any byte included, and a record written
before metadata existed (the value ``o`` alone) reads as one without metadata.

The holder is part of the name so that a transfer can delete the old holder's record
and create the new one in one transaction: the new record's ``create_revision`` is
that transaction's revision, which is the fencing token, while a same-owner re-put (a
renewal with a different TTL moves the record to a new etcd lease) keeps
``create_revision`` and so keeps the token. See ``_ops`` for the transactions.

All records of ``k`` live in one contiguous etcd range, the *holder range*
``[<prefix><escaped k>\\x00, <prefix><escaped k>\\x01)``. The escaping removes every
NUL from the key so that the first NUL after the prefix ends it, and so that no other
key's records fall into that range: ``\\x00`` -> ``\\x01\\x01``, ``\\x01`` ->
``\\x01\\x02``, every other byte kept. The mapping is prefix-free and keeps byte order,
so etcd's key order is lease-key order, and the records of the keys that start with
``p`` form the range of names starting with ``<prefix><escaped p>`` (``inspect``).

A counting lease on ``k`` (``_slots``) lives apart, in the *slot range*
``S(k) = [<prefix>\\xff<escaped k>\\x00, <prefix>\\xff<escaped k>\\x01)``: an escaped
key is UTF-8, which never holds the byte ``\\xff``, so no lease record falls into any
slot range, nor a slot name into any holder range or into ``inspect``'s ranges of keys
starting with a prefix (a listing of everything reads past them and skips them).
The line of fair waiters for the lease on ``k`` (``_fair``) is the *line range*
``L(k)``, the same with ``\\xfe`` (another byte UTF-8 never holds) for ``\\xff``.
"""

from __future__ import annotations

__all__ = [
    "SEPARATOR",
    "holder_range",
    "line_range",
    "prefix_range",
    "range_end",
    "record_name",
    "record_value",
    "slot_range",
    "split_record_name",
    "split_record_value",
]

SEPARATOR = b"\x00"
SLOTS = b"\xff"  # starts a slot range: never a byte of an escaped (UTF-8) key
LINE = b"\xfe"  # starts a line range: nor is this

_ESCAPE = {0: b"\x01\x01", 1: b"\x01\x02"}
_UNESCAPE = {1: 0, 2: 1}


def _escape(key: str) -> bytes:
    raw = key.encode()
    if b"\x00" not in raw and b"\x01" not in raw:
        return raw
    return b"".join(_ESCAPE.get(byte, bytes((byte,))) for byte in raw)


def _unescape(escaped: bytes) -> bytes | None:
    if b"\x01" not in escaped:
        return escaped
    out = bytearray()
    it = iter(escaped)
    for byte in it:
        if byte != 1:
            out.append(byte)
            continue
        code = next(it, None)
        if code not in _UNESCAPE:
            return None
        out.append(_UNESCAPE[code])
    return bytes(out)


def range_end(start: bytes) -> bytes:
    """The end (exclusive) of the etcd range of every name that starts with ``start``."""
    end = bytearray(start)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"  # etcd's "to the end of the keyspace"


def record_name(prefix: bytes, key: str, owner: str) -> bytes:
    """The name of ``owner``'s record of a lease on ``key`` (both valid names)."""
    return prefix + _escape(key) + SEPARATOR + owner.encode()


def holder_range(prefix: bytes, key: str) -> tuple[bytes, bytes]:
    """``(start, end)`` of the range holding every record of ``key`` (at most one)."""
    start = prefix + _escape(key) + SEPARATOR
    return start, range_end(start)


def slot_range(prefix: bytes, key: str) -> tuple[bytes, bytes]:
    """``(start, end)`` of every name of the counting lease on ``key`` (``_slots``)."""
    start = prefix + SLOTS + _escape(key) + SEPARATOR
    return start, range_end(start)


def line_range(prefix: bytes, key: str) -> tuple[bytes, bytes]:
    """``(start, end)`` of the places in the line of waiters for ``key`` (``_fair``)."""
    start = prefix + LINE + _escape(key) + SEPARATOR
    return start, range_end(start)


def prefix_range(prefix: bytes, key_prefix: str | None) -> tuple[bytes, bytes]:
    """``(start, end)`` of the records of every key that starts with ``key_prefix``."""
    start = prefix + (b"" if key_prefix is None else _escape(key_prefix))
    return start, range_end(start)


def split_record_name(prefix: bytes, name: bytes) -> tuple[str, str] | None:
    """``(key, owner)`` of a record name, or ``None`` if it is not one of ours."""
    if not name.startswith(prefix):
        return None
    escaped, sep, owner = name[len(prefix) :].partition(SEPARATOR)
    if not sep or not escaped or not owner:
        return None
    raw = _unescape(escaped)
    if raw is None:
        return None
    try:
        return raw.decode(), owner.decode()
    except UnicodeDecodeError:
        return None


def record_value(owner: bytes, metadata: bytes | None) -> bytes:
    """The value of ``owner``'s record: the owner, then its metadata after a NUL if any."""
    return owner if metadata is None else owner + SEPARATOR + metadata


def split_record_value(owner: bytes, value: bytes) -> tuple[bool, bytes | None]:
    """``(True, metadata)`` of a record of ``owner`` with ``value`` (metadata ``None``
    if it stored none), or ``(False, None)`` if the value is not one leasekit writes."""
    if not value.startswith(owner):
        return False, None
    if len(value) == len(owner):
        return True, None
    if value[len(owner)] != SEPARATOR[0]:
        return False, None
    return True, value[len(owner) + 1 :]
