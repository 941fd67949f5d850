"""An operation, written once, and the two drivers that run it: asyncio and blocking.

An operation is a sans-I/O generator. It yields a request (a statement and its
parameters, a script call, a transaction: whatever the backend's transport sends), is
sent the reply, and returns its result; it never touches a connection. An error the
transport raises is thrown into the generator at the ``yield`` that asked for it, so
the operation may handle it (a missing table while reading a schema version) or let
it propagate. The same generator is then driven by :func:`drive_async` on an asyncio
connection and by :func:`drive` on a blocking one: the statements, the decisions
between them and the reading of replies exist once, and each driver only moves bytes.

.. code-block:: python

    def owner(key: str) -> Operation[Query, str | None]:
        row = yield Query("SELECT owner FROM leases WHERE key = ?", (key,))
        return None if row is None else row[0]

    holder = await drive_async(owner("k"), transport.exchange)  # asyncio
    holder = drive(owner("k"), blocking_transport.exchange)  # threads
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeAlias, TypeVar

__all__ = ["Operation", "drive", "drive_async"]

_Req = TypeVar("_Req")
_T = TypeVar("_T")

Operation: TypeAlias = Generator[_Req, Any, _T]
"""Yields requests, is sent their replies (or thrown their errors), returns the result."""


def drive(
    operation: Operation[_Req, _T],
    exchange: Callable[[_Req], Any],
    *,
    throws: type[BaseException] | tuple[type[BaseException], ...] = Exception,
) -> _T:
    """Run ``operation`` with a blocking ``exchange(request) -> reply``.

    An exception of a type in ``throws`` raised by ``exchange`` is thrown into the
    operation; any other propagates after the operation is closed.
    """
    try:
        request = next(operation)
        while True:
            try:
                reply = exchange(request)
            except throws as exc:  # noqa: PERF203 (thrown into the operation)
                request = operation.throw(exc)
            else:
                request = operation.send(reply)
    except StopIteration as stop:
        result: _T = stop.value
        return result
    finally:
        operation.close()


async def drive_async(
    operation: Operation[_Req, _T],
    exchange: Callable[[_Req], Awaitable[Any]],
    *,
    throws: type[BaseException] | tuple[type[BaseException], ...] = Exception,
) -> _T:
    """Run ``operation`` with an asyncio ``exchange(request) -> reply``; as :func:`drive`.

    A cancellation (``asyncio.CancelledError`` is not an ``Exception``) is never thrown
    into the operation: it closes it and propagates.
    """
    try:
        request = next(operation)
        while True:
            try:
                reply = await exchange(request)
            except throws as exc:  # noqa: PERF203 (thrown into the operation)
                request = operation.throw(exc)
            else:
                request = operation.send(reply)
    except StopIteration as stop:
        result: _T = stop.value
        return result
    finally:
        operation.close()
