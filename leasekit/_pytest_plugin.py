"""pytest fixtures for code that uses leases, registered through the ``pytest11`` entry point.

``lease_clock`` is a fresh :class:`leasekit.testing.FakeClock`; ``fake_leases`` a
:class:`leasekit.testing.FaultyProvider` over a private memory store on that clock.
Neither needs an event loop to be made, so they work with any async test plugin.
"""

from __future__ import annotations

import pytest

from .testing import FakeClock, FaultyProvider, memory_provider

__all__ = ["fake_leases", "lease_clock"]


@pytest.fixture
def lease_clock() -> FakeClock:
    """A :class:`leasekit.testing.FakeClock` at 0.0 that moves only on ``advance(ms)``."""
    return FakeClock()


@pytest.fixture
def fake_leases(lease_clock: FakeClock) -> FaultyProvider:
    """A fault-injecting provider over a private memory store expiring on ``lease_clock``."""
    return FaultyProvider(memory_provider(lease_clock), clock=lease_clock)
