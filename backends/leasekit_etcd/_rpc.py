"""A narrow typed face over the untyped pieces: grpc's channels and aetcd's messages.

The backend speaks etcd's v3 gRPC API with the protobuf messages and service stubs
that ``aetcd`` ships (``aetcd.rpc``), over channels it opens itself: ``aetcd.Client``
holds one channel to one endpoint, without TLS, and its transaction helpers cannot
express what the lease transactions need (range comparisons, nested transactions,
``LeaseLeases``). Neither grpcio nor aetcd ships type hints, so this module is the one
place that touches them untyped: it builds requests and describes, as protocols, the
fields of the responses the backend reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
from aetcd import exceptions as _aetcd_errors  # type: ignore[import-untyped]
from aetcd import rpc as _pb

__all__ = [
    "AetcdClientError",
    "AetcdConnectionFailed",
    "AetcdConnectionTimeout",
    "AetcdUnauthenticated",
    "AioRpcError",
    "Channel",
    "ChannelState",
    "DeleteRangeResponse",
    "KeyValue",
    "LeaseGrantResponse",
    "LeaseKeepAliveResponse",
    "LeaseLeasesResponse",
    "LeaseTimeToLiveResponse",
    "PutResponse",
    "RangeResponse",
    "Request",
    "ResponseHeader",
    "RpcError",
    "StatusCode",
    "TxnResponse",
    "blocking_insecure_channel",
    "blocking_secure_channel",
    "compare_create",
    "compare_created_after",
    "compare_exists",
    "compare_mod",
    "compare_value",
    "delete_op",
    "insecure_channel",
    "put_op",
    "range_op",
    "release_watcher",
    "secure_channel",
    "ssl_credentials",
    "txn_request",
    "unary",
]

Request: TypeAlias = Any
"""A protobuf request message (``TxnRequest``, ``RequestOp``, ...); opaque to callers."""

Channel: TypeAlias = Any
"""A ``grpc.aio.Channel``."""

# Every failed call: grpc.aio's AioRpcError and the blocking channel's errors alike.
RpcError: type[Exception] = grpc.RpcError
AioRpcError: type[Exception] = grpc.aio.AioRpcError
# What a caller's own aetcd.Client raises (its connect): aetcd wraps gRPC's errors.
AetcdClientError: type[Exception] = _aetcd_errors.ClientError
AetcdConnectionFailed: type[Exception] = _aetcd_errors.ConnectionFailedError
AetcdConnectionTimeout: type[Exception] = _aetcd_errors.ConnectionTimeoutError
AetcdUnauthenticated: type[Exception] = _aetcd_errors.UnauthenticatedError
StatusCode: Any = grpc.StatusCode
ChannelState: Any = grpc.ChannelConnectivity


class KeyValue(Protocol):
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


class ResponseHeader(Protocol):
    revision: int
    member_id: int
    raft_term: int


class RangeResponse(Protocol):
    header: ResponseHeader
    kvs: Sequence[KeyValue]
    count: int
    more: bool


class PutResponse(Protocol):
    header: ResponseHeader
    prev_kv: KeyValue

    def HasField(self, name: str) -> bool: ...  # noqa: N802 (protobuf's name)


class DeleteRangeResponse(Protocol):
    header: ResponseHeader
    deleted: int
    prev_kvs: Sequence[KeyValue]


class ResponseOp(Protocol):
    response_range: RangeResponse
    response_put: PutResponse
    response_delete_range: DeleteRangeResponse

    def WhichOneof(self, name: str) -> str | None: ...  # noqa: N802 (protobuf's name)


class TxnResponse(Protocol):
    header: ResponseHeader
    succeeded: bool
    responses: Sequence[ResponseOp]


class LeaseGrantResponse(Protocol):
    header: ResponseHeader
    ID: int
    TTL: int
    error: str


class LeaseKeepAliveResponse(Protocol):
    ID: int
    TTL: int


class LeaseTimeToLiveResponse(Protocol):
    ID: int
    TTL: int
    grantedTTL: int  # noqa: N815 (protobuf's name)


class _LeaseStatus(Protocol):
    ID: int


class LeaseLeasesResponse(Protocol):
    leases: Sequence[_LeaseStatus]


# -- requests -------------------------------------------------------------------------------


def compare_value(key: bytes, value: bytes) -> Request:
    """True when ``key`` exists with exactly ``value`` (false for a missing key)."""
    return _pb.Compare(key=key, target=_pb.Compare.VALUE, result=_pb.Compare.EQUAL, value=value)


def compare_create(key: bytes, end: bytes, create_revision: int) -> Request:
    """True when every key in ``[key, end)`` has this ``create_revision``.

    With 0 it means "no key in the range exists": etcd compares an empty range
    against an empty record, whose ``create_revision`` is 0.
    """
    return _pb.Compare(
        key=key,
        range_end=end,
        target=_pb.Compare.CREATE,
        result=_pb.Compare.EQUAL,
        create_revision=create_revision,
    )


def compare_created_after(key: bytes, end: bytes, revision: int) -> Request:
    """True when every key in ``[key, end)`` was created after ``revision``.

    An empty range is false: etcd compares it as one record of ``create_revision`` 0.
    """
    return _pb.Compare(
        key=key,
        range_end=end,
        target=_pb.Compare.CREATE,
        result=_pb.Compare.GREATER,
        create_revision=revision,
    )


def compare_exists(key: bytes) -> Request:
    """True when ``key`` exists, whatever its value (its ``create_revision`` is set)."""
    return _pb.Compare(
        key=key, target=_pb.Compare.CREATE, result=_pb.Compare.GREATER, create_revision=0
    )


def compare_mod(key: bytes, mod_revision: int) -> Request:
    """True when ``key`` was last written at ``mod_revision`` (0: ``key`` does not exist)."""
    return _pb.Compare(
        key=key, target=_pb.Compare.MOD, result=_pb.Compare.EQUAL, mod_revision=mod_revision
    )


def range_request(
    key: bytes, end: bytes | None = None, *, limit: int = 0, keys_only: bool = False
) -> Request:
    """A linearizable range read, in key order."""
    return _pb.RangeRequest(
        key=key,
        range_end=end or b"",
        limit=limit,
        keys_only=keys_only,
        sort_order=_pb.RangeRequest.ASCEND if end else _pb.RangeRequest.NONE,
        sort_target=_pb.RangeRequest.KEY,
    )


def range_op(key: bytes, end: bytes | None = None, *, limit: int = 0) -> Request:
    return _pb.RequestOp(request_range=range_request(key, end, limit=limit))


def put_op(key: bytes, value: bytes | None, lease: int, *, prev_kv: bool = False) -> Request:
    """Put ``key`` on ``lease``; with ``value`` None, keeping the value it has (which
    fails the whole transaction if ``key`` does not exist: compare first)."""
    if value is None:
        put = _pb.PutRequest(key=key, lease=lease, prev_kv=prev_kv, ignore_value=True)
    else:
        put = _pb.PutRequest(key=key, value=value, lease=lease, prev_kv=prev_kv)
    return _pb.RequestOp(request_put=put)


def delete_op(key: bytes, *, prev_kv: bool = False) -> Request:
    return _pb.RequestOp(request_delete_range=_pb.DeleteRangeRequest(key=key, prev_kv=prev_kv))


def txn_request(
    compare: Sequence[Request], success: Sequence[Request], failure: Sequence[Request]
) -> Request:
    return _pb.TxnRequest(compare=list(compare), success=list(success), failure=list(failure))


def lease_grant_request(ttl_s: int) -> Request:
    return _pb.LeaseGrantRequest(TTL=ttl_s, ID=0)


def lease_revoke_request(lease_id: int) -> Request:
    return _pb.LeaseRevokeRequest(ID=lease_id)


def lease_keep_alive_request(lease_id: int) -> Request:
    return _pb.LeaseKeepAliveRequest(ID=lease_id)


def lease_time_to_live_request(lease_id: int) -> Request:
    return _pb.LeaseTimeToLiveRequest(ID=lease_id, keys=False)


def lease_leases_request() -> Request:
    return _pb.LeaseLeasesRequest()


def authenticate_request(name: str, password: str) -> Request:
    return _pb.AuthenticateRequest(name=name, password=password)


# -- channels and stubs -------------------------------------------------------------------


def insecure_channel(target: str, options: Sequence[tuple[str, Any]]) -> Channel:
    return grpc.aio.insecure_channel(target, options=list(options))


def ssl_credentials(
    root_certificates: bytes | None, private_key: bytes | None, certificate_chain: bytes | None
) -> Any:
    return grpc.ssl_channel_credentials(
        root_certificates=root_certificates,
        private_key=private_key,
        certificate_chain=certificate_chain,
    )


def secure_channel(target: str, credentials: Any, options: Sequence[tuple[str, Any]]) -> Channel:
    return grpc.aio.secure_channel(target, credentials, options=list(options))


def blocking_insecure_channel(target: str, options: Sequence[tuple[str, Any]]) -> Channel:
    """A blocking ``grpc.Channel``: the same stubs work on it, each call blocking."""
    return grpc.insecure_channel(target, options=list(options))


def blocking_secure_channel(
    target: str, credentials: Any, options: Sequence[tuple[str, Any]]
) -> Channel:
    return grpc.secure_channel(target, credentials, options=list(options))


_SERVICE_OF = {
    "Range": "kv",
    "Txn": "kv",
    "LeaseGrant": "lease",
    "LeaseRevoke": "lease",
    "LeaseTimeToLive": "lease",
    "LeaseLeases": "lease",
}


def unary(stubs: Stubs, method: str, request: Request, metadata: Any, timeout_s: float) -> Any:
    """Start the unary call ``method`` (``Range``, ``LeaseGrant``...): an awaitable on a
    grpc.aio channel's stubs, the reply itself on a blocking one's."""
    service = getattr(stubs, _SERVICE_OF[method])
    return getattr(service, method)(request, timeout=timeout_s, metadata=metadata)


class Stubs:
    """The etcd services the backend calls, bound to one channel (asyncio or blocking)."""

    def __init__(self, channel: Channel) -> None:
        self.kv: Any = _pb.KVStub(channel)
        self.lease: Any = _pb.LeaseStub(channel)
        self.auth: Any = _pb.AuthStub(channel)
        self.watch: Any = _pb.WatchStub(channel)


def release_watcher(stubs: Stubs, metadata: Any) -> Any:
    """An ``aetcd.watcher.Watcher``: every watch of one channel on one gRPC stream."""
    from aetcd import watcher  # noqa: PLC0415 (the watch machinery loads on first wait)

    return watcher.Watcher(stubs.watch, metadata=metadata)
