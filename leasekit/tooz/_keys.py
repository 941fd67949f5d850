"""Where the tooz driver keeps groups, members, leaders and locks, as lease keys and owners.

Pure functions, no I/O. Every tooz id (``bytes``, or ``str`` as tooz accepts at run
time) is percent-encoded into a key segment, so ids containing ``/``, NUL or bytes that
are not UTF-8 never collide and the listing of a group's members by key prefix is exact;
decoding always gives ``bytes`` back, as tooz's network drivers return ids.

A lease's owner carries what tooz attaches to it: the session (one per ``start()``) that
holds it, and a member's capabilities (msgpack, as tooz's own drivers serialize them,
then base64), so that updating capabilities is one atomic ``transfer_lease``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_from_bytes, unquote_to_bytes

from tooz import utils as tooz_utils

from .._contract import MAX_NAME_BYTES
from .._errors import InvalidLeaseArgument

__all__ = [
    "Keys",
    "MemberOwner",
    "decode_member_owner",
    "encode_id",
    "encode_member_owner",
    "leader_member",
    "leader_owner",
    "lock_owner",
    "to_bytes",
]


def encode_id(value: object, argument: str) -> str:
    """``value`` (a non-empty ``bytes`` or ``str`` id) as one key segment; else refused."""
    if isinstance(value, bytes):
        encoded = quote_from_bytes(value, safe="")
    elif isinstance(value, str):
        encoded = quote(value, safe="")
    else:
        raise InvalidLeaseArgument.for_argument(
            argument, f"must be bytes or str, got {type(value).__name__}", value
        )
    if not encoded:
        raise InvalidLeaseArgument.for_argument(argument, "must not be empty", value)
    return encoded


def to_bytes(value: bytes | str) -> bytes:
    """A tooz id as ``bytes`` (a ``str`` id encoded as UTF-8), as events and results carry it."""
    return value if isinstance(value, bytes) else value.encode("utf-8")


@dataclass(frozen=True, slots=True)
class Keys:
    """The lease keys of one namespace: ``<ns>/group/<g>``, ``<ns>/member/<g>/<m>``, ..."""

    namespace: str

    def group(self, group: str) -> str:
        return self._checked(f"{self.namespace}/group/{group}")

    def groups_prefix(self) -> str:
        return f"{self.namespace}/group/"

    def member(self, group: str, member: str) -> str:
        return self._checked(f"{self.namespace}/member/{group}/{member}")

    def members_prefix(self, group: str) -> str:
        return self._checked(f"{self.namespace}/member/{group}/")

    def leader(self, group: str) -> str:
        return self._checked(f"{self.namespace}/leader/{group}")

    def lock(self, name: str) -> str:
        return self._checked(f"{self.namespace}/lock/{name}")

    @staticmethod
    def last_segment(key: str, prefix: str) -> bytes:
        """The id that ``key`` (listed under ``prefix``) ends with, decoded."""
        return unquote_to_bytes(key[len(prefix) :])

    @staticmethod
    def _checked(key: str) -> str:
        size = len(key.encode("utf-8"))
        if size > MAX_NAME_BYTES:
            raise InvalidLeaseArgument.for_argument(
                "id",
                f"too long: its lease key would be {size} bytes, over {MAX_NAME_BYTES}",
                key,
            )
        return key


@dataclass(frozen=True, slots=True)
class MemberOwner:
    """A member lease's owner, decoded: the session holding it, and the capabilities."""

    session: str
    capabilities: Any


_NO_CAPABILITIES = "-"


def encode_member_owner(session: str, capabilities: Any) -> str:
    """The owner of a member lease: ``"<session> <base64 msgpack capabilities>"``.

    Raises tooz's ``SerializationError`` for capabilities msgpack cannot encode and
    :class:`~leasekit.InvalidLeaseArgument` when they make the owner longer than a
    lease owner may be (:data:`leasekit.MAX_NAME_BYTES`).
    """
    if capabilities is None:
        body = _NO_CAPABILITIES
    else:
        body = base64.urlsafe_b64encode(tooz_utils.dumps(capabilities)).decode("ascii")
    owner = f"{session} {body}"
    if len(owner) > MAX_NAME_BYTES:
        raise InvalidLeaseArgument.for_argument(
            "capabilities",
            f"too large: {len(body)} bytes once encoded, at most "
            f"{MAX_NAME_BYTES - len(session) - 1} fit in a lease owner",
        )
    return owner


def decode_member_owner(owner: str) -> MemberOwner:
    """The session and capabilities of a member lease's owner (``None``: none were given)."""
    session, _, body = owner.partition(" ")
    if body in ("", _NO_CAPABILITIES):
        return MemberOwner(session, None)
    try:
        raw = base64.urlsafe_b64decode(body.encode("ascii"))
    except (ValueError, binascii.Error) as exc:
        raise tooz_utils.SerializationError(f"unreadable capabilities: {exc}") from exc
    return MemberOwner(session, tooz_utils.loads(raw))


def leader_owner(session: str, member: str) -> str:
    """The owner of a group's leader lease: ``"<session> <member>"``."""
    return f"{session} {member}"


def leader_member(owner: str) -> bytes:
    """The member id a leader lease's owner names."""
    return unquote_to_bytes(owner.partition(" ")[2])


def lock_owner(session: str, member: str, instance: str) -> str:
    """The owner of a lock lease: one per lock object, so two objects exclude each other."""
    return f"{session} {member} {instance}"
