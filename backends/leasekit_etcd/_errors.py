"""gRPC's and aetcd's errors as leasekit's: by gRPC status code, where a class says too little.

Every failed etcd call is one class, ``grpc.aio.AioRpcError``; what went wrong is its
status code. So the table of classes is extended by a :meth:`EtcdErrorMap.classify`
that reads the code:

- ``DEADLINE_EXCEEDED``: :class:`~leasekit.LeaseBackendTimeout` (no answer in time).
- ``UNAVAILABLE`` with no connection made (refused, unresolvable, TLS handshake),
  ``UNAUTHENTICATED``, ``PERMISSION_DENIED``, and a failed ``Authenticate``:
  :class:`~leasekit.LeaseBackendUnreachable`.
- anything else, a connection lost mid-call included (a write's outcome is then
  unknown): :class:`~leasekit.LeaseBackendError`.

The message is the status code and etcd's own first line, never gRPC's multi-line dump.
"""

from __future__ import annotations

from leasekit import LeaseBackendError, LeaseBackendTimeout, LeaseBackendUnreachable
from leasekit.backend import ErrorMap

from . import _rpc
from ._members import describe, failed_to_connect, status

__all__ = ["ERRORS", "EtcdErrorMap"]

_UNREACHABLE_CODES = ("UNAUTHENTICATED", "PERMISSION_DENIED")
# etcd answers a wrong user or password, and a call without one while authentication
# is on, with INVALID_ARGUMENT and these words.
_AUTH_FAILED = ("authentication failed", "user name is empty")


class EtcdErrorMap(ErrorMap):
    """The toolkit's class table, refined by gRPC status code for ``AioRpcError``."""

    __slots__ = ()

    def classify(self, exc: BaseException) -> type[LeaseBackendError]:
        if isinstance(exc, _rpc.AioRpcError):
            code, details = status(exc)
            name = getattr(code, "name", "")
            if name == "DEADLINE_EXCEEDED":
                return LeaseBackendTimeout
            if (
                name in _UNREACHABLE_CODES
                or any(words in details for words in _AUTH_FAILED)
                or failed_to_connect(exc)
            ):
                return LeaseBackendUnreachable
            return LeaseBackendError
        return super().classify(exc)

    def translate(
        self, exc: BaseException, *, key: str | None = None, where: str = ""
    ) -> LeaseBackendError:
        if isinstance(exc, _rpc.AioRpcError):
            detail = describe(exc)
            # ``where`` names the member that failed last and how: this very failure,
            # as a rule, which need not be said twice.
            repeated = f": {detail})"
            if where.endswith(repeated):
                where = f"{where[: -len(repeated)]})"
            return self.classify(exc)(f"{detail}{where}", backend=self.backend, key=key)
        return super().translate(exc, key=key, where=where)


ERRORS = EtcdErrorMap(
    {
        _rpc.AioRpcError: LeaseBackendError,  # refined by status code above
        _rpc.AetcdConnectionTimeout: LeaseBackendTimeout,
        _rpc.AetcdConnectionFailed: LeaseBackendUnreachable,
        _rpc.AetcdUnauthenticated: LeaseBackendUnreachable,
        _rpc.AetcdClientError: LeaseBackendError,
    },
    backend="etcd",
)
