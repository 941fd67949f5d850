"""Batched renewal: the optional interface, and the one check of its input.

A process that holds many leases through :func:`leasekit.hold` renews each of them
every ``renew_every_ms``. On a backend with :meth:`SupportsRenewMany.renew_leases`,
``hold()`` gathers the renewals that fall due close together on one provider and
sends them as one call (one script, statement or transaction), so 10,000 held leases
cost a few round trips per renewal period instead of 10,000. A backend without it is
renewed lease by lease, as before; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeAlias

from .._contract import MAX_NAME_BYTES, MAX_TTL_MS, validate_key, validate_owner, validate_ttl_ms
from .._errors import InvalidLeaseArgument
from ._records import _register_extra

__all__ = ["RENEW_BATCH_LIMIT", "RenewItem", "SupportsRenewMany", "check_renew_items"]

RenewItem: TypeAlias = tuple[str, str, int]
"""One renewal in a batch: ``(key, owner, ttl_ms)``, the arguments of ``renew_lease``."""

RENEW_BATCH_LIMIT = 512
"""The most items :func:`leasekit.hold` puts in one :meth:`~SupportsRenewMany.renew_leases`
call. A backend must accept any length (splitting it if the store needs that); this is
what it will see from ``hold()``."""


class SupportsRenewMany(Protocol):
    """A backend that renews many leases in one round trip.

    Detected structurally (``leasekit.backend.supports(provider, SupportsRenewMany)``):
    a callable ``renew_leases`` is all it takes. The contract, which the conformance
    suite's :class:`~leasekit_contract.BatchedRenewalChecks` enforces:

    - One result per item, in order: exactly what ``renew_lease(key, owner, ttl_ms)``
      would have answered for it. ``True``: ``owner`` held the live lease and its TTL
      is now ``ttl_ms`` from the store's clock as the batch runs; ``False``: someone
      else holds the key, or it is free or expired, and nothing changed.
    - Each item is checked on its own: one refused item never stops the others.
    - Owner-checked and decided on the store's clock, as ``renew_lease`` is, each item
      atomically (the batch as a whole need not be one transaction, though it may be).
    - Every item is validated before any I/O (:func:`check_renew_items`); a bad one
      raises :class:`~leasekit.InvalidLeaseArgument` and nothing is renewed.
    - An error (timeout, lost connection) raises for the whole call, as ``renew_lease``
      would: the caller then knows nothing about any item, and :func:`leasekit.hold`
      treats every one of them as a failed renewal (retried while time remains),
      never as renewed.
    - An empty batch returns ``[]`` without I/O. A key appears at most once per batch
      (:func:`check_renew_items` refuses a repeated one), so items never depend on
      each other.
    """

    async def renew_leases(self, items: Sequence[RenewItem]) -> list[bool]:
        """Renew each ``(key, owner, ttl_ms)``; one ``bool`` per item, as ``renew_lease``."""
        ...


def check_renew_items(items: object) -> list[RenewItem]:
    """Validate a batch for :meth:`SupportsRenewMany.renew_leases`; return it as a list.

    Each item must be a ``(key, owner, ttl_ms)`` tuple that ``renew_lease`` would accept,
    and no key may repeat. Raises :class:`~leasekit.InvalidLeaseArgument` naming the
    first bad item (``items[3].owner``, say) before the backend does any I/O.
    """
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise InvalidLeaseArgument.for_argument(
            "items", f"must be a sequence of (key, owner, ttl_ms), got {type(items).__name__}"
        )
    checked: list[RenewItem] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        if type(item) is tuple and len(item) == 3:
            key, owner, ttl_ms = item
            # The common case in one expression (what hold() sends, 10,000 times a
            # period): ASCII names, which UTF-8 encodes byte for byte, and a plain int.
            if (
                type(key) is str
                and type(owner) is str
                and type(ttl_ms) is int
                and 0 < len(key) <= MAX_NAME_BYTES
                and 0 < len(owner) <= MAX_NAME_BYTES
                and 1 <= ttl_ms <= MAX_TTL_MS
                and key.isascii()
                and owner.isascii()
                and key not in seen
            ):
                seen.add(key)
                checked.append(item)
                continue
        if not isinstance(item, tuple) or len(item) != 3:
            raise InvalidLeaseArgument.for_argument(
                f"items[{index}]", f"must be a (key, owner, ttl_ms) tuple, got {item!r:.80}"
            )
        key, owner, ttl_ms = item
        if key in seen:
            raise InvalidLeaseArgument.for_argument(
                f"items[{index}].key", "must not repeat a key of the same batch", key
            )
        seen.add(key)
        checked.append(
            (
                validate_key(key, f"items[{index}].key"),
                validate_owner(owner, f"items[{index}].owner"),
                validate_ttl_ms(ttl_ms, f"items[{index}].ttl_ms"),
            )
        )
    return checked


_register_extra(SupportsRenewMany, "renew_leases")
