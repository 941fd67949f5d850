"""Event plugins: observers of lease events (logging, metrics, tracing, audit).

A plugin implements some of the hooks in :mod:`leasekit.hookspecs`, marked with
:data:`leasekit.hookimpl`. Plugins arrive two ways:

- at run time, with :func:`register` (and leave with :func:`unregister`);
- from the ``leasekit.plugins`` entry-point group of installed distributions, loaded
  the first time leasekit needs to know about plugins (the first ``connect()``,
  ``hold()`` or call into this module). A plugin that fails to load is skipped with a
  :class:`leasekit.LeasekitWarning`; the others load. Set
  ``LEASEKIT_DISABLE_PLUGIN_AUTOLOAD=1`` to load none.

Register plugins before connecting: :func:`leasekit.connect` returns the backend's
own provider, with no per-operation cost at all, when no plugin is registered at that
moment. Providers connected while plugins were registered emit events to whatever is
registered when each operation completes. :func:`leasekit.hold` emits its events
either way.

Two plugins are built in: :func:`enable_logging` (stdlib :mod:`logging`, structured
``extra=`` fields) and :func:`enable_otel` (OpenTelemetry metrics, with the ``otel``
extra installed).
"""

from __future__ import annotations

import logging
import types
import warnings
from collections.abc import Iterable
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy

from . import _hooks, hookspecs
from ._errors import InvalidLeaseArgument, LeasekitWarning
from ._plugin_logging import LoggingPlugin

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

    from ._plugin_otel import OtelMetricsPlugin

__all__ = [
    "AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "LoggingPlugin",
    "OtelMetricsPlugin",
    "enable_logging",
    "enable_otel",
    "load_entry_points",
    "plugin_manager",
    "register",
    "registered",
    "unregister",
]

ENTRY_POINT_GROUP = _hooks.ENTRY_POINT_GROUP
"""``"leasekit.plugins"``: the entry-point group plugins are loaded from."""

AUTOLOAD_ENV = _hooks.AUTOLOAD_ENV
"""Environment variable that, when set non-empty, stops entry-point plugins loading."""

_logging_plugin: LoggingPlugin | None = None
_otel_plugin: OtelMetricsPlugin | None = None


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide :class:`pluggy.PluginManager` for project ``"leasekit"``.

    For introspection and pluggy features beyond :func:`register` (tracing hook calls,
    blocking a plugin by name). Register and unregister through this module, so that
    the hot-path check stays in step.
    """
    with _hooks.lock:
        if _hooks.manager is None:
            manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
            manager.add_hookspecs(hookspecs)
            _hooks.manager = manager
        return _hooks.manager


def _known_hooks() -> str:
    return ", ".join(sorted(name for name in hookspecs.__all__ if name.startswith("leasekit_")))


def _describe(plugin: object, name: str | None) -> str:
    if name is not None:
        return repr(name)
    if isinstance(plugin, types.ModuleType):
        return f"module {plugin.__name__}"
    kind = type(plugin)
    return f"a {kind.__module__}.{kind.__qualname__} instance"


def _validate(manager: pluggy.PluginManager, plugin: object, label: str) -> None:
    # Checked before pluggy sees the plugin: registering an unknown hook name would
    # leave a stray hook caller behind even after unregistering.
    known = {name for name in hookspecs.__all__ if name.startswith("leasekit_")}
    marked = [name for name in dir(plugin) if manager.parse_hookimpl_opts(plugin, name)]
    if not marked:
        raise InvalidLeaseArgument.for_argument(
            "plugin",
            f"{label} implements no leasekit hook; mark its methods with @leasekit.hookimpl "
            f"and name them after a hook ({_known_hooks()})",
        )
    for name in marked:
        if name not in known:
            raise pluggy.PluginValidationError(
                plugin,
                f"plugin {label} implements unknown hook {name!r}; known hooks: {_known_hooks()}",
            )


def register(plugin: object, name: str | None = None) -> object:
    """Register ``plugin`` (a module, class instance, or any object with hooks); return it.

    Implementations are checked against the specs now: an unknown hook name or an
    argument no spec offers raises :class:`pluggy.PluginValidationError`, and an
    object with no marked hook raises :class:`leasekit.InvalidLeaseArgument`.
    Registering the same object twice raises :class:`ValueError`.
    """
    _hooks.relay()  # entry-point plugins load first, exactly once
    with _hooks.lock:
        manager = plugin_manager()
        _validate(manager, plugin, _describe(plugin, name))
        # pluggy checks each implementation's arguments against its spec; it returns
        # None for a name blocked through the plugin manager, which then stays out.
        manager.register(plugin, name)
        _hooks.refresh()
    return plugin


def unregister(plugin: object) -> None:
    """Remove ``plugin``; a plugin that is not registered is ignored."""
    with _hooks.lock:
        manager = _hooks.manager
        if manager is None or not manager.is_registered(plugin):
            return
        manager.unregister(plugin)
        _hooks.refresh()


def registered() -> list[object]:
    """The plugins registered now, in no particular order."""
    with _hooks.lock:
        manager = _hooks.manager
        return [] if manager is None else list(manager.get_plugins())


def load_entry_points(entry_points: Iterable[metadata.EntryPoint] | None = None) -> list[str]:
    """Load and register plugins from the ``leasekit.plugins`` entry-point group.

    Done automatically once per process; call it again only after installing plugins
    at run time. Each entry point names a module or an object with hooks (a class is
    instantiated without arguments). One that fails to import, instantiate or
    validate is skipped with a :class:`leasekit.LeasekitWarning` naming it and its
    distribution. Returns the names of the plugins registered.
    """
    if entry_points is None:
        entry_points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    loaded: list[str] = []
    manager = plugin_manager()
    for entry_point in entry_points:
        dist = entry_point.dist.name if entry_point.dist is not None else None
        if manager.has_plugin(entry_point.name) or manager.is_blocked(entry_point.name):
            continue
        try:
            plugin: Any = entry_point.load()
            if isinstance(plugin, type):
                plugin = plugin()
            register(plugin, name=entry_point.name)
        except Exception as exc:  # noqa: BLE001 (one broken plugin must not stop the others)
            warnings.warn(
                f"skipping leasekit plugin {entry_point.name!r} ({entry_point.value}) from "
                f"distribution {dist!r}: {type(exc).__name__}: {exc}",
                LeasekitWarning,
                stacklevel=2,
            )
        else:
            loaded.append(entry_point.name)
    return loaded


def enable_logging(
    level: int = logging.INFO, *, logger: logging.Logger | str = "leasekit"
) -> LoggingPlugin:
    """Log every lease event to ``logger`` (default ``"leasekit"``); idempotent.

    Acquired, denied, released and transferred are logged at ``level``; renewals at
    DEBUG (they are routine and frequent); losses and failures at WARNING. Each record
    carries its fields as ``extra`` attributes (``lease_event``, ``lease_key``,
    ``lease_owner``, ``lease_backend``, ``lease_latency_s``, ...) for structured
    formatters. leasekit adds no handler: configure :mod:`logging` as usual. Calling
    it again reconfigures the one logging plugin; :func:`unregister` it to stop.
    """
    global _logging_plugin  # noqa: PLW0603 (one logging plugin per process)
    with _hooks.lock:
        plugin = _logging_plugin
        if plugin is None:
            plugin = _logging_plugin = LoggingPlugin(logger, level=level)
        else:
            plugin.configure(logger, level=level)
        if not plugin_manager().is_registered(plugin):
            register(plugin, name="leasekit-logging")
        return plugin


def enable_otel(meter_provider: MeterProvider | None = None) -> OtelMetricsPlugin:
    """Record lease operations as OpenTelemetry metrics; needs ``pip install 'leasekit[otel]'``.

    A counter ``lease.operations`` (by ``lease.operation``, ``lease.outcome``,
    ``lease.backend``, and ``error.type`` for failures) and a histogram
    ``lease.operation.duration`` in seconds, from the meter named ``"leasekit"`` of
    ``meter_provider`` (default: the global one). Keys and owners are never
    attributes: their cardinality is unbounded. Calling it again replaces the plugin.
    """
    global _otel_plugin  # noqa: PLW0603 (one metrics plugin per process)
    from ._plugin_otel import OtelMetricsPlugin  # noqa: PLC0415 (the otel extra is optional)

    with _hooks.lock:
        if _otel_plugin is not None:
            unregister(_otel_plugin)
        plugin = _otel_plugin = OtelMetricsPlugin(meter_provider)
        register(plugin, name="leasekit-otel")
        return plugin


def __getattr__(name: str) -> Any:
    if name == "OtelMetricsPlugin":  # imports opentelemetry: only when asked for
        from ._plugin_otel import OtelMetricsPlugin  # noqa: PLC0415

        return OtelMetricsPlugin
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
