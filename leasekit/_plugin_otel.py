"""The OpenTelemetry metrics plugin (``pip install 'leasekit[otel]'``): counter and histogram."""

from __future__ import annotations

from typing import TYPE_CHECKING

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

    @hookimpl
    def leasekit_acquired(self, backend: str, latency_s: float) -> None:
        self._record("acquire", "acquired", backend, latency_s)

    @hookimpl
    def leasekit_denied(self, backend: str, latency_s: float) -> None:
        self._record("acquire", "denied", backend, latency_s)

    @hookimpl
    def leasekit_renewed(self, backend: str, latency_s: float) -> None:
        self._record("renew", "renewed", backend, latency_s)

    @hookimpl
    def leasekit_lost(self, backend: str, reason: str, latency_s: float | None) -> None:
        # A refusal is the outcome of that operation; hold()'s own verdicts (the TTL ran
        # out on its clock, or its renewer failed) count as renewals that expired.
        operation = _LOST_OPERATION.get(reason, "renew")
        outcome = "lost" if reason in _LOST_OPERATION else "expired"
        self._record(operation, outcome, backend, latency_s)

    @hookimpl
    def leasekit_released(self, backend: str, latency_s: float) -> None:
        self._record("release", "released", backend, latency_s)

    @hookimpl
    def leasekit_transferred(self, backend: str, latency_s: float) -> None:
        self._record("transfer", "transferred", backend, latency_s)

    @hookimpl
    def leasekit_failed(
        self, operation: str, backend: str, error: BaseException, latency_s: float
    ) -> None:
        self._record(operation, "error", backend, latency_s, type(error).__name__)
