"""Redis key names for lease keys: binary-safe, reversible, and hash-tagged per lease key.

A lease key is any non-empty UTF-8 string, NUL, ``{`` and ``}`` included. Its Redis
name is ``<prefix>{<escaped key>}``: the braces are a Redis Cluster hash tag, so the
lease and its fencing counter (``<name>:fence``) hash to one slot. Redis takes the tag
from the first ``{`` to the first ``}`` after it, so the escaped key must contain
neither; and the prefix must contain no brace at all, or the tag would start there.
Escaping is percent-style and reversible, so ``inspect`` recovers the exact key:
``%`` -> ``%25``, ``{`` -> ``%7B``, ``}`` -> ``%7D``. Every other byte, NUL included,
is kept as is (Redis names are binary-safe), which keeps names readable in
``redis-cli``. A lease name always ends in ``}`` and a counter name in ``}:fence``, so
a ``SCAN`` pattern ending in ``}`` lists leases only.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "COUNTER_SUFFIX",
    "counter_name",
    "key_from_lease_name",
    "lease_name",
    "lease_scan_pattern",
    "slot_groups",
]

COUNTER_SUFFIX = b":fence"

_ESCAPE = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})
_UNESCAPE = re.compile(r"%(25|7B|7D)")
_UNESCAPED = {"25": "%", "7B": "{", "7D": "}"}
_GLOB_SPECIAL = re.compile(rb"([\\*?\[\]])")


def lease_name(prefix: bytes, key: str) -> bytes:
    """The Redis name of the lease on ``key`` (a valid lease key) under ``prefix``."""
    if "%" in key or "{" in key or "}" in key:  # rare; translate() costs ten times more
        key = key.translate(_ESCAPE)
    return prefix + b"{" + key.encode() + b"}"


def counter_name(lease: bytes) -> bytes:
    """The Redis name of the fencing counter that belongs to the lease name ``lease``."""
    return lease + COUNTER_SUFFIX


def key_from_lease_name(prefix: bytes, name: bytes) -> str | None:
    """The lease key a Redis name stands for, or ``None`` if it is not a lease name."""
    if not (name.startswith(prefix + b"{") and name.endswith(b"}")):
        return None
    body = name[len(prefix) + 1 : -1]
    if not body or b"{" in body or b"}" in body:
        return None
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    return _UNESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], text)


def lease_scan_pattern(prefix: bytes, key_prefix: str | None) -> bytes:
    """A ``SCAN MATCH`` pattern for the lease names whose keys start with ``key_prefix``."""
    start = prefix + b"{" + ("" if key_prefix is None else key_prefix.translate(_ESCAPE)).encode()
    return _GLOB_SPECIAL.sub(rb"\\\1", start) + b"*}"


def slot_groups(leases: list[bytes], keyslot: Callable[[bytes], int] | None) -> list[list[int]]:
    """Indexes of ``leases`` grouped by cluster slot (``keyslot``, a cluster client's);
    one group without one (a single server)."""
    if keyslot is None:
        return [list(range(len(leases)))]
    slots: dict[int, list[int]] = {}
    for index, lease in enumerate(leases):
        slots.setdefault(keyslot(lease), []).append(index)
    return list(slots.values())
