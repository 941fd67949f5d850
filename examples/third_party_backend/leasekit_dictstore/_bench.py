"""The floor that ``leasekit bench dictstore://NAME`` measures leasekit against.

Declared in ``pyproject.toml`` under the ``leasekit.bench`` entry-point group, so
``leasekit bench`` finds it by the URL's scheme and imports it only then. It uses
public names only (:mod:`leasekit.bench`), and reads the URL with the backend's own
parser, so an option means the same to the floor as to the provider.

The floor is the store's own acquire and release, called directly under its lock:
what is left once leasekit's validation, deadlines and lifecycle are taken away.
"""

from __future__ import annotations

import time

from leasekit.bench import AsyncCycler, BenchTarget, Contender, SchemeBench

from . import _DictStore, named_store, parse_dictstore_url

__all__ = ["BENCH"]


class _StoreCycler:
    def __init__(self, store: _DictStore, ttl_ms: int) -> None:
        self._store = store
        self._ttl_ms = ttl_ms

    async def cycle(self, key: str, owner: str) -> bool:
        store = self._store
        with store.lock:
            if not store.acquire(time.monotonic(), key, owner, self._ttl_ms).acquired:
                return False
        with store.lock:
            store.release(time.monotonic(), key, owner)
        return True

    async def aclose(self) -> None:
        pass


async def _open_floor(target: BenchTarget) -> AsyncCycler:
    name, _ = parse_dictstore_url(target.url)
    store = _DictStore() if name is None else named_store(name)
    return _StoreCycler(store, target.ttl_ms)


BENCH = SchemeBench(
    contenders=(
        Contender(
            "dictstore-raw",
            "dict store raw",
            "floor",
            open_async=_open_floor,
            how="the store's acquire and release under its lock, no validation or deadline",
        ),
    ),
)
