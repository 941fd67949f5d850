"""The exception hierarchy: one root, small families, context as attributes.

Backends raise only these (the driver's exception chained with ``raise ... from``),
so callers can write one ``except LeaseError`` around any backend.

Every class follows one convention, as Python's own exceptions do: the message comes
first (and may be omitted where the context makes a good one), context is passed as
keyword arguments and kept as attributes, and every instance survives ``pickle``,
``copy`` and a :class:`concurrent.futures.ProcessPoolExecutor` with its type, message
and attributes intact (:meth:`LeaseError.__reduce__`). Classmethods such as
:meth:`InvalidLeaseArgument.for_argument` build the standard messages.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendLacksCapability",
    "BackendUnavailable",
    "InvalidLeaseArgument",
    "LeaseBackendError",
    "LeaseBackendTimeout",
    "LeaseBackendUnreachable",
    "LeaseError",
    "LeaseHeld",
    "LeaseLost",
    "LeaseProviderClosed",
    "LeasekitWarning",
    "SlotLimitMismatch",
    "StaleFencingToken",
]


def _rebuild(cls: type[LeaseError], args: tuple[Any, ...], state: dict[str, Any]) -> LeaseError:
    """Recreate a pickled error without calling ``__init__`` (which would rebuild the message)."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class LeaseError(Exception):
    """Root of every error leasekit raises; catch this to catch them all.

    Subclasses keep their context as instance attributes; pickling keeps ``args`` (the
    message) and those attributes exactly, without calling ``__init__`` again, so a
    subclass with its own constructor (a third-party backend's) is picklable too.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


class InvalidLeaseArgument(LeaseError, ValueError):
    """An argument broke the contract's rules; raised before any I/O, nothing written.

    ``argument`` names the offending parameter (``"key"``, ``"ttl_ms"``, ...) when
    known, ``rule`` says what it must be, and ``value`` is what was passed. Also a
    :class:`ValueError`, so ``InvalidLeaseArgument("ttl must be positive")`` works as
    any ``ValueError`` does and code that catches ``ValueError`` keeps working.
    """

    def __init__(
        self,
        message: str = "",
        *,
        argument: str | None = None,
        value: object = None,
        rule: str | None = None,
    ) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value
        self.rule = rule

    @classmethod
    def for_argument(cls, argument: str, rule: str, value: object = None) -> InvalidLeaseArgument:
        """The standard error for ``argument``: ``"invalid <argument>: <rule>"``."""
        return cls(f"invalid {argument}: {rule}", argument=argument, value=value, rule=rule)


class BackendUnavailable(LeaseError):
    """No usable backend for a URL scheme.

    Raised for an unknown scheme (the message lists the known ones), for a backend
    whose optional dependency is missing (the message gives the ``pip install``
    command), for a plugin that failed to import (the cause is chained), and for a
    scheme claimed by two distributions (the message names both).
    """

    def __init__(self, message: str = "", *, scheme: str | None = None) -> None:
        super().__init__(message)
        self.scheme = scheme


class BackendLacksCapability(LeaseError):
    """``connect(url, require=...)`` asked for a capability the backend does not have.

    ``backend`` names the backend and ``missing`` holds the names of the capabilities
    that are absent.
    """

    def __init__(
        self, message: str = "", *, backend: str = "", missing: tuple[str, ...] = ()
    ) -> None:
        if not message:
            message = f"backend {backend!r} lacks required capabilities: {', '.join(missing)}"
        super().__init__(message)
        self.backend = backend
        self.missing = tuple(missing)


class LeaseBackendError(LeaseError):
    """The store failed: connection lost, refused, timed out, or answered nonsense.

    ``backend`` names the backend (``"redis"``, ``"postgresql"``, ...) and ``key`` the
    lease key when one was involved; the message starts with the backend's name. The
    driver's exception is chained as ``__cause__``. The outcome of a write that raised
    this is unknown: the operation may or may not have taken effect, exactly as with
    any remote call. Branch on the two subclasses, never on the driver's wording.
    """

    def __init__(self, message: str = "", *, backend: str = "", key: str | None = None) -> None:
        if backend and not message.startswith(f"{backend}: "):
            message = f"{backend}: {message}" if message else f"{backend}: the store failed"
        super().__init__(message)
        self.backend = backend
        self.key = key


class LeaseBackendTimeout(LeaseBackendError):
    """The store gave no answer within the provider's ``timeout_s``.

    The request may have reached the store: a write that raised this may have taken
    effect. Retrying an acquire with the same owner is safe (it is idempotent).
    """


class LeaseBackendUnreachable(LeaseBackendError):
    """The store could not be reached or refused the client: connection refused, DNS,
    TLS or authentication. Nothing was written."""


class LeaseProviderClosed(LeaseError):
    """An operation was called on a provider after ``aclose()`` (or its ``async with``)."""

    def __init__(self, message: str = "", *, backend: str = "") -> None:
        super().__init__(message or f"{backend or 'provider'}: the lease provider is closed")
        self.backend = backend


class LeaseLost(LeaseError):
    """A lease held by ``hold()`` was lost (renewal refused, or it must have expired).

    ``reason`` says how, when known (see :attr:`leasekit.LeaseHold.lost_reason`).
    """

    def __init__(
        self, message: str = "", *, key: str = "", owner: str = "", reason: str | None = None
    ) -> None:
        super().__init__(message or f"lease on {key!r} held by {owner!r} was lost")
        self.key = key
        self.owner = owner
        self.reason = reason


class LeaseHeld(LeaseError):
    """The lease is held by someone else: ``hold()`` or ``wait_for()`` could not take it.

    ``holder`` is the owner that holds ``key`` (route follow-up work to it), or
    ``None`` when the holder's lease expired at the very moment it was asked.
    ``metadata`` is what the holder stored with its grant (its address, say), on
    backends with ``Capabilities.metadata``; ``None`` otherwise.
    """

    def __init__(
        self,
        message: str = "",
        *,
        key: str = "",
        holder: str | None = None,
        metadata: bytes | None = None,
    ) -> None:
        super().__init__(message or f"lease on {key!r} is held by {holder!r}")
        self.key = key
        self.holder = holder
        self.metadata = metadata


class StaleFencingToken(LeaseError):
    """A fencing guard refused a write: a higher token was already recorded for ``resource``.

    ``token`` is the caller's token and ``current`` the highest one the resource has
    seen. The caller's lease was lost (or it is a delayed duplicate); its write must not
    happen.
    """

    def __init__(
        self,
        message: str = "",
        *,
        resource: str = "",
        token: int | None = None,
        current: int | None = None,
    ) -> None:
        super().__init__(
            message
            or f"fencing token {token} for {resource!r} is stale: {current} was already seen"
        )
        self.resource = resource
        self.token = token
        self.current = current


class SlotLimitMismatch(LeaseError, ValueError):
    """A counting lease was asked for with a ``limit`` other than the one its key has.

    The store keeps a key's limit while any of its slots is live; every
    ``acquire_slot`` of the key must give the same one (``stored_limit``). Nothing was
    written. Once every slot is free, the next acquire sets the limit anew.
    """

    def __init__(
        self,
        message: str = "",
        *,
        key: str = "",
        limit: int | None = None,
        stored_limit: int | None = None,
    ) -> None:
        super().__init__(
            message
            or f"{key!r} is a counting lease of limit {stored_limit} while a slot is live; "
            f"asked with limit {limit}"
        )
        self.key = key
        self.limit = limit
        self.stored_limit = stored_limit


class LeasekitWarning(UserWarning):
    """Something works, but not the way the caller probably intended.

    Emitted for a partial provider implementation (falls back to the noop provider),
    for a backend plugin that failed to load while listing backends, for an event
    plugin (entry-point group ``leasekit.plugins``) that failed to load, and for an
    event hook that raised.
    """
