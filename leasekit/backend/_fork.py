"""Process and event-loop boundaries: what a provider does in a forked child or on a new loop.

Prefork servers (gunicorn ``--preload``, Celery's prefork pool, ``multiprocessing`` on
Linux) build clients in the parent and fork. The child inherits the parent's sockets,
its pool's bookkeeping and, worse, copies of locks other threads held at the fork and
of threads that do not exist in it. A child that reads from a socket the parent also
reads from gets the parent's replies (two processes told they hold one key); a child
that waits for a loop thread that is not there waits forever.

One mechanism, for every provider:

- :func:`on_fork_in_child` registers an object, weakly; right after a fork, in the
  child, before anything else runs there, its ``_after_fork_in_child()`` runs. That
  method must not do I/O or wait: it forgets what belongs to the parent (moving it to
  :func:`keep_forever`, so nothing the child does, not even garbage collection, closes
  or writes to the parent's connections) and arranges for the next use to build anew.
  A lock another thread held at the fork is replaced, never waited for.
- :class:`Rebuild` is how a provider builds itself again: the backend's own
  ``from_url`` (or ``sync_from_url``) with the same URL and options, recorded when the
  provider was first built that way. :class:`~leasekit.backend.BackendProvider` and
  :class:`~leasekit.backend.SyncBackendProvider` record it and use it, in a forked child
  and (the async one) on a new event loop once the one it ran on is closed; a
  provider built on a caller's own client cannot be rebuilt and says so
  (:class:`~leasekit.LeaseProviderClosed`).

Nothing here runs per operation: the fork hook costs nothing until a fork, and the
loop check is a comparison the provider makes before each call.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["ForkAware", "Rebuild", "keep_forever", "on_fork_in_child"]


class ForkAware(Protocol):
    """An object that knows what to forget in a forked child."""

    def _after_fork_in_child(self) -> None: ...


_registered: weakref.WeakSet[Any] = weakref.WeakSet()
_registered_lock = threading.Lock()

# What a child inherited from its parent and must never close, flush or write to: kept
# referenced for the child's lifetime (a handful of objects per fork).
_kept: list[object] = []


def on_fork_in_child(obj: ForkAware) -> None:
    """Call ``obj._after_fork_in_child()`` in every child forked while ``obj`` is alive.

    ``obj`` is held weakly. The method runs in the child, in the thread that forked,
    before ``os.fork()`` returns there: it must not block, do I/O, or take a lock that
    another thread of the parent might have held (make a new one instead). An error it
    raises is kept from the child's caller; the object must then refuse to work.
    """
    with _registered_lock:
        _registered.add(obj)


def keep_forever(*objects: object) -> None:
    """Keep ``objects`` referenced for the rest of the process: never collected, never closed.

    For a parent's connections, pools and loops found in a forked child: collecting
    them could run a finalizer that writes to a socket the parent still uses.
    """
    _kept.extend(objects)


def callers_client_in_child(backend: str) -> str:
    """Why a provider on a caller's own client refuses to work in a forked child."""
    return (
        f"{backend}: this provider was built in another process on a client of the "
        "caller's, whose connections belong to that process; build the client and the "
        "provider in this one (after the fork)"
    )


def _reset_in_child() -> None:
    global _registered_lock  # noqa: PLW0603 (another thread may have held it at the fork)
    _registered_lock = threading.Lock()
    for obj in list(_registered):
        # A fork must not fail: an object whose hook failed refuses to work later.
        with contextlib.suppress(Exception):
            obj._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork()
    os.register_at_fork(after_in_child=_reset_in_child)


class Rebuild:
    """How to build a provider again: its backend's factory, the URL and the options.

    Recorded by :class:`~leasekit.backend.BackendProvider` (and the blocking base) when
    a provider comes from the backend's ``from_url`` or ``sync_from_url``; calling it
    builds a new provider the same way (no I/O: those factories do none).
    """

    __slots__ = ("_factory", "_options", "_url")

    def __init__(self, factory: Callable[..., Any], url: str, options: dict[str, Any]) -> None:
        self._factory = factory
        self._url = url
        self._options = dict(options)

    def __call__(self) -> Any:
        return self._factory(self._url, **self._options)

    def __repr__(self) -> str:
        return f"Rebuild({getattr(self._factory, '__qualname__', self._factory)!r})"


def record_rebuild(factory: Any) -> Any:
    """Wrap a ``from_url``-style classmethod so that what it returns can be rebuilt.

    The result gets ``_rebuild``, a :class:`Rebuild` calling the original factory on
    the same class with the same URL and options, unless it already has one (a
    factory that builds through another keeps the innermost).
    """
    function = factory.__func__ if isinstance(factory, classmethod) else factory

    @functools.wraps(function)
    def build(cls: type, url: str, /, **options: Any) -> Any:
        provider = function(cls, url, **options)
        if getattr(provider, "_rebuild", None) is None:
            # An object that takes no attributes is simply not rebuilt.
            with contextlib.suppress(AttributeError):
                provider._rebuild = Rebuild(functools.partial(function, cls), url, options)
        return provider

    build.__leasekit_records_rebuild__ = True  # type: ignore[attr-defined]
    return classmethod(build)


def wrap_factories(cls: type) -> None:
    """Make ``cls``'s own ``from_url`` and ``sync_from_url`` record how to rebuild."""
    for name in ("from_url", "sync_from_url"):
        factory = cls.__dict__.get(name)
        if not isinstance(factory, classmethod):
            continue
        if getattr(factory.__func__, "__leasekit_records_rebuild__", False):
            continue
        setattr(cls, name, record_rebuild(factory))
