"""leasekit's errors as tooz's, at the driver's boundary: one context manager."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import tooz
from tooz import coordination

from .._errors import (
    InvalidLeaseArgument,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseError,
)

__all__ = ["translated"]


@contextmanager
def translated() -> Iterator[None]:
    """Raise a leasekit failure of the store as tooz does, chaining the original.

    An unreachable or silent store is ``ToozConnectionError`` (what tooz's drivers raise
    for a refused connection or a timeout); any other store or provider failure is
    ``ToozError``. Bad arguments stay :class:`~leasekit.InvalidLeaseArgument` (a
    ``ValueError``, as tooz's own ``Lock`` raises for an empty name): they are the
    caller's, and were refused before anything was written. tooz's own errors pass.
    """
    try:
        yield
    except InvalidLeaseArgument:
        raise
    except (LeaseBackendUnreachable, LeaseBackendTimeout) as exc:
        raise coordination.ToozConnectionError(str(exc), cause=exc) from exc
    except LeaseError as exc:
        raise tooz.ToozError(str(exc), cause=exc) from exc
