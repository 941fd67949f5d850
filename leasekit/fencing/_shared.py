"""What every fencing guard shares: the defaults, token and argument checks, SQL quoting."""

from __future__ import annotations

from .._contract import validate_key
from .._errors import InvalidLeaseArgument

__all__ = [
    "DEFAULT_FENCE_TABLE",
    "DEFAULT_REDIS_FENCE_PREFIX",
    "MAX_FENCING_TOKEN",
    "quoted",
    "resource_bytes",
    "table_parts",
    "validate_token",
]

DEFAULT_FENCE_TABLE = "leasekit_fence"
"""The fence table's name, in PostgreSQL, SQLite and MySQL, unless ``table=`` says otherwise."""

DEFAULT_REDIS_FENCE_PREFIX = "leasekit-fence:"
"""The Redis fence key of ``resource`` is this prefix followed by ``resource``."""

MAX_FENCING_TOKEN = 2**63 - 1
"""The largest token a guard accepts: a signed 64-bit integer (``bigint``, ``INTEGER``)."""


def validate_token(token: object, argument: str = "token") -> int:
    """Check a fencing token and return it: an ``int`` (not ``bool``) in ``1..2**63-1``.

    Raises :class:`leasekit.InvalidLeaseArgument` naming ``argument``; a ``None`` token
    (from a backend without fencing) is refused with a hint.
    """
    if token is None:
        raise InvalidLeaseArgument.for_argument(
            argument,
            "must be an int, got None (connect with require='fencing' so every grant "
            "carries a token)",
            token,
        )
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be an int, got {type(token).__name__} {token!r}", token
        )
    if not 1 <= token <= MAX_FENCING_TOKEN:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be between 1 and 2**63-1, got {token}", token
        )
    return int(token)


def resource_bytes(resource: object) -> bytes:
    return validate_key(resource, "resource").encode("utf-8")


def table_parts(table: object) -> tuple[str, ...]:
    """``"name"`` or ``"schema.name"``, each part non-empty and without NUL."""
    if not isinstance(table, str):
        raise InvalidLeaseArgument.for_argument(
            "table", f"must be a str, got {type(table).__name__}", table
        )
    parts = tuple(table.split("."))
    if len(parts) > 2 or not all(parts) or "\0" in table:
        raise InvalidLeaseArgument.for_argument(
            "table", "must be 'name' or 'schema.name', without NUL", table
        )
    return parts


# -- SQL: one conditional upsert -------------------------------------------------------------
#
# The statements, for a fence table ``fence`` (resource, token), with parameters
# (resource, token):
#
#     INSERT INTO fence AS f (resource, token) VALUES (:resource, :token)
#     ON CONFLICT (resource) DO UPDATE SET token = excluded.token
#     WHERE f.token <= excluded.token
#
# Why it is atomic: the upsert finds the resource's row and decides under that row's
# write lock (PostgreSQL's row lock; SQLite's single write lock), so no other writer's
# token can land between the comparison and the update. A competing transaction's
# upsert of the same resource waits for the lock; under READ COMMITTED, PostgreSQL then
# re-evaluates the WHERE against the row as the winner committed it, so an older token
# that arrives second is refused, and a newer one goes through. The lock is held until
# the caller's transaction ends, so the caller's own write (after the guard, in the same
# transaction) is ordered by it too; and a rolled-back transaction rolls the fence back.
# The WHERE fails only on a stale token: then nothing is written and the statement
# reports no row (PostgreSQL: no RETURNING row; SQLite: zero changes), and a second
# read fetches the current token for the error message.


def quoted(parts: tuple[str, ...], quote: str) -> str:
    """A dotted table name with each part quoted (the quote doubled inside), so any name
    is safe: the table name is the only text of the statements not passed as a
    parameter. SQLite quotes with ``"``, MySQL and MariaDB with a backquote."""
    return ".".join(quote + part.replace(quote, quote * 2) + quote for part in parts)
