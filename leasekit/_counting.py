"""A counting lease as a lease provider: :func:`counting`.

``counting(provider, limit=3)`` is a lease provider whose every key is a counting
lease of ``provider`` with ``limit`` slots: its five contract methods are the slot
methods of :class:`leasekit.backend.SupportsSlots`. Everything built on the contract
then works with slots unchanged: :func:`leasekit.hold` holds (and renews) a slot,
:func:`leasekit.wait_for` waits for one, :func:`leasekit.elect` elects up to ``limit``
leaders, and :func:`leasekit.sync.wrap` gives the blocking API. With ``limit=1`` it is
an ordinary single-holder lease, and passes the whole conformance suite as one.
"""

from __future__ import annotations

import dataclasses
from types import TracebackType
from typing import Any

from ._capabilities import Capabilities, capabilities_of
from ._contract import LeaseResult
from ._errors import BackendLacksCapability, LeaseProviderClosed
from ._slots import check_exclusive, validate_limit
from .backend._records import LeaseRecord, supports
from .backend._slots import SupportsSlots

__all__ = ["CountingLeaseProvider", "counting"]


class CountingLeaseProvider:
    """The keys of ``provider`` as counting leases of ``limit`` slots (see :func:`counting`).

    - ``acquire_lease`` takes a slot (or refreshes the caller's, same token); denied,
      it names the first holder in grant order.
    - ``get_lease_owner`` names the first holder while every slot is taken, and is
      ``None`` while one is free: "free" means a slot is free, which is what waiters
      wait for.
    - ``renew_lease``, ``release_lease`` and ``transfer_lease`` act on the caller's
      own slot; a transfer to an owner that holds a slot already returns ``False``.
    - ``lease_remaining_ms`` (waiters sleep until it): while every slot is taken, the
      time until the first of them expires.

    Fencing tokens are per slot grant: greater than every token issued for the key
    before, but up to ``limit`` holders hold valid ones at once, so a fencing guard
    that admits only the highest token serves one of them.
    """

    def __init__(
        self, provider: Any, limit: int, *, exclusive: bool = False, close: bool = False
    ) -> None:
        self.limit = validate_limit(limit)
        self.exclusive = check_exclusive(exclusive)
        caps = capabilities_of(provider)
        if not caps.slots or not supports(provider, SupportsSlots):
            name = getattr(provider, "backend", None) or type(provider).__name__
            raise BackendLacksCapability(
                f"backend {name!r} has no counting leases (Capabilities.slots is false)",
                backend=str(name),
                missing=("slots",),
            )
        self.provider = provider
        self.capabilities: Capabilities = dataclasses.replace(
            caps,
            release_notifications=False,
            grant_notifications=False,
            metadata=False,
            slots=False,
            fair_waiting=False,
        )
        self._close = close
        self._closed = False

    @property
    def backend(self) -> str:
        return str(getattr(self.provider, "backend", None) or type(self.provider).__name__)

    @property
    def timeout_s(self) -> float | None:
        timeout_s = getattr(self.provider, "timeout_s", None)
        return timeout_s if isinstance(timeout_s, int | float) else None

    def _slots(self) -> Any:
        if self._closed:
            raise LeaseProviderClosed(backend=self.backend)
        return self.provider

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        slots = self._slots()
        if self.exclusive:
            result = await slots.acquire_slot(key, owner, ttl_ms, limit=self.limit, exclusive=True)
        else:
            result = await slots.acquire_slot(key, owner, ttl_ms, limit=self.limit)
        if result.acquired:
            return LeaseResult(True, owner, result.token)
        return LeaseResult(False, result.holders[0] if result.holders else None, None)

    async def get_lease_owner(self, key: str) -> str | None:
        records: list[LeaseRecord] = await self._slots().get_slot_holders(key)
        if records and (self.exclusive or len(records) >= self.limit):
            return records[0].owner
        return None

    async def release_lease(self, key: str, owner: str) -> None:
        await self._slots().release_slot(key, owner)

    async def release_if_held(self, key: str, owner: str) -> bool:
        """Free ``owner``'s slot; whether it held one (``SupportsReleaseReport``)."""
        return bool(await self._slots().release_slot(key, owner))

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return bool(await self._slots().renew_slot(key, owner, ttl_ms))

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return bool(await self._slots().transfer_slot(key, from_owner, to_owner, ttl_ms))

    async def lease_remaining_ms(self, key: str) -> int | None:
        """While every slot is taken, milliseconds until the first expires; else ``None``."""
        records: list[LeaseRecord] = await self._slots().get_slot_holders(key)
        if not records or (not self.exclusive and len(records) < self.limit):
            return None
        return min(r.remaining_ms for r in records)

    async def get_slot_holders(self, key: str) -> list[LeaseRecord]:
        """The live slots of ``key``, in grant order."""
        records: list[LeaseRecord] = await self._slots().get_slot_holders(key)
        return records

    async def aclose(self) -> None:
        """Refuse further calls; close the wrapped provider too if made with ``close=True``."""
        self._closed = True
        if self._close:
            await self.provider.aclose()

    async def __aenter__(self) -> CountingLeaseProvider:
        if self._close:
            await self.provider.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        mode = ", exclusive" if self.exclusive else ""
        return f"CountingLeaseProvider({self.provider!r}, limit={self.limit}{mode}{state})"


def counting(
    provider: Any, limit: int, *, exclusive: bool = False, close: bool = False
) -> CountingLeaseProvider:
    """``provider``'s keys as counting leases of ``limit`` slots, behind the lease contract.

    ``provider`` must declare ``Capabilities(slots=True)`` (else
    :class:`~leasekit.BackendLacksCapability`); ``limit`` is checked at once
    (:func:`leasekit.validate_limit`). With ``exclusive=True`` each acquire takes the
    whole key (``acquire_slot(..., exclusive=True)``): a writer beside the readers
    that share the same ``provider`` and ``limit``. With ``close=True`` the result opens and closes
    ``provider`` in its ``async with`` and ``aclose()``.
    """
    return CountingLeaseProvider(provider, limit, exclusive=exclusive, close=close)
