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

Three plugins are built in: :func:`enable_logging` (stdlib :mod:`logging`, structured
``extra=`` fields), :func:`enable_otel` (OpenTelemetry metrics, with the ``otel`` extra
installed) and :func:`enable_prometheus` (Prometheus metrics, with the ``prometheus``
extra installed).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import _plugin_state
from ._plugin_logging import LoggingPlugin
from ._plugin_state import (
    load_entry_points,
    plugin_manager,
    register,
    registered,
    unregister,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from prometheus_client import CollectorRegistry

    from ._plugin_otel import OtelMetricsPlugin
    from ._plugin_prometheus import PrometheusPlugin

__all__ = [
    "AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "LoggingPlugin",
    "OtelMetricsPlugin",
    "PrometheusPlugin",
    "enable_logging",
    "enable_otel",
    "enable_prometheus",
    "load_entry_points",
    "plugin_manager",
    "register",
    "registered",
    "unregister",
]

ENTRY_POINT_GROUP = _plugin_state.ENTRY_POINT_GROUP
"""``"leasekit.plugins"``: the entry-point group plugins are loaded from."""

AUTOLOAD_ENV = _plugin_state.AUTOLOAD_ENV
"""Environment variable that, when set non-empty, stops entry-point plugins loading."""

_logging_plugin: LoggingPlugin | None = None
_otel_plugin: OtelMetricsPlugin | None = None
_prometheus_plugin: PrometheusPlugin | None = None


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
    with _plugin_state.lock:
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

    with _plugin_state.lock:
        if _otel_plugin is not None:
            unregister(_otel_plugin)
        plugin = _otel_plugin = OtelMetricsPlugin(meter_provider)
        register(plugin, name="leasekit-otel")
        return plugin


def enable_prometheus(
    registry: CollectorRegistry | None = None, *, namespace: str = "leasekit"
) -> PrometheusPlugin:
    """Record lease metrics for Prometheus; needs ``pip install 'leasekit[prometheus]'``.

    Acquire outcomes (``leasekit_acquires_total``), wait and hold times
    (``leasekit_wait_seconds``, ``leasekit_hold_seconds``), leases lost by reason
    (``leasekit_leases_lost_total``) and renewal lag (``leasekit_renewal_lag_seconds``),
    registered in ``registry`` (default: prometheus_client's global ``REGISTRY``, which
    ``prometheus_client.start_http_server()`` serves). Labels are ``backend`` and the
    outcome, never keys or owners. Calling it again replaces the plugin and its metrics.
    """
    global _prometheus_plugin  # noqa: PLW0603 (one metrics plugin per process)
    from ._plugin_prometheus import PrometheusPlugin  # noqa: PLC0415 (the extra is optional)

    with _plugin_state.lock:
        old = _prometheus_plugin
        if old is not None:
            unregister(old)
            old.close()
            _prometheus_plugin = None
        plugin = _prometheus_plugin = PrometheusPlugin(registry, namespace=namespace)
        register(plugin, name="leasekit-prometheus")
        return plugin


def __getattr__(name: str) -> Any:
    if name == "OtelMetricsPlugin":  # imports opentelemetry: only when asked for
        from ._plugin_otel import OtelMetricsPlugin  # noqa: PLC0415

        return OtelMetricsPlugin
    if name == "PrometheusPlugin":  # imports prometheus_client: only when asked for
        from ._plugin_prometheus import PrometheusPlugin  # noqa: PLC0415

        return PrometheusPlugin
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
