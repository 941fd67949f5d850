"""leasekit: distributed leases with one owner per key, server clocks and fencing tokens.

The contract is :class:`LeaseProvider`; :func:`connect` opens a backend by URL
(``memory://``, and the backend plugins' schemes); :func:`lease_provider_for` turns
"maybe a provider" into one, falling back to the noop provider. Above the contract:
:func:`hold` (acquire, renew in the background, release), :func:`wait_for`,
:func:`new_owner_id`; the blocking API in :mod:`leasekit.sync`; fencing guards for the
resources a lease protects in :mod:`leasekit.fencing`; event plugins in
:mod:`leasekit.plugins` (hook specs in :mod:`leasekit.hookspecs`, implementations
marked with :data:`hookimpl`); a fake clock and fault injection for tests in
:mod:`leasekit.testing` (the :class:`Clock` protocol is the seam they plug into); what a
backend needs to join ``leasekit bench`` in :mod:`leasekit.bench`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._capabilities import Capabilities, capabilities_of
from ._clock import Clock, RealClock
from ._contract import (
    MAX_METADATA_BYTES,
    MAX_NAME_BYTES,
    MAX_TTL_MS,
    LeaseProvider,
    LeaseResult,
    ManagedLeaseProvider,
    validate_key,
    validate_metadata,
    validate_owner,
    validate_ttl_ms,
)
from ._counting import CountingLeaseProvider, counting
from ._detection import NOOP, NoopLeaseProvider, is_lease_provider, lease_provider_for
from ._errors import (
    BackendLacksCapability,
    BackendUnavailable,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseError,
    LeaseHeld,
    LeasekitWarning,
    LeaseLost,
    LeaseProviderClosed,
    SlotLimitMismatch,
    StaleFencingToken,
)
from ._hold import LeaseHold, hold
from ._lock import Lock, LockError, LockNotOwnedError
from ._memory import MemoryLeaseProvider
from ._owners import new_owner_id
from ._registry import BackendInfo, BackendRegistry
from ._slots import (
    EXCLUSIVE_INTENT_MS,
    MAX_SLOT_LIMIT,
    SLOT_HOLDERS_SHOWN,
    SlotResult,
    validate_limit,
)
from ._waiting import wait_for
from ._watch import elect, leaders, watch_owner
from .backend._fair import FAIR_PLACE_TTL_MS
from .backend._records import LeaseRecord

if TYPE_CHECKING:  # at run time these load lazily, in __getattr__ below
    from . import bench as bench
    from . import fencing as fencing
    from . import hookspecs as hookspecs
    from . import plugins as plugins
    from . import sync as sync
    from . import testing as testing
    from .hookspecs import hookimpl

__all__ = [
    "EXCLUSIVE_INTENT_MS",
    "FAIR_PLACE_TTL_MS",
    "MAX_METADATA_BYTES",
    "MAX_NAME_BYTES",
    "MAX_SLOT_LIMIT",
    "MAX_TTL_MS",
    "NOOP",
    "SLOT_HOLDERS_SHOWN",
    "BackendInfo",
    "BackendLacksCapability",
    "BackendUnavailable",
    "Capabilities",
    "Clock",
    "CountingLeaseProvider",
    "InvalidLeaseArgument",
    "LeaseBackendError",
    "LeaseBackendTimeout",
    "LeaseBackendUnreachable",
    "LeaseError",
    "LeaseHeld",
    "LeaseHold",
    "LeaseLost",
    "LeaseProvider",
    "LeaseProviderClosed",
    "LeaseRecord",
    "LeaseResult",
    "LeasekitWarning",
    "Lock",
    "LockError",
    "LockNotOwnedError",
    "ManagedLeaseProvider",
    "MemoryLeaseProvider",
    "NoopLeaseProvider",
    "RealClock",
    "SlotLimitMismatch",
    "SlotResult",
    "StaleFencingToken",
    "__version__",
    "available_backends",
    "capabilities_of",
    "connect",
    "counting",
    "elect",
    "hold",
    "hookimpl",
    "is_lease_provider",
    "leaders",
    "lease_provider_for",
    "new_owner_id",
    "register",
    "validate_key",
    "validate_limit",
    "validate_metadata",
    "validate_owner",
    "validate_ttl_ms",
    "wait_for",
    "watch_owner",
]

__version__ = "0.1.0.dev0"

_registry = BackendRegistry()


def connect(url: str, *, require: Iterable[str] | str = (), **options: Any) -> ManagedLeaseProvider:
    """Return a provider for ``url``, chosen by its scheme; use it with ``async with``.

    The backend is imported on first use. ``options`` go to the backend's
    ``from_url``. ``require`` names capabilities (``"fencing"``,
    ``"atomic_transfer"``, ...) the backend must have, else
    :class:`BackendLacksCapability`. No I/O happens here: connections open on
    ``async with`` or on the first operation.

    Raises :class:`BackendUnavailable` for an unknown scheme (listing the known ones)
    or a backend whose extra is not installed (naming the ``pip install`` command),
    and :class:`InvalidLeaseArgument` for a malformed URL or option.
    """
    return _registry.connect(url, require=require, **options)


def register(scheme: str, target: str | type) -> None:
    """Serve URL ``scheme`` with ``target`` (``"module:Class"`` or a class) from now on.

    Overrides entry points and built-ins for that scheme. Nothing is imported until
    the scheme is first used.
    """
    _registry.register(scheme, target)


def available_backends(*, check: bool = False) -> list[BackendInfo]:
    """List every known scheme with its distribution, from metadata alone.

    With ``check=True`` each backend is imported to report whether it can load here;
    a broken plugin is reported with a :class:`LeasekitWarning` and listed as not
    loadable, and never affects other schemes.
    """
    return _registry.available(check=check)


# Loaded on first access, so that ``import leasekit`` never imports pluggy: only code
# that uses plugins (or the blocking API, the fencing guards, the test helpers) pays
# for them.
_LAZY_MODULES = frozenset({"bench", "fencing", "hookspecs", "plugins", "sync", "testing"})


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "hookimpl":
        return importlib.import_module(f"{__name__}.hookspecs").hookimpl
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public API and the module's own attributes: not the names this module only
    # imports for its own use (Any, Iterable, TYPE_CHECKING, importlib, annotations).
    dunders = {name for name in globals() if name.startswith("__")}
    return sorted({*__all__, *_LAZY_MODULES, "backend", *dunders})
