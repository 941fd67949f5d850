"""Making a facade: :func:`connect` (a backend's native blocking provider where it has one)
and :func:`wrap` (an existing async provider)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from .. import _hooks
from .._contract import LeaseProvider
from .._errors import BackendLacksCapability, BackendUnavailable
from .._registry import BackendRegistry, _validate_require, scheme_of
from ..backend._sync import SyncProvider, sync_factory
from ._facade import SyncLeaseProvider

__all__ = ["connect", "wrap"]


def connect(
    url: str,
    *,
    require: Iterable[str] | str = (),
    thread_name: str | None = None,
    native: bool = True,
    **options: Any,
) -> SyncLeaseProvider:
    """The blocking twin of :func:`leasekit.connect`: a facade owning a new provider.

    Where the backend offers a native blocking provider (Redis, PostgreSQL, SQLite:
    :class:`leasekit.backend.SupportsSyncProvider`), the five operations run on the
    driver's own blocking client in the calling thread, with no thread hop; other
    backends (and every backend while an event plugin is registered, so that events
    fire, or with ``native=False``) run the async provider on a loop thread named
    ``thread_name``. Either way the provider is opened by ``with`` (or
    :meth:`SyncLeaseProvider.open`, or lazily by the first operation), and
    :func:`connect` raises what :func:`leasekit.connect` raises.
    """
    import leasekit  # noqa: PLC0415 (leasekit/__init__ imports us lazily)

    name = thread_name or f"leasekit-sync {url}"

    async def build() -> LeaseProvider:
        return leasekit.connect(url, require=require, **options)

    blocking = _native_provider(leasekit._registry, url, require, options) if native else None
    return SyncLeaseProvider(build, owns_provider=True, thread_name=name, native=blocking)


def _native_provider(
    registry: BackendRegistry,
    url: str,
    require: Iterable[str] | str,
    options: dict[str, Any],
) -> SyncProvider | None:
    """The backend's native blocking provider for ``url``, or ``None`` to use the loop."""
    if _hooks.relay() is not None:
        return None  # events are emitted around the async provider's operations
    scheme = scheme_of(url)
    wanted = _validate_require(require)
    factory = sync_factory(registry.load(scheme))
    if factory is None:
        return None
    provider: object = factory(url, **options)
    needed = (*_OPERATIONS, "open", "close")
    if not all(callable(getattr(provider, method, None)) for method in needed):
        raise BackendUnavailable(
            f"backend {scheme!r} returned {type(provider).__name__} from sync_from_url, "
            f"which is not a blocking lease provider with open() and close()",
            scheme=scheme,
        )
    blocking = cast("SyncProvider", provider)
    missing = tuple(name for name in wanted if not getattr(blocking.capabilities, name))
    if missing:
        blocking.close()  # sync_from_url does no I/O; this only drops the client
        raise BackendLacksCapability(backend=scheme, missing=missing)
    return blocking


_OPERATIONS = (
    "acquire_lease",
    "get_lease_owner",
    "release_lease",
    "renew_lease",
    "transfer_lease",
)


def wrap(
    provider: LeaseProvider, *, close: bool = False, thread_name: str = "leasekit-sync"
) -> SyncLeaseProvider:
    """A blocking facade over an existing async ``provider``.

    The provider then runs on the facade's loop thread: it must not be bound to another
    event loop (most providers bind on first use, so hand it over unused). The
    facade opens and closes it only with ``close=True``.
    """

    async def build() -> LeaseProvider:
        return provider

    return SyncLeaseProvider(build, owns_provider=close, thread_name=thread_name)
