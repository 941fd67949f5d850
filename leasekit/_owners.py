"""Owner ids: :func:`new_owner_id`, one unique id per holder."""

from __future__ import annotations

import os
import socket

from ._contract import validate_owner
from ._errors import InvalidLeaseArgument

__all__ = ["new_owner_id"]


def new_owner_id(prefix: str = "") -> str:
    """Return a fresh owner id, unique to this call: ``[prefix:]host:pid:random``.

    Owners must be unique per holder. Acquire is idempotent for its owner, so two
    processes that both use, say, the run id as owner would both "win" the same
    lease. Make one id per holder (per process, or per task that holds leases
    independently) and keep it for that holder's lifetime. The host and pid make ids
    readable in ``get_lease_owner`` answers; 64 random bits make them unique.
    """
    checked: object = prefix
    if not isinstance(checked, str):
        raise InvalidLeaseArgument.for_argument(
            "prefix", f"must be a str, got {type(checked).__name__}"
        )
    if prefix:
        validate_owner(prefix, "prefix")
        if len(prefix.encode("utf-8")) > 512:  # leaves room for host, pid and randomness
            raise InvalidLeaseArgument.for_argument("prefix", "must be at most 512 UTF-8 bytes")
    host = (socket.gethostname() or "localhost")[:255]
    parts = [prefix, host, str(os.getpid()), os.urandom(8).hex()]
    return ":".join(part for part in parts if part)
