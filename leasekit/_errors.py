"""The exception hierarchy: one root, small families, context as attributes.

Backends raise only these (the driver's exception chained with ``raise ... from``),
so callers can write one ``except LeaseError`` around any backend.
"""

from __future__ import annotations

__all__ = [
    "BackendLacksCapability",
    "BackendUnavailable",
    "InvalidLeaseArgument",
    "LeaseBackendError",
    "LeaseError",
    "LeaseHeld",
    "LeaseLost",
    "LeaseProviderClosed",
    "LeasekitWarning",
]


class LeaseError(Exception):
    """Root of every error leasekit raises; catch this to catch them all."""


class InvalidLeaseArgument(LeaseError, ValueError):
    """An argument broke the contract's rules; raised before any I/O, nothing written.

    ``argument`` names the offending parameter (``"key"``, ``"ttl_ms"``, ...) and
    ``rule`` says what it must be. Also a :class:`ValueError`, so code that already
    catches ``ValueError`` around input handling keeps working.
    """

    def __init__(self, argument: str, rule: str, value: object = None) -> None:
        self.argument = argument
        self.rule = rule
        self.value = value
        super().__init__(f"invalid {argument}: {rule}")


class BackendUnavailable(LeaseError):
    """No usable backend for a URL scheme.

    Raised for an unknown scheme (the message lists the known ones), for a backend
    whose optional dependency is missing (the message gives the ``pip install``
    command), for a plugin that failed to import (the cause is chained), and for a
    scheme claimed by two distributions (the message names both).
    """

    def __init__(self, message: str, *, scheme: str | None = None) -> None:
        self.scheme = scheme
        super().__init__(message)


class BackendLacksCapability(LeaseError):
    """``connect(url, require=...)`` asked for a capability the backend does not have.

    ``missing`` holds the names of the capabilities that are absent.
    """

    def __init__(self, backend: str, missing: tuple[str, ...]) -> None:
        self.backend = backend
        self.missing = missing
        super().__init__(f"backend {backend!r} lacks required capabilities: {', '.join(missing)}")


class LeaseBackendError(LeaseError):
    """The store failed: connection lost, refused, timed out, or answered nonsense.

    ``backend`` names the backend (``"redis"``, ``"postgresql"``, ...) and ``key`` the
    lease key when one was involved. The driver's exception is chained as
    ``__cause__``. The outcome of a write that raised this is unknown: the operation
    may or may not have taken effect, exactly as with any remote call.
    """

    def __init__(self, message: str, *, backend: str, key: str | None = None) -> None:
        self.backend = backend
        self.key = key
        super().__init__(f"{backend}: {message}")


class LeaseProviderClosed(LeaseError):
    """An operation was called on a provider after ``aclose()`` (or its ``async with``)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        super().__init__(f"{backend}: the lease provider is closed")


class LeaseLost(LeaseError):
    """A lease held by ``hold()`` was lost (renewal refused, or it must have expired)."""

    def __init__(self, key: str, owner: str) -> None:
        self.key = key
        self.owner = owner
        super().__init__(f"lease on {key!r} held by {owner!r} was lost")


class LeaseHeld(LeaseError):
    """The lease is held by someone else: ``hold()`` or ``wait_for()`` could not take it.

    ``holder`` is the owner that holds ``key`` (route follow-up work to it), or
    ``None`` when the holder's lease expired at the very moment it was asked.
    """

    def __init__(self, key: str, holder: str | None) -> None:
        self.key = key
        self.holder = holder
        super().__init__(f"lease on {key!r} is held by {holder!r}")


class LeasekitWarning(UserWarning):
    """Something works, but not the way the caller probably intended.

    Emitted for a partial provider implementation (falls back to the noop provider),
    for a backend plugin that failed to load while listing backends, for an event
    plugin (entry-point group ``leasekit.plugins``) that failed to load, and for an
    event hook that raised.
    """
