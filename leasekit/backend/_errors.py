"""Error mapping at the driver boundary: one table per backend, no hand-written chains."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterator, Mapping

from .._errors import LeaseBackendError, LeaseBackendTimeout, LeaseBackendUnreachable

__all__ = ["ErrorMap", "map_errors"]

ErrorTable = Mapping[type[BaseException], type[LeaseBackendError]]

# What every backend gets without asking: the standard library's own network failures.
# A backend's table comes first, so it can classify its driver's subclasses of these.
_STANDARD: dict[type[BaseException], type[LeaseBackendError]] = {
    TimeoutError: LeaseBackendTimeout,  # also asyncio.TimeoutError (an alias since 3.11)
    asyncio.TimeoutError: LeaseBackendTimeout,
    ConnectionRefusedError: LeaseBackendUnreachable,
    socket.gaierror: LeaseBackendUnreachable,
    ssl.SSLError: LeaseBackendUnreachable,
    OSError: LeaseBackendError,
}


class ErrorMap:
    """Turns a driver's exceptions into leasekit's, by the first matching class.

    ``table`` maps driver exception classes to :class:`~leasekit.LeaseBackendError` or
    one of its subclasses (:class:`~leasekit.LeaseBackendTimeout`,
    :class:`~leasekit.LeaseBackendUnreachable`); put a driver's subclasses before
    their bases. The standard library's timeouts, refused connections, DNS and TLS
    failures follow the backend's table. Build one per backend class; the tuple
    :attr:`types` is what an ``except`` clause catches.

    A driver that raises one class for every failure and tells them apart by an
    attribute (gRPC's status code) subclasses this and overrides :meth:`classify`
    (and :meth:`translate`, for the message): :meth:`translate`, :meth:`mapping` and
    :class:`~leasekit.backend.BackendProvider` all classify through it.
    """

    __slots__ = ("_table", "backend", "types")

    def __init__(self, table: ErrorTable, *, backend: str) -> None:
        merged: dict[type[BaseException], type[LeaseBackendError]] = dict(table)
        for driver_error, ours in _STANDARD.items():
            merged.setdefault(driver_error, ours)
        self._table = tuple(merged.items())
        self.backend = backend
        self.types: tuple[type[BaseException], ...] = tuple(merged)

    def classify(self, exc: BaseException) -> type[LeaseBackendError]:
        """The leasekit class for ``exc`` (:class:`LeaseBackendError` if nothing matches)."""
        for driver_error, ours in self._table:
            if isinstance(exc, driver_error):
                return ours
        return LeaseBackendError

    def translate(
        self, exc: BaseException, *, key: str | None = None, where: str = ""
    ) -> LeaseBackendError:
        """The leasekit error for ``exc``: its class name and first line, then ``where``.

        Raise it ``from exc`` so the driver's exception stays chained as the cause.
        ``where`` (such as ``" (server 10.0.0.1:6379)"``) must hold no secret.
        """
        lines = str(exc).strip().splitlines()
        detail = f": {lines[0]}" if lines else ""
        return self.classify(exc)(
            f"{type(exc).__name__}{detail}{where}", backend=self.backend, key=key
        )

    @contextlib.contextmanager
    def mapping(self, *, key: str | None = None, where: str = "") -> Iterator[None]:
        """A ``with`` block whose driver errors leave it as leasekit's."""
        try:
            yield
        except self.types as exc:
            raise self.translate(exc, key=key, where=where) from exc


@contextlib.contextmanager
def map_errors(
    table: ErrorTable, *, backend: str, key: str | None = None, where: str = ""
) -> Iterator[None]:
    """Translate driver errors raised in the ``with`` block, httpcore-style.

    ``with map_errors({redis.ConnectionError: LeaseBackendUnreachable}, backend="redis"):``
    For a hot path, build an :class:`ErrorMap` once and use :meth:`ErrorMap.mapping`
    (or let :class:`~leasekit.backend.BackendProvider` do it for every call).
    """
    with ErrorMap(table, backend=backend).mapping(key=key, where=where):
        yield
