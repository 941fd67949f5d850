"""Undoing a grant whose caller never learned of it: the protocols, and the one context flag.

A cancelled ``acquire_lease`` or ``transfer_lease`` may have landed in the store after
its caller stopped listening: the key is then held, for its whole TTL, by an owner that
never got ``acquired=True`` back. :class:`~leasekit.backend.BackendProvider` undoes such
a grant in the background (see :meth:`~leasekit.backend.BackendProvider.undo_grant`);
a backend supplies at most its atomic piece, :class:`SupportsReleaseGrant`.
"""

from __future__ import annotations

import contextvars
from typing import Protocol

from ._records import _register_extra

__all__ = ["SupportsReleaseGrant", "SupportsUndoGrant"]


class SupportsReleaseGrant(Protocol):
    """A backend that can release one grant, named by its fencing token, atomically.

    Optional. The toolkit uses it to undo a cancelled grant whose reply it did read
    (the call finished in the background): the release then cannot touch any other
    grant, even one made by another process with the same owner. Without it, or
    without a token, the undo is ``release_lease(key, owner)``, which is exact within
    the provider because the provider holds back its own next grant of ``(key,
    owner)`` until the undo is done (owners are unique per holder, so no one else
    makes one).
    """

    async def release_grant(self, key: str, owner: str, token: int) -> None:
        """Release ``key`` if ``owner`` holds it live with fencing token ``token``; else nothing."""
        ...


class SupportsUndoGrant(Protocol):
    """A provider that undoes grants its callers never learned of (every ``BackendProvider``).

    Such a provider undoes a cancelled ``acquire_lease`` or ``transfer_lease`` by
    itself. ``undo_grant`` is for an outcome the caller knows to be unknown, a
    :class:`~leasekit.LeaseBackendTimeout`: :func:`leasekit.hold` calls it then.
    """

    def undo_grant(self, key: str, owner: str) -> None:
        """Release, in the background, the grant of ``key`` to ``owner`` if one landed."""
        ...


_register_extra(SupportsReleaseGrant, "release_grant")
_register_extra(SupportsUndoGrant, "undo_grant")

# Set in the context of an undo's task: the undo's own calls go through while the
# provider is closing (aclose drains undos, and they must still reach the store).
UNDOING: contextvars.ContextVar[bool] = contextvars.ContextVar("leasekit_undoing", default=False)
