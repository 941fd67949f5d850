"""The lease events that plugins can observe: one pluggy hook per event.

A plugin is any object (a module, an instance) with functions named like the specs
below and marked with :data:`hookimpl`; it registers with
:func:`leasekit.plugins.register` or through the ``leasekit.plugins`` entry-point
group. An implementation takes only the arguments it needs, by name::

    import leasekit

    class Audit:
        @leasekit.hookimpl
        def leasekit_lost(self, key, owner, reason):
            print(f"{owner} lost {key!r}: {reason}")

    leasekit.plugins.register(Audit())

Events come from two places: the providers that :func:`leasekit.connect` returns
while at least one plugin is registered (one event per operation), and
:func:`leasekit.hold` (its acquire, renewals, release, transfer and loss). Hooks run
inline, on the event loop of the operation, after it completed: keep them fast and
never block. A hook that raises is reported with a :class:`leasekit.LeasekitWarning`
and does not change the operation's outcome.

Common arguments: ``key`` and ``owner`` as passed to the operation; ``backend`` the
URL scheme (``"memory"``, ``"sqlite"``, ...), or the provider's class name for a
provider not made by :func:`leasekit.connect`; ``latency_s`` the operation's
duration in seconds, measured with :func:`time.perf_counter`.
"""

from __future__ import annotations

import pluggy

__all__ = [
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "leasekit_acquired",
    "leasekit_denied",
    "leasekit_failed",
    "leasekit_lost",
    "leasekit_released",
    "leasekit_renewal_lag",
    "leasekit_renewed",
    "leasekit_transferred",
    "leasekit_waited",
]

PROJECT_NAME = "leasekit"
"""The pluggy project name: hook implementations are marked for it."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marks the specifications below; plugins do not need it."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a plugin's hook implementation; also exported as ``leasekit.hookimpl``."""


@hookspec
def leasekit_acquired(
    key: str, owner: str, backend: str, token: int | None, latency_s: float
) -> None:
    """``owner`` holds ``key`` after an acquire (a fresh grant or an idempotent re-acquire).

    ``token`` is the fencing token, ``None`` on a backend without fencing.
    """


@hookspec
def leasekit_denied(
    key: str, owner: str, holder: str | None, backend: str, latency_s: float
) -> None:
    """An acquire by ``owner`` was refused because ``holder`` holds ``key``.

    ``holder`` is ``None`` only when its lease expired at the moment of asking.
    """


@hookspec
def leasekit_renewed(key: str, owner: str, backend: str, latency_s: float) -> None:
    """``owner``'s lease on ``key`` was renewed for another TTL."""


@hookspec
def leasekit_lost(key: str, owner: str, backend: str, reason: str, latency_s: float | None) -> None:
    """``owner`` no longer holds ``key``.

    ``reason`` is ``"renew_refused"`` (a renewal returned ``False``: the lease had
    expired or someone else holds it), ``"transfer_refused"`` (likewise for a
    transfer), or, from :func:`leasekit.hold`, ``"expired"`` (renewals kept failing
    until the hold's deadline, a safety margin before the TTL on the holder's own
    clock), ``"transfer_unknown"`` (a transfer cut off at that deadline, or failed
    with an unknown outcome) or ``"error"`` (the renewal task itself failed
    unexpectedly); ``latency_s`` is then ``None``.
    """


@hookspec
def leasekit_released(key: str, owner: str, backend: str, latency_s: float) -> None:
    """``owner`` released ``key`` (a no-op on the store if it was not the holder)."""


@hookspec
def leasekit_transferred(
    key: str, owner: str, to_owner: str, backend: str, latency_s: float
) -> None:
    """``owner`` handed its live lease on ``key`` to ``to_owner`` (atomically where declared)."""


@hookspec
def leasekit_failed(  # noqa: PLR0917 (pluggy passes hook arguments by name, never by position)
    operation: str,
    key: str,
    owner: str | None,
    backend: str,
    error: BaseException,
    latency_s: float,
) -> None:
    """An operation raised instead of answering; ``error`` is the exception.

    Not emitted for :class:`leasekit.InvalidLeaseArgument`, which is raised before any
    I/O (a caller's bug, not a lease event), nor for cancellation.

    ``operation`` is ``"acquire"``, ``"owner"`` (``get_lease_owner``, whose ``owner``
    is ``None``), ``"release"``, ``"renew"`` or ``"transfer"``. The outcome of a write
    that failed is unknown (see :class:`leasekit.LeaseBackendError`).
    :func:`leasekit.hold` reports every failed renewal here before it retries.
    """


@hookspec
def leasekit_waited(key: str, owner: str, backend: str, acquired: bool, wait_s: float) -> None:
    """A waiting acquire ended: ``owner`` got ``key`` (``acquired``) or gave up waiting.

    Emitted by everything that waits for a key (:func:`leasekit.hold`,
    :func:`leasekit.wait_for`, :func:`leasekit.elect`, :class:`leasekit.Lock`), once
    per wait, an acquire that succeeds at once included; ``wait_s`` is the time from
    the first attempt to the answer that ended the wait (the granted acquire's, or the
    last refusal's), measured with :func:`time.monotonic`. A wait that raised is
    reported by ``leasekit_failed`` instead.
    """


@hookspec
def leasekit_renewal_lag(key: str, owner: str, backend: str, lag_s: float) -> None:
    """A renewal by :func:`leasekit.hold` succeeded ``lag_s`` seconds after it was due.

    Due means ``renew_every_ms`` after the previous successful grant or renewal was
    sent; the lag is the time from then until this renewal's answer came back (never
    negative: a batched renewal sent a little early counts 0). It grows with a slow
    store, retried failures and a busy event loop, and eats into the hold's safety
    margin: a lag near ``ttl_ms - renew_every_ms`` means the lease nearly expired.
    """
