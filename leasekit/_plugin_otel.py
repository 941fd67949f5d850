"""The OpenTelemetry metrics plugin (``pip install 'leasekit[otel]'``): counter and histogram."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._plugin_holdtimes import HoldTimes
from .hookspecs import hookimpl

try:
    from opentelemetry import metrics
except ModuleNotFoundError as exc:  # pragma: no cover (exercised without the extra)
    raise ModuleNotFoundError(
        "the OpenTelemetry plugin needs opentelemetry-api: pip install 'leasekit[otel]'",
        name=exc.name,
    ) from exc

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.util.types import AttributeValue

__all__ = ["OtelMetricsPlugin"]

# Which operation each refusal reason belongs to, for leasekit_lost.
_LOST_OPERATION = {"renew_refused": "renew", "transfer_refused": "transfer"}


class OtelMetricsPlugin:
    """Counts lease operations by outcome and records their latency.

    Instruments, from the meter ``"leasekit"``:

    - ``lease.operations`` (counter, ``{operation}``): one per completed operation,
      with attributes ``lease.operation`` (``acquire``, ``renew``, ``release``,
      ``transfer``, ``owner``), ``lease.outcome`` (``acquired``, ``denied``,
      ``renewed``, ``lost``, ``released``, ``transferred``, ``error``, and ``expired``
      for a :func:`leasekit.hold` lease given up by its own clock) and
      ``lease.backend``; failures add ``error.type``, the exception's class name.
    - ``lease.operation.duration`` (histogram, seconds): the latency of the same
      operations, with the same attributes.
    - ``lease.wait.duration`` (histogram, seconds; ``lease.backend``, ``lease.outcome``
      ``acquired`` or ``timed_out``): how long each wait for a lease took.
    - ``lease.hold.duration`` (histogram, seconds; ``lease.backend``, ``lease.end``
      ``released``, ``transferred`` or ``lost``): grant to end, as this process saw it.
    - ``lease.lost`` (counter; ``lease.backend``, ``lease.lost.reason``): leases lost.
    - ``lease.renewal.lag`` (histogram, seconds; ``lease.backend``): how late each
      successful renewal of a :func:`leasekit.hold` landed after it was due.

    Acquire outcomes are ``lease.operations`` with ``lease.operation="acquire"``.

    Keys and owners are deliberately not attributes: they are unbounded.
    """

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        from . import __version__  # noqa: PLC0415 (a cycle at import time otherwise)

        meter = metrics.get_meter("leasekit", __version__, meter_provider=meter_provider)
        self.operations = meter.create_counter(
            "lease.operations",
            unit="{operation}",
            description="Lease operations, by operation, outcome and backend",
        )
        self.duration = meter.create_histogram(
            "lease.operation.duration",
            unit="s",
            description="Duration of lease operations",
        )
        self.wait = meter.create_histogram(
            "lease.wait.duration",
            unit="s",
            description="Time spent waiting for a lease, first attempt to grant or giving up",
        )
        self.hold = meter.create_histogram(
            "lease.hold.duration",
            unit="s",
            description="Time leases were held, grant to release, transfer or loss",
        )
        self.lost = meter.create_counter(
            "lease.lost", unit="{lease}", description="Leases lost, by reason"
        )
        self.renewal_lag = meter.create_histogram(
            "lease.renewal.lag",
            unit="s",
            description="How late successful renewals landed after they were due",
        )
        self._holds = HoldTimes()

    def _record(
        self,
        operation: str,
        outcome: str,
        backend: str,
        latency_s: float | None,
        error_type: str | None = None,
    ) -> None:
        attributes: dict[str, AttributeValue] = {
            "lease.operation": operation,
            "lease.outcome": outcome,
            "lease.backend": backend,
        }
        if error_type is not None:
            attributes["error.type"] = error_type
        self.operations.add(1, attributes)
        if latency_s is not None:
            self.duration.record(latency_s, attributes)

    def _ended(self, backend: str, key: str, owner: str, end: str) -> None:
        held_s = self._holds.end(backend, key, owner)
        if held_s is not None:
            self.hold.record(held_s, {"lease.backend": backend, "lease.end": end})

    @hookimpl
    def leasekit_acquired(self, key: str, owner: str, backend: str, latency_s: float) -> None:
        self._record("acquire", "acquired", backend, latency_s)
        self._holds.start(backend, key, owner)

    @hookimpl
    def leasekit_denied(self, backend: str, latency_s: float) -> None:
        self._record("acquire", "denied", backend, latency_s)

    @hookimpl
    def leasekit_renewed(self, backend: str, latency_s: float) -> None:
        self._record("renew", "renewed", backend, latency_s)

    @hookimpl
    def leasekit_waited(self, backend: str, acquired: bool, wait_s: float) -> None:
        outcome = "acquired" if acquired else "timed_out"
        self.wait.record(wait_s, {"lease.backend": backend, "lease.outcome": outcome})

    @hookimpl
    def leasekit_renewal_lag(self, backend: str, lag_s: float) -> None:
        self.renewal_lag.record(lag_s, {"lease.backend": backend})

    @hookimpl
    def leasekit_lost(
        self, key: str, owner: str, backend: str, reason: str, latency_s: float | None
    ) -> None:
        self.lost.add(1, {"lease.backend": backend, "lease.lost.reason": reason})
        self._ended(backend, key, owner, "lost")
        # A refusal is the outcome of that operation; hold()'s own verdicts (the TTL ran
        # out on its clock, or its renewer failed) count as renewals that expired.
        operation = _LOST_OPERATION.get(reason, "renew")
        outcome = "lost" if reason in _LOST_OPERATION else "expired"
        self._record(operation, outcome, backend, latency_s)

    @hookimpl
    def leasekit_released(self, key: str, owner: str, backend: str, latency_s: float) -> None:
        self._record("release", "released", backend, latency_s)
        self._ended(backend, key, owner, "released")

    @hookimpl
    def leasekit_transferred(
        self, key: str, owner: str, to_owner: str, backend: str, latency_s: float
    ) -> None:
        self._record("transfer", "transferred", backend, latency_s)
        self._ended(backend, key, owner, "transferred")
        self._holds.start(backend, key, to_owner)

    @hookimpl
    def leasekit_failed(
        self, operation: str, backend: str, error: BaseException, latency_s: float
    ) -> None:
        self._record(operation, "error", backend, latency_s, type(error).__name__)
