"""The event loop a facade runs async providers on: one loop, forever, in one daemon thread."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["LoopThread", "stop_abandoned"]


class LoopThread:
    """One event loop running forever in one daemon thread, until stop()."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                # Whatever still runs (a hold's task, a call racing close()) is
                # cancelled and awaited, so its cleanup runs here and not never.
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def stop(self) -> None:
        """Stop the loop and wait for the thread (after its cleanup) to end."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def stop_abandoned(loop: asyncio.AbstractEventLoop) -> None:
    # A facade garbage-collected without close(): let its thread end rather than run
    # an idle loop until the process exits. Its provider is left unclosed.
    if not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)
