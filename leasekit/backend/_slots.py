"""The counting-lease extra: ``limit`` slots per key (``Capabilities(slots=True)``)."""

from __future__ import annotations

from typing import Protocol

from .._slots import SlotResult
from ._records import LeaseRecord, _register_extra

__all__ = ["SupportsSlots"]


class SupportsSlots(Protocol):
    """A backend with counting leases: up to ``limit`` holders of a key at once.

    Each slot is one owner's, with its own TTL and fencing token (greater than every
    token issued for the key before). Every method is one atomic step on the store;
    arguments are checked before any I/O (``validate_limit`` for ``limit``). Counting
    keys are apart from the contract's single-holder keys.
    """

    async def acquire_slot(
        self, key: str, owner: str, ttl_ms: int, *, limit: int, exclusive: bool = False
    ) -> SlotResult:
        """Take a free slot of ``key`` for ``owner`` (or refresh ``owner``'s, same token).

        With ``exclusive``, the whole key: granted only when nobody else holds a slot;
        denied, the caller's claim to go next stops new grants to others for
        :data:`leasekit.EXCLUSIVE_INTENT_MS` (or its ``ttl_ms``, if shorter), so
        retrying within that it is not starved. Raises
        :class:`leasekit.SlotLimitMismatch` if ``key`` has live slots under another
        limit, writing nothing.
        """
        ...

    async def renew_slot(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Reset the TTL of ``owner``'s live slot; whether it held one."""
        ...

    async def release_slot(self, key: str, owner: str) -> bool:
        """Free ``owner``'s live slot; whether it held one."""
        ...

    async def transfer_slot(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``from_owner``'s live slot to ``to_owner`` (a new token) in one step.

        False, with nothing changed, if ``from_owner`` holds no live slot or
        ``to_owner`` already holds another one.
        """
        ...

    async def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """The live slots of ``key`` (owner, token, time left), in grant order."""
        ...


_register_extra(SupportsSlots, "acquire_slot")
