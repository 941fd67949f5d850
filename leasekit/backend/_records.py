"""What the optional extras return, and the protocols the CLI checks them by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "LeaseRecord",
    "SupportsFlush",
    "SupportsInspect",
    "SupportsMigrate",
    "SupportsRecords",
    "SupportsReleaseReport",
    "SupportsSweep",
    "supports",
]


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One live lease: key, holder, fencing token, time left, and the holder's metadata.

    What ``get_lease_record`` and ``inspect`` report. ``token`` is ``None`` on a backend
    without fencing; ``remaining_ms`` is the store's own view of the time left when it
    was read (at least 1); ``metadata`` is what the holder stored with its grant
    (``None`` when it stored none, or on a backend without ``metadata``).
    """

    key: str
    owner: str
    token: int | None
    remaining_ms: int
    metadata: bytes | None = None


class SupportsInspect(Protocol):
    """A backend that can list its live leases (``leasekit inspect``)."""

    async def inspect(self, prefix: str | None = None, *, limit: int = 1000) -> list[LeaseRecord]:
        """Live leases in key order, only keys starting with ``prefix`` if given."""
        ...


class SupportsMigrate(Protocol):
    """A backend with a schema to create or upgrade (``leasekit migrate``)."""

    async def migrate(self) -> object:
        """Create or upgrade the schema; idempotent."""
        ...


class SupportsRecords(Protocol):
    """A backend that reads a lease's whole record in one round trip.

    Every backend that declares ``Capabilities(metadata=True)`` has it.
    """

    async def get_lease_record(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key`` (owner, token, metadata, time left), ``None`` if free."""
        ...


class SupportsReleaseReport(Protocol):
    """A backend whose release says whether it released (``leasekit release --json``).

    The contract's ``release_lease`` returns nothing; reading the owner before or
    after it would race with other holders. ``release_if_held`` is the same one atomic
    step, and returns what that step found.
    """

    async def release_if_held(self, key: str, owner: str) -> bool:
        """Release ``key`` if ``owner`` holds it live, as ``release_lease``; True if it did."""
        ...


class SupportsSweep(Protocol):
    """A backend that keeps records of expired leases and can delete them."""

    async def sweep(self) -> int:
        """Delete records of long-expired leases; return how many were deleted."""
        ...


class SupportsFlush(Protocol):
    """A backend with background work (revokes, deferred writes) that can be awaited."""

    async def flush(self) -> None:
        """Wait until background work started so far has finished."""
        ...


_EXTRAS: dict[object, str] = {
    SupportsInspect: "inspect",
    SupportsMigrate: "migrate",
    SupportsRecords: "get_lease_record",
    SupportsReleaseReport: "release_if_held",
    SupportsSweep: "sweep",
    SupportsFlush: "flush",
}


def _register_extra(protocol: type, method: str) -> None:
    _EXTRAS[protocol] = method


def supports(provider: object, extra: type) -> bool:
    """Whether ``provider`` has the extra described by protocol ``extra``, structurally.

    ``supports(provider, SupportsInspect)``: true when the method exists and is
    callable, whatever class the provider is (no ``isinstance`` on the protocol).
    """
    name = _EXTRAS.get(extra)
    if name is None:
        raise TypeError(f"not a leasekit extra protocol: {extra!r}")
    return callable(getattr(provider, name, None))
