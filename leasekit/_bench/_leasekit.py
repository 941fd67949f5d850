"""leasekit itself as a contender: the same on every scheme, async and blocking."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._model import AsyncCycler, BenchTarget, Contender, SyncCycler

if TYPE_CHECKING:
    from .._contract import ManagedLeaseProvider
    from ..sync import SyncLeaseProvider

__all__ = ["LEASEKIT", "LEASEKIT_SYNC"]


# -- leasekit itself: the same contender for every scheme --------------------------------


class _LeasekitCycler:
    def __init__(self, provider: ManagedLeaseProvider, ttl_ms: int) -> None:
        self._provider = provider
        self._acquire = provider.acquire_lease
        self._release = provider.release_lease
        self._ttl_ms = ttl_ms

    async def cycle(self, key: str, owner: str) -> bool:
        result = await self._acquire(key, owner, self._ttl_ms)
        if result.acquired:
            await self._release(key, owner)
        return result.acquired

    async def aclose(self) -> None:
        await self._provider.aclose()


async def _open_leasekit(target: BenchTarget) -> AsyncCycler:
    from .. import connect  # noqa: PLC0415 (the package imports this module's package)

    provider = connect(target.url)
    try:
        # Opens and checks the connection (a PING on Redis): a wrong address or an
        # unreachable server fails here, before anything is measured.
        await provider.__aenter__()
    except BaseException:
        await provider.aclose()
        raise
    return _LeasekitCycler(provider, target.ttl_ms)


LEASEKIT = Contender(
    "leasekit",
    "leasekit",
    "leasekit",
    open_async=_open_leasekit,
    how="leasekit.connect(url): acquire_lease, then release_lease if acquired",
)


class _LeasekitSyncCycler:
    def __init__(self, facade: SyncLeaseProvider, ttl_ms: int) -> None:
        self._facade = facade
        self._acquire = facade.acquire_lease
        self._release = facade.release_lease
        self._ttl_ms = ttl_ms

    def cycle(self, key: str, owner: str) -> bool:
        result = self._acquire(key, owner, self._ttl_ms)
        if result.acquired:
            self._release(key, owner)
        return result.acquired

    def close(self) -> None:
        self._facade.close()


def _open_leasekit_sync(target: BenchTarget) -> SyncCycler:
    from .. import sync  # noqa: PLC0415

    facade = sync.connect(target.url)
    try:
        facade.open()
    except BaseException:
        facade.close()
        raise
    return _LeasekitSyncCycler(facade, target.ttl_ms)


LEASEKIT_SYNC = Contender(
    "leasekit-sync",
    "leasekit.sync",
    "leasekit",
    open_sync=_open_leasekit_sync,
    how="leasekit.sync.connect(url): the backend's blocking provider where it has one, "
    "else a loop thread; acquire_lease, then release_lease if acquired",
)
"""leasekit's blocking API; a scheme lists it among its contenders (Redis does)."""
