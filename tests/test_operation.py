"""The toolkit's operation drivers: one generator, run by the asyncio and the blocking driver."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import pytest

from leasekit.backend import Operation, drive, drive_async


class Missing(Exception):
    pass


def read_version(log: list[str]) -> Operation[str, int | None]:
    """Asks twice; a Missing error on the first request means "no version"."""
    try:
        first = yield "version"
    except Missing:
        log.append("handled")
        return None
    second = yield f"double {first}"
    log.append("done")
    return int(second)


def blocking_store(fail: bool) -> Any:
    def exchange(request: str) -> Any:
        if fail:
            raise Missing(request)
        return 21 if request == "version" else 2 * int(request.split()[1])

    return exchange


def async_store(fail: bool) -> Any:
    exchange = blocking_store(fail)

    async def aexchange(request: str) -> Any:
        await asyncio.sleep(0)
        return exchange(request)

    return aexchange


def test_both_drivers_send_each_reply_back_and_return_the_result() -> None:
    log: list[str] = []
    assert drive(read_version(log), blocking_store(fail=False)) == 42
    assert asyncio.run(drive_async(read_version(log), async_store(fail=False))) == 42
    assert log == ["done", "done"]


def test_an_error_is_thrown_into_the_operation_which_may_handle_it() -> None:
    log: list[str] = []
    assert drive(read_version(log), blocking_store(fail=True)) is None
    assert asyncio.run(drive_async(read_version(log), async_store(fail=True))) is None
    assert log == ["handled", "handled"]


def test_an_error_outside_throws_propagates_and_closes_the_operation() -> None:
    closed: list[bool] = []

    def op() -> Generator[str, Any, None]:
        try:
            yield "x"
        finally:
            closed.append(True)

    with pytest.raises(Missing):
        drive(op(), blocking_store(fail=True), throws=KeyError)
    with pytest.raises(Missing):
        asyncio.run(drive_async(op(), async_store(fail=True), throws=KeyError))
    assert closed == [True, True]


def test_a_cancelled_async_drive_closes_the_operation_without_throwing_into_it() -> None:
    seen: list[str] = []

    def op() -> Generator[str, Any, None]:
        try:
            yield "x"
        except BaseException as exc:
            seen.append(type(exc).__name__)
            raise
        finally:
            seen.append("closed")

    async def main() -> None:
        started = asyncio.Event()

        async def exchange(_: str) -> None:
            started.set()
            await asyncio.Event().wait()

        task = asyncio.ensure_future(drive_async(op(), exchange))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert seen == ["GeneratorExit", "closed"]
