"""Each contract operation's first half, shared by the async and the blocking provider.

One function per operation validates the arguments (the core helpers, before any
I/O) and returns the request to send (``_replies``); the caller sends it on its own
connection and reads the reply with the ``_replies`` reader named in the docstring.
Both providers call these, so validation and requests cannot drift between them.
"""

from __future__ import annotations

from leasekit import validate_key, validate_owner, validate_ttl_ms

from . import _replies
from ._replies import ScriptCall

__all__ = ["acquire", "owner", "release", "release_grant", "renew", "transfer"]


def acquire(
    prefix: bytes, key: str, owner: str, ttl_ms: int, *, counter_ttl_ms: int | None
) -> ScriptCall:
    """Validated ``ACQUIRE``; read the reply with :func:`_replies.read_acquire`."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    return _replies.acquire_request(prefix, key, owner, ttl_ms, counter_ttl_ms=counter_ttl_ms)


def owner(prefix: bytes, key: str) -> tuple[str, bytes]:
    """Validated ``GET``; read the reply with :func:`_replies.read_owner`."""
    validate_key(key)
    return _replies.owner_request(prefix, key)


def release(prefix: bytes, key: str, owner: str, *, publish: bytes) -> ScriptCall:
    """Validated ``RELEASE``; its reply carries nothing to read."""
    validate_key(key)
    validate_owner(owner)
    return _replies.release_request(prefix, key, owner, publish=publish)


def release_grant(prefix: bytes, key: str, owner: str, token: int, *, publish: bytes) -> ScriptCall:
    """Validated ``RELEASE_GRANT``; its reply carries nothing to read."""
    validate_key(key)
    validate_owner(owner)
    return _replies.release_grant_request(prefix, key, owner, token, publish=publish)


def renew(
    prefix: bytes, key: str, owner: str, ttl_ms: int, *, counter_ttl_ms: int | None
) -> ScriptCall:
    """Validated ``RENEW``; read the reply with :func:`_replies.read_flag`."""
    validate_key(key)
    validate_owner(owner)
    validate_ttl_ms(ttl_ms)
    return _replies.renew_request(prefix, key, owner, ttl_ms, counter_ttl_ms=counter_ttl_ms)


def transfer(
    prefix: bytes,
    key: str,
    from_owner: str,
    to_owner: str,
    ttl_ms: int,
    *,
    counter_ttl_ms: int | None,
    publish: bytes,
) -> ScriptCall:
    """Validated ``TRANSFER``; read the reply with :func:`_replies.read_flag`."""
    validate_key(key)
    validate_owner(from_owner, "from_owner")
    validate_owner(to_owner, "to_owner")
    validate_ttl_ms(ttl_ms)
    return _replies.transfer_request(
        prefix,
        key,
        from_owner,
        to_owner,
        ttl_ms,
        counter_ttl_ms=counter_ttl_ms,
        publish=publish,
    )
