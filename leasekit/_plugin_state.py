"""Process-wide plugin state: the plugin manager, its lock, and the hot-path relay.

The one module both :mod:`leasekit._hooks` (which emits events) and
:mod:`leasekit.plugins` (the public registration API) build on, so neither imports the
other. pluggy and the hook specs are imported only once a plugin exists: a program
without plugins never loads them.
"""

from __future__ import annotations

import os
import threading
import types
import warnings
from collections.abc import Iterable
from importlib import metadata
from typing import TYPE_CHECKING, Any

from ._errors import InvalidLeaseArgument, LeasekitWarning

if TYPE_CHECKING:
    import pluggy

__all__ = [
    "AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "load_entry_points",
    "lock",
    "plugin_manager",
    "register",
    "registered",
    "relay",
    "unregister",
]

ENTRY_POINT_GROUP = "leasekit.plugins"
AUTOLOAD_ENV = "LEASEKIT_DISABLE_PLUGIN_AUTOLOAD"

# Guards plugin (un)registration and the one-time entry-point scan. Reentrant: loading
# an entry-point plugin may itself register plugins or connect.
lock = threading.RLock()
_manager: pluggy.PluginManager | None = None
# ``_manager.hook`` while at least one plugin is registered, else None. Hot paths read
# this one global and skip everything else when it is None.
_relay: pluggy.HookRelay | None = None
_autoloaded = False


def relay() -> pluggy.HookRelay | None:
    """The hook relay when any plugin is registered, else None.

    The first call scans the ``leasekit.plugins`` entry points (metadata only; pluggy
    and the plugins are imported only if there are any).
    """
    if not _autoloaded:
        _autoload()
    return _relay


def current_relay() -> pluggy.HookRelay | None:
    """:func:`relay` without the first-call scan, for hot paths once it has run."""
    return _relay if _autoloaded else relay()


def _autoload() -> None:
    global _autoloaded  # noqa: PLW0603 (one process-wide scan, guarded by the lock)
    with lock:
        if _autoloaded:
            return
        _autoloaded = True  # first: a plugin that connects while loading must not recurse
        if os.environ.get(AUTOLOAD_ENV):
            return
        found = metadata.entry_points(group=ENTRY_POINT_GROUP)
        if found:
            load_entry_points(found)


def _refresh() -> None:
    """Recompute the hot-path flag after a plugin was registered or unregistered."""
    global _relay  # noqa: PLW0603 (the hot-path flag is a module global on purpose)
    with lock:
        _relay = _manager.hook if _manager is not None and _manager.get_plugins() else None


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide :class:`pluggy.PluginManager` for project ``"leasekit"``.

    For introspection and pluggy features beyond :func:`register` (tracing hook calls,
    blocking a plugin by name). Register and unregister through this module, so that
    the hot-path check stays in step.
    """
    global _manager  # noqa: PLW0603 (one manager per process, created on first use)
    with lock:
        if _manager is None:
            import pluggy  # noqa: PLC0415 (only once a plugin exists)

            from . import hookspecs  # noqa: PLC0415 (imports pluggy)

            manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
            manager.add_hookspecs(hookspecs)
            _manager = manager
        return _manager


def _known() -> set[str]:
    from . import hookspecs  # noqa: PLC0415 (imports pluggy)

    return {name for name in hookspecs.__all__ if name.startswith("leasekit_")}


def _describe(plugin: object, name: str | None) -> str:
    if name is not None:
        return repr(name)
    if isinstance(plugin, types.ModuleType):
        return f"module {plugin.__name__}"
    kind = type(plugin)
    return f"a {kind.__module__}.{kind.__qualname__} instance"


def _validate(manager: pluggy.PluginManager, plugin: object, label: str) -> None:
    import pluggy  # noqa: PLC0415 (only once a plugin exists)

    # Checked before pluggy sees the plugin: registering an unknown hook name would
    # leave a stray hook caller behind even after unregistering.
    known = _known()
    listed = ", ".join(sorted(known))
    marked = [name for name in dir(plugin) if manager.parse_hookimpl_opts(plugin, name)]
    if not marked:
        raise InvalidLeaseArgument.for_argument(
            "plugin",
            f"{label} implements no leasekit hook; mark its methods with @leasekit.hookimpl "
            f"and name them after a hook ({listed})",
        )
    for name in marked:
        if name not in known:
            raise pluggy.PluginValidationError(
                plugin,
                f"plugin {label} implements unknown hook {name!r}; known hooks: {listed}",
            )


def register(plugin: object, name: str | None = None) -> object:
    """Register ``plugin`` (a module, class instance, or any object with hooks); return it.

    Implementations are checked against the specs now: an unknown hook name or an
    argument no spec offers raises :class:`pluggy.PluginValidationError`, and an
    object with no marked hook raises :class:`leasekit.InvalidLeaseArgument`.
    Registering the same object twice raises :class:`ValueError`.
    """
    relay()  # entry-point plugins load first, exactly once
    with lock:
        manager = plugin_manager()
        _validate(manager, plugin, _describe(plugin, name))
        # pluggy checks each implementation's arguments against its spec; it returns
        # None for a name blocked through the plugin manager, which then stays out.
        manager.register(plugin, name)
        _refresh()
    return plugin


def unregister(plugin: object) -> None:
    """Remove ``plugin``; a plugin that is not registered is ignored."""
    with lock:
        manager = _manager
        if manager is None or not manager.is_registered(plugin):
            return
        manager.unregister(plugin)
        _refresh()


def registered() -> list[object]:
    """The plugins registered now, in no particular order."""
    with lock:
        manager = _manager
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
