"""Emitting lease events: the one cheap check on hot paths, and the emitting provider.

pluggy is imported only once a plugin exists (registered at run time, or found in the
``leasekit.plugins`` entry-point group), so ``import leasekit`` and a program without
plugins never load it. :func:`wrap` is what :func:`leasekit.connect` calls: with no
plugin registered it returns the backend's provider itself, so operations cost
exactly what the backend costs; with plugins it returns a
:class:`HookedLeaseProvider` that times each operation and emits one event.
"""

from __future__ import annotations

import time
import warnings
from types import TracebackType
from typing import Any

from ._capabilities import Capabilities, capabilities_of
from ._contract import LeaseResult, ManagedLeaseProvider
from ._detection import NoopLeaseProvider
from ._errors import InvalidLeaseArgument, LeasekitWarning
from ._memory import MemoryLeaseProvider
from ._plugin_state import current_relay, relay

__all__ = [
    "HookedLeaseProvider",
    "backend_name",
    "emit",
    "relay",
    "unwrap",
    "wrap",
]

# Backend classes to the URL scheme they were connected by, so events about a provider
# that connect() did not wrap (made before any plugin existed, or by hand) still name
# the scheme.
_schemes: dict[type, str] = {MemoryLeaseProvider: "memory", NoopLeaseProvider: "noop"}


def emit(event: str, /, **kwargs: Any) -> None:
    """Call hook ``event`` on every plugin; a plugin that raises is reported, not propagated."""
    hooks = current_relay()
    if hooks is None:
        return
    try:
        getattr(hooks, event)(**kwargs)
    except Exception as exc:  # noqa: BLE001 (an observer must never break the operation)
        warnings.warn(
            f"leasekit event hook {event} raised {type(exc).__name__}: {exc}; "
            "the lease operation itself is unaffected",
            LeasekitWarning,
            stacklevel=3,
        )


def backend_name(provider: object) -> str:
    """The name events carry for ``provider``: its URL scheme if known, else its class."""
    if isinstance(provider, HookedLeaseProvider):
        return provider.backend
    return _schemes.get(type(provider)) or type(provider).__name__


def unwrap(provider: Any) -> Any:
    """The backend's own provider under a :class:`HookedLeaseProvider`, else ``provider``."""
    if isinstance(provider, HookedLeaseProvider):
        return provider.wrapped
    return provider


def wrap(provider: ManagedLeaseProvider, scheme: str) -> ManagedLeaseProvider:
    """What connect() returns: ``provider`` itself unless a plugin is registered."""
    _schemes.setdefault(type(provider), scheme)
    if relay() is None:
        return provider
    return HookedLeaseProvider(provider, scheme)


def _failed(
    operation: str, key: str, owner: str | None, *, backend: str, exc: Exception, start: float
) -> None:
    if isinstance(exc, InvalidLeaseArgument):
        return  # raised before any I/O: a caller's bug, not a lease event
    emit(
        "leasekit_failed",
        operation=operation,
        key=key,
        owner=owner,
        backend=backend,
        error=exc,
        latency_s=time.perf_counter() - start,
    )


class HookedLeaseProvider:
    """A provider that emits one lease event per operation, around the backend's own.

    What :func:`leasekit.connect` returns while plugins are registered. Everything
    else (backend-specific methods such as ``inspect``, attributes such as ``path``)
    is forwarded to :attr:`wrapped`, the backend's provider.
    """

    __slots__ = ("backend", "wrapped")

    def __init__(self, wrapped: ManagedLeaseProvider, backend: str) -> None:
        self.wrapped = wrapped
        self.backend = backend

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped backend's capabilities."""
        return capabilities_of(self.wrapped)

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, metadata: bytes | str | None = None
    ) -> LeaseResult:
        start = time.perf_counter()
        try:
            if metadata is None:
                result = await self.wrapped.acquire_lease(key, owner, ttl_ms)
            else:  # only a backend with Capabilities.metadata takes it
                result = await self.wrapped.acquire_lease(  # type: ignore[call-arg]
                    key, owner, ttl_ms, metadata=metadata
                )
        except Exception as exc:
            _failed("acquire", key, owner, backend=self.backend, exc=exc, start=start)
            raise
        self._decided(key, owner, result, time.perf_counter() - start)
        return result

    async def acquire_lease_in_turn(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        place_ttl_ms: int,
        metadata: bytes | str | None = None,
    ) -> LeaseResult:
        """The backend's ``acquire_lease_in_turn`` (fair waiting), with acquire's events."""
        start = time.perf_counter()
        take: Any = self.wrapped.acquire_lease_in_turn  # type: ignore[attr-defined]
        try:
            if metadata is None:
                result: LeaseResult = await take(key, owner, ttl_ms, place_ttl_ms=place_ttl_ms)
            else:
                result = await take(
                    key, owner, ttl_ms, place_ttl_ms=place_ttl_ms, metadata=metadata
                )
        except Exception as exc:
            _failed("acquire", key, owner, backend=self.backend, exc=exc, start=start)
            raise
        self._decided(key, owner, result, time.perf_counter() - start)
        return result

    def _decided(self, key: str, owner: str, result: LeaseResult, latency_s: float) -> None:
        if result.acquired:
            emit(
                "leasekit_acquired",
                key=key,
                owner=owner,
                backend=self.backend,
                token=result.token,
                latency_s=latency_s,
            )
        else:
            emit(
                "leasekit_denied",
                key=key,
                owner=owner,
                holder=result.owner,
                backend=self.backend,
                latency_s=latency_s,
            )

    async def get_lease_owner(self, key: str) -> str | None:
        start = time.perf_counter()
        try:
            return await self.wrapped.get_lease_owner(key)
        except Exception as exc:
            _failed("owner", key, None, backend=self.backend, exc=exc, start=start)
            raise

    async def release_lease(self, key: str, owner: str) -> None:
        start = time.perf_counter()
        try:
            await self.wrapped.release_lease(key, owner)
        except Exception as exc:
            _failed("release", key, owner, backend=self.backend, exc=exc, start=start)
            raise
        emit(
            "leasekit_released",
            key=key,
            owner=owner,
            backend=self.backend,
            latency_s=time.perf_counter() - start,
        )

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        start = time.perf_counter()
        try:
            renewed = await self.wrapped.renew_lease(key, owner, ttl_ms)
        except Exception as exc:
            _failed("renew", key, owner, backend=self.backend, exc=exc, start=start)
            raise
        latency_s = time.perf_counter() - start
        if renewed:
            emit(
                "leasekit_renewed", key=key, owner=owner, backend=self.backend, latency_s=latency_s
            )
        else:
            emit(
                "leasekit_lost",
                key=key,
                owner=owner,
                backend=self.backend,
                reason="renew_refused",
                latency_s=latency_s,
            )
        return renewed

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int,
        *,
        metadata: bytes | str | None = None,
    ) -> bool:
        start = time.perf_counter()
        try:
            if metadata is None:
                handed = await self.wrapped.transfer_lease(key, from_owner, to_owner, ttl_ms)
            else:  # only a backend with Capabilities.metadata takes it
                handed = await self.wrapped.transfer_lease(  # type: ignore[call-arg]
                    key, from_owner, to_owner, ttl_ms, metadata=metadata
                )
        except Exception as exc:
            _failed("transfer", key, from_owner, backend=self.backend, exc=exc, start=start)
            raise
        latency_s = time.perf_counter() - start
        if handed:
            emit(
                "leasekit_transferred",
                key=key,
                owner=from_owner,
                to_owner=to_owner,
                backend=self.backend,
                latency_s=latency_s,
            )
        else:
            emit(
                "leasekit_lost",
                key=key,
                owner=from_owner,
                backend=self.backend,
                reason="transfer_refused",
                latency_s=latency_s,
            )
        return handed

    async def aclose(self) -> None:
        """Close the wrapped provider."""
        await self.wrapped.aclose()

    async def __aenter__(self) -> HookedLeaseProvider:
        await self.wrapped.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.wrapped.__aexit__(exc_type, exc, tb)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper lacks: backend extras such as inspect().
        if name in HookedLeaseProvider.__slots__:
            raise AttributeError(name)  # not initialised yet (copy, pickle): no recursion
        return getattr(self.wrapped, name)

    def __repr__(self) -> str:
        return f"HookedLeaseProvider({self.wrapped!r}, backend={self.backend!r})"
