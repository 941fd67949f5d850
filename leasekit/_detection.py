"""Structural detection of providers, and the noop fallback for single-process code."""

from __future__ import annotations

import threading
import warnings
import weakref
from types import TracebackType
from typing import Any, cast

from ._capabilities import Capabilities
from ._contract import LeaseProvider, LeaseResult, validate_key, validate_owner, validate_ttl_ms
from ._errors import InvalidLeaseArgument, LeasekitWarning

__all__ = ["NOOP", "NoopLeaseProvider", "is_lease_provider", "lease_provider_for"]

_METHODS = (
    "acquire_lease",
    "get_lease_owner",
    "release_lease",
    "renew_lease",
    "transfer_lease",
)


def _missing_methods(obj: object) -> list[str]:
    if isinstance(obj, type):
        # A provider class is not a provider: its methods would be called unbound.
        return list(_METHODS)
    return [name for name in _METHODS if not callable(getattr(obj, name, None))]


def is_lease_provider(obj: object) -> bool:
    """True when ``obj`` has all five contract methods and each is callable.

    Structural on purpose, never ``isinstance``: a provider from a separately
    installed copy of leasekit, or written without importing leasekit, qualifies.
    """
    return not _missing_methods(obj)


class NoopLeaseProvider:
    """A provider that coordinates nothing: every acquire wins, nobody is ever the owner.

    It keeps single-process code working unchanged when no real provider is
    configured: ``acquire_lease`` returns ``LeaseResult(True, owner)``,
    ``get_lease_owner`` returns ``None``, ``release_lease`` does nothing, and
    ``renew_lease``/``transfer_lease`` return ``True``. Arguments are still validated,
    so code developed against it does not break when a real backend is configured.
    """

    # It promises nothing, so connect("noop://", require=...) refuses it for any guarantee.
    capabilities = Capabilities()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> NoopLeaseProvider:
        """Build from ``noop://``; accepts no options."""
        if options:
            raise InvalidLeaseArgument.for_argument(
                "options", f"noop:// takes no options, got {sorted(options)}"
            )
        return NOOP

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        return LeaseResult(True, owner)

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        return None

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        return True

    async def aclose(self) -> None:
        """Nothing to close; the shared instance stays usable."""

    async def __aenter__(self) -> NoopLeaseProvider:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def __repr__(self) -> str:
        return "NoopLeaseProvider()"


NOOP = NoopLeaseProvider()
"""The shared noop provider that :func:`lease_provider_for` falls back to."""

_warned_types: weakref.WeakSet[type] = weakref.WeakSet()
_warned_lock = threading.Lock()


def lease_provider_for(obj: object) -> LeaseProvider:
    """Return ``obj`` if it is a lease provider, else the shared :data:`NOOP` provider.

    ``None`` or any object without the contract falls back silently. An object with
    some but not all of the five methods (a partial implementation, usually a bug)
    falls back too, with one :class:`LeasekitWarning` per class naming what is missing.
    """
    missing = _missing_methods(obj)
    if not missing:
        return cast("LeaseProvider", obj)
    if len(missing) < len(_METHODS):
        cls = type(obj)
        with _warned_lock:
            first = cls not in _warned_types
            _warned_types.add(cls)
        if first:
            warnings.warn(
                f"{cls.__module__}.{cls.__qualname__} is a partial lease provider "
                f"(missing or not callable: {', '.join(missing)}); "
                "falling back to the noop provider, which coordinates nothing",
                LeasekitWarning,
                stacklevel=2,
            )
    return NOOP
