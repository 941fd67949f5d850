"""Leaving cleanly: grants nobody will use undone in the background, bounded releases.

An acquire cancelled or timed out may have landed: :func:`undo_grant` releases it
(waiting, :mod:`leasekit._waiting`, and holding, :mod:`leasekit._hold`, both need it).
Leaving a hold runs to its end even if cancelled meanwhile: :func:`uninterrupted`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from . import _hooks
from ._clock import Clock
from ._contract import LeaseProvider
from ._errors import LeaseError
from .backend._records import supports
from .backend._undo import SupportsUndoGrant

__all__ = ["timeout_of", "undo_grant", "uninterrupted"]

_log = logging.getLogger("leasekit")

# What bounds leaving a hold (and an undo of ours) on a provider without timeout_s.
_DEFAULT_TIMEOUT_S = 5.0

# Releases of grants nobody learned of, on providers that do not undo them themselves:
# referenced here until done, so the loop does not collect them.
_undoing: set[asyncio.Task[None]] = set()


def undo_grant(provider: LeaseProvider, key: str, owner: str) -> None:
    """Release, in the background, a grant of ``key`` to ``owner`` nobody will use.

    Through the provider's own ``undo_grant`` (:class:`leasekit.backend.SupportsUndoGrant`,
    which every toolkit backend has: exact, and ordered before its next grant of the same
    key and owner); on any other provider, a ``release_lease`` in a task of its own,
    bounded by the provider's ``timeout_s``.
    """
    target: Any = _hooks.unwrap(provider)
    if supports(target, SupportsUndoGrant):
        target.undo_grant(key, owner)
        return
    task = asyncio.get_running_loop().create_task(
        _release_quietly(provider, key, owner, timeout_of(provider))
    )
    _undoing.add(task)
    task.add_done_callback(_undoing.discard)


async def _release_quietly(provider: LeaseProvider, key: str, owner: str, bound_s: float) -> None:
    try:
        await asyncio.wait_for(provider.release_lease(key, owner), bound_s)
    except (LeaseError, asyncio.TimeoutError) as exc:
        _log.warning(
            "releasing a grant of %r to %r nobody learned of failed (%r); it expires after its TTL",
            key,
            owner,
            exc,
        )


def timeout_of(provider: LeaseProvider) -> float:
    """The provider's ``timeout_s`` (what bounds each of its calls), else a default."""
    timeout_s = getattr(_hooks.unwrap(provider), "timeout_s", None)
    if isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool) and timeout_s > 0:
        return float(timeout_s)
    return _DEFAULT_TIMEOUT_S


async def uninterrupted(leaving: asyncio.Task[None], bound_s: float, clock: Clock) -> None:
    """Wait for ``leaving`` even if cancelled meanwhile (then re-raise), at most ``bound_s``.

    The bound runs on the hold's ``clock``: with a fake clock, nothing waits in real time.
    """

    def give_up() -> None:
        if not leaving.done():
            leaving.cancel()  # bounded: what is left of the release is given up
            leaving.add_done_callback(_retrieve)

    bound = clock.call_at(clock.monotonic() + bound_s, give_up)
    cancelled: asyncio.CancelledError | None = None
    try:
        while not leaving.done():
            try:
                await asyncio.wait((leaving,))
            except asyncio.CancelledError as exc:  # noqa: PERF203 (rare: a cancel while leaving)
                cancelled = exc  # delivered once leaving is done
    finally:
        bound.cancel()
    if cancelled is not None:
        if not leaving.cancelled():
            leaving.exception()  # retrieved: the cancellation is what the caller asked for
        raise cancelled
    if not leaving.cancelled():
        leaving.result()


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # a release given up on: the lease expires after its TTL
