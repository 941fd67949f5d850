"""Peer libraries more than one backend measures against: tooz's lock, for now."""

from __future__ import annotations

from typing import Any

from ._model import SyncCycler

__all__ = ["open_tooz"]


class _ToozCycler:
    def __init__(self, coordinator: Any) -> None:
        self._coordinator = coordinator

    def cycle(self, key: str, owner: str) -> bool:
        lock = self._coordinator.get_lock(key.encode())
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    def close(self) -> None:
        self._coordinator.stop()


def open_tooz(url: str, member: bytes) -> SyncCycler:
    """A cycler on tooz's coordinator for ``url`` (tooz's own URL form), as ``member``.

    Each cycle takes tooz's lock on the key without blocking and releases it if taken.
    """
    from tooz import coordination  # noqa: PLC0415 (a peer, imported only when measured)

    coordinator = coordination.get_coordinator(url, member)
    coordinator.start(start_heart=False)
    return _ToozCycler(coordinator)
