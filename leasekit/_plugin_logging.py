"""The built-in logging plugin: every lease event as one stdlib log record."""

from __future__ import annotations

import logging
from typing import Any

from .hookspecs import hookimpl

__all__ = ["LoggingPlugin"]


class LoggingPlugin:
    """Logs lease events to a :class:`logging.Logger`, fields in ``extra=``.

    Enable it with :func:`leasekit.plugins.enable_logging`. A record's message is
    readable on its own (``lease acquired key='k' owner='a' backend=memory ...``) and
    its fields are also attributes of the record, prefixed ``lease_`` so they never
    collide with :class:`logging.LogRecord`'s own: ``lease_event``, ``lease_key``,
    ``lease_owner``, ``lease_backend``, ``lease_latency_s`` and, per event,
    ``lease_token``, ``lease_holder``, ``lease_to_owner``, ``lease_reason``,
    ``lease_operation``, ``lease_error``.
    """

    def __init__(self, logger: logging.Logger | str = "leasekit", *, level: int = logging.INFO):
        self.logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self.level = level

    def configure(self, logger: logging.Logger | str, *, level: int) -> None:
        """Switch to ``logger`` and ``level`` for routine events."""
        self.logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self.level = level

    def _log(self, level: int, event: str, **fields: Any) -> None:
        if not self.logger.isEnabledFor(level):
            return  # the cheap way out: no formatting, no record
        latency_s = fields.get("latency_s")
        parts = [f"lease {event}"]
        for name, value in fields.items():
            if name == "latency_s":
                continue
            if name == "error":
                parts.append(f"error={type(value).__name__}: {value}")
            elif isinstance(value, str) and name != "backend":
                parts.append(f"{name}={value!r}")
            else:
                parts.append(f"{name}={value}")
        if latency_s is not None:
            parts.append(f"latency_ms={latency_s * 1000:.2f}")
        extra = {"lease_event": event, **{f"lease_{name}": v for name, v in fields.items()}}
        # Preformatted: with no args, logging never %-formats the message.
        self.logger.log(level, " ".join(parts), extra=extra)

    @hookimpl
    def leasekit_acquired(
        self, key: str, owner: str, backend: str, token: int | None, latency_s: float
    ) -> None:
        self._log(
            self.level,
            "acquired",
            key=key,
            owner=owner,
            backend=backend,
            token=token,
            latency_s=latency_s,
        )

    @hookimpl
    def leasekit_denied(
        self, key: str, owner: str, holder: str | None, backend: str, latency_s: float
    ) -> None:
        self._log(
            self.level,
            "denied",
            key=key,
            owner=owner,
            holder=holder,
            backend=backend,
            latency_s=latency_s,
        )

    @hookimpl
    def leasekit_renewed(self, key: str, owner: str, backend: str, latency_s: float) -> None:
        self._log(
            logging.DEBUG, "renewed", key=key, owner=owner, backend=backend, latency_s=latency_s
        )

    @hookimpl
    def leasekit_lost(
        self, key: str, owner: str, backend: str, reason: str, latency_s: float | None
    ) -> None:
        self._log(
            logging.WARNING,
            "lost",
            key=key,
            owner=owner,
            backend=backend,
            reason=reason,
            latency_s=latency_s,
        )

    @hookimpl
    def leasekit_released(self, key: str, owner: str, backend: str, latency_s: float) -> None:
        self._log(
            self.level, "released", key=key, owner=owner, backend=backend, latency_s=latency_s
        )

    @hookimpl
    def leasekit_transferred(
        self, key: str, owner: str, to_owner: str, backend: str, latency_s: float
    ) -> None:
        self._log(
            self.level,
            "transferred",
            key=key,
            owner=owner,
            to_owner=to_owner,
            backend=backend,
            latency_s=latency_s,
        )

    @hookimpl
    def leasekit_failed(  # noqa: PLR0917 (pluggy passes hook arguments by name)
        self,
        operation: str,
        key: str,
        owner: str | None,
        backend: str,
        error: BaseException,
        latency_s: float,
    ) -> None:
        self._log(
            logging.WARNING,
            "failed",
            operation=operation,
            key=key,
            owner=owner,
            backend=backend,
            error=error,
            latency_s=latency_s,
        )

    def __repr__(self) -> str:
        return f"LoggingPlugin({self.logger.name!r}, level={logging.getLevelName(self.level)})"
