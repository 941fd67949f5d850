"""What the asyncio and the blocking provider base classes share: identity, state, ``repr``.

:class:`~leasekit.backend.BackendProvider` and
:class:`~leasekit.backend.SyncBackendProvider` differ in how they wait (a loop's timer
against a watchdog thread); what a backend declares (its name, capabilities and error
table), how it is built again after ``fork()``, whether it is closed and how it shows
itself are the same, and are here once.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .._capabilities import Capabilities
from ._errors import ErrorMap
from ._fork import Rebuild, on_fork_in_child, wrap_factories

__all__ = ["ProviderBase"]


class ProviderBase:
    """The state and the hooks both provider base classes have."""

    backend: ClassVar[str] = "backend"
    capabilities: Capabilities = Capabilities()
    errors: ClassVar[ErrorMap] = ErrorMap({}, backend="backend")

    #: How to build this provider again (set when the backend's ``from_url`` or
    #: ``sync_from_url`` built it; a backend whose client is only an address may set it
    #: in ``__init__``): used in a forked child (and, async, on a new event loop).
    #: ``None``: built on a caller's own client, which cannot be rebuilt.
    _rebuild: Rebuild | None = None

    _closed_reason: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A provider from_url builds can be built again the same way (after a fork).
        wrap_factories(cls)

    def __init__(self, *, timeout_s: float, owns_client: bool) -> None:
        self.timeout_s = timeout_s
        self._owns_client = owns_client
        self._closing = False
        on_fork_in_child(self)

    # -- what subclasses override ---------------------------------------------------------

    def _describe(self) -> str:
        """What ``repr`` shows inside the parentheses; never a password."""
        return ""

    def _where(self) -> str:
        """Appended to error messages, such as ``" (server host:6379)"``; never a secret."""
        return ""

    def _after_fork_in_child(self) -> None:
        """In a forked child, before ``fork()`` returns there (each base says what it does)."""

    # -- state ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once closing has begun: every new operation raises."""
        return self._closing

    def __repr__(self) -> str:
        parts = [self._describe()] + (["closed"] if self._closing else [])
        return f"{type(self).__name__}({', '.join(part for part in parts if part)})"
