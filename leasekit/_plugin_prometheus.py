"""The Prometheus metrics plugin (``pip install 'leasekit[prometheus]'``), on the lease events."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._plugin_holdtimes import HoldTimes
from .hookspecs import hookimpl

try:
    from prometheus_client import REGISTRY, Counter, Histogram
except ModuleNotFoundError as exc:  # pragma: no cover (exercised without the extra)
    raise ModuleNotFoundError(
        "the Prometheus plugin needs prometheus_client: pip install 'leasekit[prometheus]'",
        name=exc.name,
    ) from exc

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "HOLD_BUCKETS_S",
    "LAG_BUCKETS_S",
    "WAIT_BUCKETS_S",
    "PrometheusPlugin",
]

WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""Buckets of the wait-time histogram, in seconds."""
HOLD_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14_400)
"""Buckets of the hold-time histogram, in seconds."""
LAG_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""Buckets of the renewal-lag histogram, in seconds."""


class PrometheusPlugin:
    """Lease metrics for Prometheus, in ``registry`` (default: prometheus_client's global one).

    With the default ``namespace="leasekit"``:

    - ``leasekit_acquires_total`` (counter; ``backend``, ``outcome``: ``acquired``,
      ``denied`` or ``error``): every acquire attempt, a retry of a waiting one included.
    - ``leasekit_wait_seconds`` (histogram; ``backend``, ``outcome``: ``acquired`` or
      ``timed_out``): how long each wait for a lease took, from its first attempt to
      the grant or to giving up (``hold()``, ``wait_for()``, ``elect()``, ``Lock``).
    - ``leasekit_hold_seconds`` (histogram; ``backend``, ``end``: ``released``,
      ``transferred`` or ``lost``): how long leases were held, grant to end, as this
      process saw them.
    - ``leasekit_leases_lost_total`` (counter; ``backend``, ``reason``): leases lost,
      by the ``reason`` of the ``leasekit_lost`` event (``renew_refused``,
      ``expired``, ``transfer_refused``, ``transfer_unknown``, ``error``).
    - ``leasekit_renewal_lag_seconds`` (histogram; ``backend``): how late each
      successful renewal of a ``hold()`` landed after it was due.

    Keys and owners are never labels: their cardinality is unbounded.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, namespace: str = "leasekit"
    ) -> None:
        registry = REGISTRY if registry is None else registry
        self.registry = registry
        self.acquires = Counter(
            "acquires",
            "Lease acquire attempts, by outcome",
            ["backend", "outcome"],
            namespace=namespace,
            registry=registry,
        )
        self.wait = Histogram(
            "wait_seconds",
            "Time spent waiting for a lease, first attempt to grant or giving up",
            ["backend", "outcome"],
            namespace=namespace,
            registry=registry,
            buckets=WAIT_BUCKETS_S,
        )
        self.hold = Histogram(
            "hold_seconds",
            "Time leases were held, grant to release, transfer or loss",
            ["backend", "end"],
            namespace=namespace,
            registry=registry,
            buckets=HOLD_BUCKETS_S,
        )
        self.lost = Counter(
            "leases_lost",
            "Leases lost, by reason",
            ["backend", "reason"],
            namespace=namespace,
            registry=registry,
        )
        self.renewal_lag = Histogram(
            "renewal_lag_seconds",
            "How late successful renewals landed after they were due",
            ["backend"],
            namespace=namespace,
            registry=registry,
            buckets=LAG_BUCKETS_S,
        )
        self._holds = HoldTimes()
        self._collectors: tuple[Counter | Histogram, ...] = (
            self.acquires,
            self.wait,
            self.hold,
            self.lost,
            self.renewal_lag,
        )

    def close(self) -> None:
        """Remove the metrics from the registry (:func:`leasekit.plugins.unregister` leaves
        them); idempotent."""
        collectors, self._collectors = self._collectors, ()
        for collector in collectors:
            self.registry.unregister(collector)

    def _ended(self, backend: str, key: str, owner: str, end: str) -> None:
        held_s = self._holds.end(backend, key, owner)
        if held_s is not None:
            self.hold.labels(backend, end).observe(held_s)

    @hookimpl
    def leasekit_acquired(self, key: str, owner: str, backend: str) -> None:
        self.acquires.labels(backend, "acquired").inc()
        self._holds.start(backend, key, owner)

    @hookimpl
    def leasekit_denied(self, backend: str) -> None:
        self.acquires.labels(backend, "denied").inc()

    @hookimpl
    def leasekit_failed(self, operation: str, backend: str) -> None:
        if operation == "acquire":
            self.acquires.labels(backend, "error").inc()

    @hookimpl
    def leasekit_waited(self, backend: str, acquired: bool, wait_s: float) -> None:
        self.wait.labels(backend, "acquired" if acquired else "timed_out").observe(wait_s)

    @hookimpl
    def leasekit_released(self, key: str, owner: str, backend: str) -> None:
        self._ended(backend, key, owner, "released")

    @hookimpl
    def leasekit_transferred(self, key: str, owner: str, to_owner: str, backend: str) -> None:
        self._ended(backend, key, owner, "transferred")
        self._holds.start(backend, key, to_owner)

    @hookimpl
    def leasekit_lost(self, key: str, owner: str, backend: str, reason: str) -> None:
        self.lost.labels(backend, reason).inc()
        self._ended(backend, key, owner, "lost")

    @hookimpl
    def leasekit_renewal_lag(self, backend: str, lag_s: float) -> None:
        self.renewal_lag.labels(backend).observe(lag_s)
