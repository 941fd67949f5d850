"""The harness's handling of gRPC events for closed event loops (tests/conftest.py)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import LATE_GRPC_EVENTS, _late_grpc_event, _on_anyio_test_loop


class PollerCompletionQueue:
    """Stands in for grpc's Cython class of that name: only its repr is looked at."""

    def _handle_events(self) -> None:
        loop = asyncio.new_event_loop()
        loop.close()
        loop.call_soon_threadsafe(print)


def late_event_context() -> dict[str, object]:
    owner = asyncio.new_event_loop()
    try:
        handle = asyncio.Handle(PollerCompletionQueue()._handle_events, (), owner)
        try:
            handle._callback()
        except RuntimeError as exc:
            return {"message": "Exception in callback", "exception": exc, "handle": handle}
    finally:
        owner.close()
    raise AssertionError("a closed loop accepted a callback")


def test_only_the_pollers_closed_loop_report_counts_as_a_late_grpc_event() -> None:
    context = late_event_context()
    assert _late_grpc_event(context)
    assert not _late_grpc_event({**context, "exception": RuntimeError("other")})
    assert not _late_grpc_event({**context, "handle": "<Handle print()>"})
    assert not _late_grpc_event({"message": "no exception"})


@pytest.mark.anyio
async def test_late_grpc_events_are_recorded_on_the_tests_loops_and_reported_elsewhere() -> None:
    assert _on_anyio_test_loop(asyncio.get_running_loop())
    recorded = len(LATE_GRPC_EVENTS)
    asyncio.get_running_loop().call_exception_handler(late_event_context())
    assert len(LATE_GRPC_EVENTS) == recorded + 1
    del LATE_GRPC_EVENTS[recorded:]  # this test's own, not one to list at the end

    reported: list[dict[str, object]] = []
    loop = asyncio.new_event_loop()
    try:
        loop.set_exception_handler(lambda _, context: reported.append(context))
        assert not _on_anyio_test_loop(loop)
        loop.call_exception_handler(late_event_context())
    finally:
        loop.close()
    assert len(reported) == 1
